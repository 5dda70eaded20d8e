"""A fleet as hosts run many mostly idle Python sites: nginx, uWSGI's Emperor, a vassal per site started on demand.

nginx, memcached and each site's olio.toml are fleet_front.py's, as for the conventional
fleet; nginx passes each site's requests by the uwsgi protocol to the site's Unix socket. The
socket is the Emperor's: it binds one per vassal file (`emperor-on-demand-directory`) and
starts nothing, and when a socket gets its first connection it starts that site's vassal
with the socket as its fd 0 (uWSGI's on-demand vassals, socket activation as inetd did it).
The vassal, Debian's uWSGI with its python3 plugin on the conventional stack's virtual
environment (the same CPython build and Olio's pins, conventional.py), imports
`olio.wsgi:app` in its master and forks its processes from it; after `vassal_idle_s`
without a request (`idle` + `die-on-idle`) it exits and the Emperor waits on the socket
again: an idle site holds no process, scale to zero. A site whose app fails to import exits
at once (`need-app`), answering 502 through nginx, and touches no other site. A request
arriving in the milliseconds between a vassal's idle check and its exit can be cut off (a
502); one arriving after waits in the socket's backlog for the next vassal.

The stack's two settings (fleet-up's --vassal-idle and --vassal-processes, in the record's
`stack_options`):

- `vassal_idle_s`, default 60: a site's vassal goes after 60 s without a request. The fleet
  benchmark counts a request as "first after idle" after 60 s without one (its --idle-gap)
  and judges it against its operation's limit, so a vassal kept 60 s never makes a request
  inside a visit a cold start (Olio's think times are 5 s on average), while a site left
  for longer costs nothing; it is also the Sprout single site's keep-alive while young.
- `vassal_processes`, default `auto`: the conventional fleet's rule, the fewest processes
  that meet the site's peak, max(1, ceil(peak users / 345)), at most 2 x cores + 1
  (fleet_conventional.workers_for); or a number for every site.
"""

import json
import os
import signal
import socket
import time
from pathlib import Path

from . import fleet_conventional, fleet_front
from .conventional import WEB_USER
from .procs import DeployError, alive, children, daemon_pid, start_daemon, stop, tail

UWSGI = "/usr/bin/uwsgi"
PYTHON_PLUGIN = Path("/usr/lib/uwsgi/plugins/python3_plugin.so")
DEFAULT_IDLE_S, MAX_IDLE_S = 60, 86400
DEFAULT_PROCESSES, MAX_PROCESSES = "auto", 32
SUN_PATH_MAX = 100  # uWSGI's on-demand bind copies at most 102 bytes of a socket's path


def options(idle=None, processes=None):
    """The stack's settings from fleet-up's flags (strings or None: the default), checked."""
    idle = DEFAULT_IDLE_S if idle is None else idle
    processes = DEFAULT_PROCESSES if processes is None else processes
    try:
        idle_s = int(idle)
    except (TypeError, ValueError):
        idle_s = None
    if idle_s is None or not 1 <= idle_s <= MAX_IDLE_S:
        raise DeployError(f"--vassal-idle {idle!r}: give the seconds without a request after which a site's vassal "
                          f"stops, a whole number from 1 to {MAX_IDLE_S}")
    if str(processes) == "auto":
        return {"vassal_idle_s": idle_s, "vassal_processes": "auto"}
    try:
        count = int(processes)
    except (TypeError, ValueError):
        count = None
    if count is None or not 1 <= count <= MAX_PROCESSES:
        raise DeployError(f"--vassal-processes {processes!r}: give auto (the fewest that meet each site's peak) "
                          f"or a whole number from 1 to {MAX_PROCESSES}")
    return {"vassal_idle_s": idle_s, "vassal_processes": count}


def processes_per_site(sites, cores, stack_options, per_worker=None):
    """{site name: processes of its vassal}, and the users per process `auto` used (or None)."""
    chosen = stack_options["vassal_processes"]
    if chosen != "auto":
        return {s.name: int(chosen) for s in sites}, None
    per_worker = per_worker or fleet_conventional.users_per_worker()
    return {s.name: fleet_conventional.workers_for(s.peak_users, cores, per_worker) for s in sites}, per_worker


def check(state_dir, sites):
    """Refuse a state directory too deep for the vassals' socket paths (before anything starts)."""
    longest = max(sites, key=lambda s: len(s.name))
    path = socket_path_in(Path(state_dir).resolve() / "run", longest)
    if len(str(path).encode()) > SUN_PATH_MAX:
        raise DeployError(f"--dir {state_dir}: the vassals' sockets (such as {path}) would be longer than "
                          f"{SUN_PATH_MAX} bytes, more than a Unix socket's path holds; use a shorter directory")


def socket_path_in(run_dir, site):
    return run_dir / "vassals" / f"{site.name}.socket"


def socket_path(fd, site):
    """The site's socket, bound by the Emperor (emperor-on-demand-directory: <dir>/<vassal>.socket)."""
    return socket_path_in(fd.state.run, site)


def vassal_ini(fd, site, user):
    opts = fd.record["stack_options"]
    idle, n = opts["vassal_idle_s"], fd.plan["workers"][site.name]
    how = (f"the fewest that meet its peak of {site.peak_users:g} users at {fd.plan['users_per_worker']} per process"
           if opts["vassal_processes"] == "auto" else "as fleet-up was told (--vassal-processes)")
    identity = f"uid = {user}\ngid = {WEB_USER}\n" if user else "; not started as root: the vassal runs as the starting user\n"
    return f"""\
; Written by olio_deploy (fleet_ondemand.py) at every fleet-up; edits are lost.
; Olio site {site.name} ({site.host}): started by the Emperor at the first connection to its socket
; {socket_path(fd, site)} (the Emperor's, handed over as fd 0: no `socket` here), gone after {idle} s
; without a request, when the Emperor waits on the socket again.
[uwsgi]
strict = true
plugin = python3
; Debian's python3 in the conventional stack's virtual environment (Olio's pins).
virtualenv = {fd.venv}
pythonpath = {fd.python_dir}
pythonpath = {fd.app_dir}
env = OLIO_CONFIG={fleet_front.site_config_path(fd, site)}
module = olio.wsgi:app
; An app that does not import ends the vassal (a 502 through nginx) instead of serving errors.
need-app = true
single-interpreter = true
master = true
; The app is imported once in the master and its processes forked from it (gunicorn's preload_app);
; {how}.
processes = {n}
idle = {idle}
die-on-idle = true
; A request stuck longer is killed and its process replaced (gunicorn's timeout).
harakiri = 30
buffer-size = 32768
{identity}umask = 007
disable-logging = true
logto = {fd.state.logs}/sites/{site.name}.log
auto-procname = true
procname-prefix-spaced = olio-{site.name}
"""


def start(fd):
    if not os.path.exists(UWSGI) or not PYTHON_PLUGIN.exists():
        raise DeployError("uWSGI and its Python 3 plugin are not installed (scripts/setup.sh installs them: "
                          "apt-get install uwsgi uwsgi-plugin-python3)")
    state = fd.state
    vassals, sockets = state.conf / "vassals", state.run / "vassals"
    for stale in list(sockets.glob("*.socket")) + list(vassals.glob("*.ini")):
        stale.unlink()
    fleet_front.prepare(fd, extra_dirs=[sockets])
    vassals.mkdir(exist_ok=True)
    user = fleet_front.app_user(fd, "uWSGI's vassals")
    for site in fd.sites:
        (vassals / f"{site.name}.ini").write_text(vassal_ini(fd, site, user))
    fleet_front.start_cache(fd)
    start_emperor(fd)
    fleet_front.start_nginx(fd, fleet_front.nginx_conf(fd, lambda site: socket_path(fd, site), "uwsgi", "fleet_ondemand.py"))


def start_emperor(fd):
    """The Emperor: binds every site's socket and waits (no vassal starts before a request)."""
    state = fd.state
    opts = fd.record["stack_options"]
    argv = [UWSGI, "--emperor", str(state.conf / "vassals"), "--emperor-on-demand-directory", str(state.run / "vassals"),
            "--emperor-stats", str(stats_socket(fd)),
            # Look at the vassals every second (not 3): a vassal gone idle gives its socket back within one.
            "--emperor-freq", "1", "--reload-mercy", "20"]
    stats_socket(fd).unlink(missing_ok=True)
    fd.log(f"starting uWSGI's Emperor: {len(fd.sites)} on-demand vassal(s), each gone after {opts['vassal_idle_s']} s idle, "
           f"{sum(fd.plan['workers'].values())} process(es) in all when every site is busy")
    pid = start_daemon(argv, state.logs / "emperor.log", state.run / "emperor.pid", preexec=fd.enter,
                       env=fleet_front.clean_env(), cwd=str(state.dir))
    log = state.logs / "emperor.log"
    _wait(stats_socket(fd).exists, pid, log, f"the Emperor did not open its stats socket {stats_socket(fd)}")
    _wait(lambda: all(socket_path(fd, s).exists() for s in fd.sites), pid, log, "the Emperor did not bind every site's socket")


def stats_socket(fd):
    return fd.state.run / "emperor-stats.sock"


def _wait(ready, pid, log, message, seconds=30):
    deadline = time.monotonic() + seconds
    while not ready():
        if not alive(pid):
            raise DeployError(f"uWSGI's Emperor exited during start-up:\n{tail(log)}")
        if time.monotonic() > deadline:
            raise DeployError(f"{message} within {seconds} s; see {log}")
        time.sleep(0.1)


def emperor_stats(fd, timeout=5):
    """The Emperor's stats (JSON: its vassals, each with its pid, -1 while on demand), or None."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            s.connect(str(stats_socket(fd)))
            chunks = []
            while chunk := s.recv(65536):
                chunks.append(chunk)
        return json.loads(b"".join(chunks))
    except (OSError, ValueError):
        return None


def running_vassals(fd):
    """{site name: its vassal's master pid} of the sites whose vassal runs now (None: the Emperor does not answer)."""
    stats = emperor_stats(fd)
    if stats is None:
        return None
    return {Path(v["id"]).stem: v["pid"] for v in stats.get("vassals", []) if v.get("pid", -1) > 0}


def processes(fd):
    found = fleet_front.processes(fd)
    pid = daemon_pid(fd.state.run / "emperor.pid")
    if pid:
        found["emperor"] = [pid]
        vassals = children(pid)
        if vassals:
            found["vassals"] = vassals
    return found


def expected(fd):
    return ["nginx", "emperor"] + (["memcached"] if fd.cache else [])  # vassals: only while their site is used


def stop_all(fd):
    """nginx, then the Emperor (it stops every vassal first), then memcached; the sockets go."""
    stopped = fleet_front.stop_nginx(fd)
    pid = daemon_pid(fd.state.run / "emperor.pid")
    if pid:
        vassals = len(children(pid))
        stop(pid, signal.SIGTERM, grace=30)
        stopped.append(f"emperor (and {vassals} vassal(s))")
    for stale in list((fd.state.run / "vassals").glob("*.socket")) + [stats_socket(fd)]:
        stale.unlink(missing_ok=True)
    return stopped + fleet_front.stop_cache(fd)


def failure(body):
    return None  # a vassal that fails to start answers 502, which the site's log explains


def log_hint(fd):
    return f"see {fd.state.logs}/emperor.log, {fd.state.logs}/sites/ and {fd.state.logs}/nginx-error.log"


def status(fd):
    running = processes(fd)
    vassals = running_vassals(fd) if "emperor" in running else None
    opts = fd.record.get("stack_options", {})
    return {**fleet_front.status(fd, running),
            "emperor": {"running": "emperor" in running, "log": str(fd.state.logs / "emperor.log"),
                        "vassals_running": None if vassals is None else len(vassals), "sites": len(fd.sites),
                        "vassal_idle_s": opts.get("vassal_idle_s"), "vassal_processes": opts.get("vassal_processes")}}
