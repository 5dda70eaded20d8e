"""Processes of a deployment: background daemons, pid files, liveness, waiting and stopping."""

import grp
import http.client
import os
import pwd
import signal
import socket
import subprocess
import time
from pathlib import Path

from sprout.net import free_port, port_is_free  # noqa: F401 (the deployment's ports)


def service_ports(taken):
    """Free ports for the deployment's PostgreSQL, cache and API, none of them in `taken` (the
    site's own port: a parent that chose it from the same $SPROUT_PORTS range may be handed it
    again here) nor the same twice."""
    ports = []
    while len(ports) < 3:
        port = free_port()
        if port not in ports and port not in taken:
            ports.append(port)
    return dict(zip(("postgres", "cache", "api"), ports))


class DeployError(RuntimeError):
    """Something the operator must fix; the message says what (no traceback is shown)."""


# ---------------------------------------------------------------- users


def demote_to(user):
    """A function for preexec_fn that makes the child `user` (a name or uid); None: stay."""
    if user is None or os.geteuid() != 0:
        return lambda: None
    entry = pwd.getpwnam(user) if isinstance(user, str) else pwd.getpwuid(user)

    def demote():
        os.setgroups(os.getgrouplist(entry.pw_name, entry.pw_gid))
        os.setgid(entry.pw_gid)
        os.setuid(entry.pw_uid)

    return demote


def user_can(user, check):
    """Whether `check()` returns True when run as `user` (in a forked child)."""
    pid = os.fork()
    if pid == 0:
        try:
            demote_to(user)()
            os._exit(0 if check() else 1)
        except BaseException:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 0


def require_traversable(path, user, why):
    """Refuse, naming the directory, when `user` cannot reach `path` (every parent needs x)."""
    path = Path(path).resolve()
    if os.geteuid() != 0 or user_can(user, lambda: os.access(path, os.X_OK)):
        return
    blocked = next((p for p in reversed(path.parents) if not user_can(user, lambda p=p: os.access(p, os.X_OK))), path)
    raise DeployError(
        f"{path}: the {user} user ({why}) cannot enter {blocked} (mode {blocked.stat().st_mode & 0o777:o}); "
        "put the state directory where other users may pass through (e.g. under /var/lib or /srv)")


def group_id(name):
    return grp.getgrnam(name).gr_gid


# ---------------------------------------------------------------- pid files and liveness


def read_pid(path):
    try:
        text = Path(path).read_text().split()
        return int(text[0]) if text else None
    except (OSError, ValueError):
        return None


def _stat_fields(pid):
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return raw[raw.rindex(")") + 2:].split()  # fields from the state (field 3) on


def start_time(pid):
    fields = _stat_fields(pid)
    return int(fields[19]) if fields else None


def alive(pid, started=None):
    """Whether process `pid` runs (a zombie does not), and is the one that started at
    `started` (clock ticks since boot, from /proc/PID/stat) when given."""
    if not pid:
        return False
    fields = _stat_fields(pid)
    if fields is None or fields[0] in ("Z", "X"):
        if fields is not None:
            _reap(pid)
        return False
    return started is None or int(fields[19]) == started


def _reap(pid):
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def children(pid):
    """Direct children of `pid` (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = _stat_fields(entry.name)
            if fields and int(fields[1]) == pid:
                found.append(int(entry.name))
    return found


def descendants(pid):
    """Every process below `pid`, found through parent links (one /proc scan)."""
    parent_of = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = _stat_fields(entry.name)
            if fields:
                parent_of[int(entry.name)] = int(fields[1])
    below, frontier = set(), {pid}
    while frontier:
        frontier = {p for p, parent in parent_of.items() if parent in frontier} - below
        below |= frontier
    return sorted(below)


def cpus_allowed(pid):
    """The Cpus_allowed_list of `pid` (e.g. "0" or "0-1"), or None when it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("Cpus_allowed_list:"):
                return line.split(":", 1)[1].strip()
    except OSError:
        return None
    return None


# ---------------------------------------------------------------- starting and stopping

_CHILDREN = {}  # pid -> Popen of daemons this process started (reaped when stopped)


def start_daemon(argv, log_path, pidfile, preexec=None, env=None, cwd=None):
    """Start a program that stays in the foreground as a background daemon: its own session,
    stdin from /dev/null, stdout and stderr appended to `log_path`, its pid (and start time,
    so a reused pid is never mistaken for it) written to `pidfile`. Returns the pid."""
    with open(log_path, "ab") as log:
        process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True, preexec_fn=preexec, env=env, cwd=cwd)
    _CHILDREN[process.pid] = process
    Path(pidfile).write_text(f"{process.pid} {start_time(process.pid) or 0}\n")
    return process.pid


def daemon_pid(pidfile):
    """The pid of a daemon started by `start_daemon`, if it still runs."""
    try:
        pid, started = (int(x) for x in Path(pidfile).read_text().split()[:2])
    except (OSError, ValueError):
        return None
    return pid if alive(pid, started or None) else None


def run(argv, what, preexec=None, env=None, timeout=300, cwd=None):
    """Run a command to completion; a failure raises DeployError with its output."""
    try:
        out = subprocess.run(argv, capture_output=True, text=True, preexec_fn=preexec, env=env, timeout=timeout, cwd=cwd)
    except FileNotFoundError:
        raise DeployError(f"{what}: {argv[0]} is not installed (scripts/setup.sh installs it)") from None
    except subprocess.TimeoutExpired:
        raise DeployError(f"{what}: {' '.join(map(str, argv))} did not finish within {timeout} s") from None
    if out.returncode:
        raise DeployError(f"{what} failed (exit {out.returncode}):\n{(out.stderr or out.stdout).strip()[-3000:]}")
    return out.stdout


def stop(pid, sig=signal.SIGTERM, grace=30.0):
    """Send `sig`, wait up to `grace` seconds for the process to end, then SIGKILL it.
    Returns True if it had to be killed."""
    if not alive(pid):
        return False
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return False
    if wait_gone(pid, grace):
        _CHILDREN.pop(pid, None)
        return False
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    wait_gone(pid, 10)
    _CHILDREN.pop(pid, None)
    return True


def wait_gone(pid, seconds):
    deadline = time.monotonic() + seconds
    while alive(pid):
        child = _CHILDREN.get(pid)
        if child is not None:
            try:
                child.wait(timeout=0.05)
            except subprocess.TimeoutExpired:
                pass
        else:
            time.sleep(0.05)
        if time.monotonic() > deadline:
            return False
    return True


def tail(path, lines=20):
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def wait_for_port(host, port, seconds, pid=None, log=None, what="the server"):
    """Wait until `host:port` accepts connections; fail early (with the log's tail) if the
    process `pid` dies first."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            with socket.create_connection((host, port), timeout=1):
                return
        except OSError:
            pass
        if pid is not None and not alive(pid):
            raise DeployError(f"{what} exited during start-up:\n{tail(log) if log else ''}")
        if time.monotonic() > deadline:
            raise DeployError(f"{what} did not listen on {host}:{port} within {seconds:.0f} s" + (f"; see {log}" if log else ""))
        time.sleep(0.05)


class UnixHTTPConnection(http.client.HTTPConnection):
    """HTTP over a Unix socket (gunicorn's, behind nginx)."""

    def __init__(self, path, timeout=10):
        super().__init__("localhost", timeout=timeout)
        self.path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(str(self.path))


def http_get(url_or_socket, path="/", timeout=10, headers=None):
    """(status, headers, body) of a GET to http://host:port or to a Unix socket path."""
    if str(url_or_socket).startswith("http://"):
        hostport = str(url_or_socket)[len("http://"):].rstrip("/")
        host, _, port = hostport.rpartition(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    else:
        conn = UnixHTTPConnection(url_or_socket, timeout=timeout)
    try:
        conn.request("GET", path, headers=headers or {})
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        conn.close()
