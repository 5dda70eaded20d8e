"""A malicious package, imported ahead in a Zygote of its own, tries to tamper with the
helper, the install cache, other sandboxes and the host. Its own subtree is its to ruin; the
test shows lambdas that did not ask for it are unaffected and the host is untouched."""

import hashlib
import shutil

import pytest

from conftest import deploy_with, offline, probe, root_zygote_pid
from wheels import make_wheel

EVIL = r'''
import ctypes, json, os, signal, sys

REPORT = {}
MARKER = %(marker)r
libc = ctypes.CDLL(None, use_errno=True)


def attempt(name, fn):
    try:
        REPORT[name] = ["done", repr(fn())]
    except BaseException as e:
        REPORT[name] = ["refused", f"{type(e).__name__}: {e}"]


def append(path):
    with open(path, "a") as f:
        f.write("# tampered\n")


def mount(source, target, fstype, flags):
    if libc.mount(source, target, fstype, flags, None) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno))


def chroot_escape():
    os.makedirs("/host/tmp/evil", exist_ok=True)
    os.chroot("/host/tmp/evil")
    for _ in range(40):
        os.chdir("..")
    os.chroot(".")
    return os.path.exists(MARKER)


def walk_out():
    for _ in range(40):
        os.chdir("..")
    return os.path.exists(MARKER) or os.path.exists(os.getcwd().rstrip("/") + MARKER)


attempt("write the helper", lambda: append("/opt/sprout/helper.py"))
attempt("write a cached package", lambda: append("/packages/beta==1.0/beta/__init__.py"))
attempt("add a file to the cache", lambda: append("/packages/evil-was-here.py"))
attempt("remount the cache writable", lambda: mount(None, b"/packages", None, 0x20 | 0x1000))
attempt("mount over the runtime", lambda: mount(b"none", b"/opt/sprout", b"tmpfs", 0))
attempt("signal every process it can see", lambda: os.kill(-1, signal.SIGKILL))
attempt("escape the root with chroot", chroot_escape)
attempt("walk out of the root", walk_out)
attempt("read a host file", lambda: open(MARKER).read())
def unshare(flags):
    if libc.unshare(flags) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno))


attempt("create a user namespace", lambda: unshare(0x10000000))
attempt("create a mount namespace", lambda: unshare(0x00020000))

# Tamper with the helper in memory (its module that runs requests): every handler forked from
# this Zygote now answers this.
dispatch = sys.modules.get("_sprout_dispatch")
if dispatch is not None and hasattr(dispatch, "invoke_function"):
    reply = json.dumps({"tampered": True, "report": REPORT}).encode()
    dispatch.invoke_function = lambda func, request, body: ({"status": 200, "headers": [["Content-Type", "application/json"]]}, reply)
'''


@pytest.fixture
def evil_wheels(tmp_path, wheel_dir):
    d = tmp_path / "wheels"
    shutil.copytree(wheel_dir, d)
    marker = tmp_path / "host-secret.txt"
    marker.write_text("the host's secret\n")
    marker.chmod(0o644)
    make_wheel(d, "evil", "1.0", {"evil/__init__.py": EVIL % {"marker": str(marker)}})
    d.chmod(0o755)
    return d


def digest(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()



def test_a_malicious_package_cannot_reach_lambdas_that_did_not_import_it(make_worker, evil_wheels):
    w = make_worker(**offline(evil_wheels))
    deploy_with(w, "innocent", probe(["beta"]), "beta==1.0\n")
    before = w.client.run("innocent")
    assert before["preloaded"] == ["beta"]
    root_zygote = root_zygote_pid(w)
    helper = w.dir / "runtime" / "helper.py"
    cached = w.dir / "packages" / "installed" / "beta==1.0" / "beta" / "__init__.py"
    helper_digest, cached_digest = digest(helper), digest(cached)

    deploy_with(w, "evil", "import evil\ndef f(event):\n    return evil.REPORT\n", "evil==1.0\nbeta==1.0\n")
    out = w.client.run("evil")
    # It ran, in a Zygote of its own, and tampered with that Zygote's helper...
    assert out["tampered"] is True, out
    report = out["report"]
    # ...but nothing outside its subtree gave way.
    for name in ("write the helper", "write a cached package", "add a file to the cache",
                 "remount the cache writable", "mount over the runtime", "read a host file",
                 "create a user namespace"):
        assert report[name][0] == "refused", (name, report[name])
    # A mount namespace of its own it may make (it is root in its user namespace), but from
    # its detached root there is nothing in it to reach.
    assert report["escape the root with chroot"] == ["done", "False"], report
    assert report["walk out of the root"] == ["done", "False"], report

    # The innocent lambda's paused sandbox survived, unaffected, as did the root Zygote.
    after = w.client.run("innocent")
    assert after == before and "evil" not in str(after)
    assert root_zygote_pid(w) == root_zygote
    # A new lambda wanting only beta comes from beta's Zygote, not evil's.
    deploy_with(w, "innocent2", probe(["beta"]), "beta==1.0\n")
    assert w.client.run("innocent2")["preloaded"] == ["beta"]
    # The host's files are untouched.
    assert digest(helper) == helper_digest and digest(cached) == cached_digest
    assert not (w.dir / "packages" / "installed" / "evil-was-here.py").exists()
