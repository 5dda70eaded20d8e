"""The file store both deployments share, writable by every user that writes it.

Writable now and in every sub-directory anyone makes later.

Three users touch it: the Sprout sandboxes (uid 65534), gunicorn's workers (www-data where the
interpreter allows it, else root) and nginx's workers (www-data, reading). Ownership alone
cannot serve two writers (a sub-directory made by one is the other's to read only), so the
directory gets POSIX default ACLs naming each of them: everything created below inherits
them. Where the file system has no ACLs, the directory is given to the sandbox user and
www-data's group, setgid, with a warning. gVisor's kernel checks permissions by the mode bits
alone (it reads no ACLs), so for a gVisor deployment (`acls=False`) the whole tree is given
to the sandbox user and www-data's group, group-writable and setgid.
"""

import grp
import os
import shutil
import subprocess
from pathlib import Path

from .procs import DeployError

SANDBOX_UID = 65534  # the Sprout worker's sandbox.uid (its default)


def prepare(path, users, warn=print, acls=True):
    """Make `path` (and its parents) and let every uid/name in `users` read and write it."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(0o755)
    if os.geteuid() != 0:
        return "owner only (not root)"
    if not acls:
        return _own_tree(path)
    entries = sorted({str(u) for u in users})
    if shutil.which("setfacl"):
        spec = ",".join(f"u:{u}:rwX" for u in entries)
        defaults = ",".join(f"d:u:{u}:rwX" for u in entries) + ",d:u::rwX,d:g::rX,d:o::rX,d:m::rwX"
        out = subprocess.run(["setfacl", "-R", "-m", spec, "-m", defaults, str(path)], capture_output=True, text=True)
        if out.returncode == 0:
            return f"ACLs for {', '.join(entries)}"
        warn(f"warning: setfacl on {path} failed ({out.stderr.strip()}); using ownership instead")
    else:
        warn("warning: setfacl is missing (apt-get install acl); the file store falls back to ownership")
    try:
        os.chown(path, SANDBOX_UID, _gid("www-data"))
        path.chmod(0o2775)
    except OSError as e:
        raise DeployError(f"cannot hand {path} to the app's users: {e.strerror}") from None
    return "owner 65534, group www-data, setgid"


def _gid(group):
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        return 0


def _own_tree(path):
    """Everything under `path` to the sandbox user and www-data's group: directories 2775,
    files 664 (what mode bits alone give two writers)."""
    gid = _gid("www-data")
    try:
        for root, _dirs, files in os.walk(path):
            os.chown(root, SANDBOX_UID, gid)
            os.chmod(root, 0o2775)
            for name in files:
                file = os.path.join(root, name)
                os.chown(file, SANDBOX_UID, gid, follow_symlinks=False)
                if not os.path.islink(file):
                    os.chmod(file, 0o664)
    except OSError as e:
        raise DeployError(f"cannot hand {path} to the app's users: {e.strerror}") from None
    return "owner 65534, group www-data, setgid, the whole tree (gVisor reads no ACLs)"
