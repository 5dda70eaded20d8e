"""The conventional deployment: nginx in front of gunicorn running olio.wsgi:app, and memcached.

nginx serves static files and the file store and keeps clients' connections alive; gunicorn
runs on Debian's python3 in a virtual environment holding Olio's pinned requirements (made
once per set of pins, shared by deployments) and listens on a Unix socket; Debian's
memcached runs when caching is on. All are configured by files under STATE/conf and started
inside the confinement."""

import fcntl
import hashlib
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from . import interpreter
from .procs import (
    DeployError,
    UnixHTTPConnection,
    alive,
    children,
    daemon_pid,
    demote_to,
    group_id,
    http_get,
    read_pid,
    run,
    start_daemon,
    stop,
    tail,
    wait_for_port,
)

NGINX = "/usr/sbin/nginx"
MEMCACHED = "/usr/bin/memcached"
WEB_USER = "www-data"  # Debian's user for web servers: nginx's workers, and gunicorn's
# Debian's interpreter: the same build as the sandbox base's (scripts/align-python.sh).
SYSTEM_PYTHON = "/usr/bin/python3"
GUNICORN = "gunicorn==27.0.1"
VENV_ROOT = Path("/var/cache/sprout/olio-venv")


def nginx_conf(dep):
    run_dir, logs = dep.state.run, dep.state.logs
    temp = run_dir / "nginx"
    return f"""\
# Written by olio_deploy (conventional.py) at every `up`; edits are lost.
# Olio's front server: static assets and the file store straight from disk, every other
# request proxied to gunicorn over a Unix socket.

user {WEB_USER};                      # workers drop root; the master keeps it to bind and reload
worker_processes {dep.cores};              # one per core of the deployment (nginx's advice)
worker_rlimit_nofile 16384;
pid {run_dir}/nginx.pid;
error_log {logs}/nginx-error.log warn;

events {{
    worker_connections 4096;        # every Cloudstone user holds a keep-alive connection
}}

http {{
    include /etc/nginx/mime.types;
    default_type application/octet-stream;
    server_tokens off;

    # Buffered: one write per 64 KiB or 5 s, not one per request.
    log_format olio '$remote_addr [$time_local] "$request" $status $body_bytes_sent '
                    '$request_time "$upstream_addr" $upstream_response_time';
    access_log {logs}/nginx-access.log olio buffer=64k flush=5s;

    sendfile on;
    tcp_nopush on;
    tcp_nodelay on;
    keepalive_timeout 65s;          # browsers keep their connection between pages
    keepalive_requests 10000;
    client_max_body_size {dep.max_body_mb}m;        # the register and add-event forms upload an image and a PDF
    client_body_buffer_size 256k;   # most uploads stay in memory
    # No gzip: pages travel over loopback in the benchmark, and the Sprout stack sends them plain.
    open_file_cache max=10000 inactive=60s;   # keep static files' descriptors and stat results
    open_file_cache_valid 30s;

    client_body_temp_path {temp}/client_body;
    proxy_temp_path {temp}/proxy;
    fastcgi_temp_path {temp}/fastcgi;
    uwsgi_temp_path {temp}/uwsgi;
    scgi_temp_path {temp}/scgi;

    upstream gunicorn {{
        server unix:{dep.gunicorn_socket} fail_timeout=0;   # gunicorn's advice: never mark it down
    }}

    server {{
        listen {dep.bind}:{dep.port} default_server backlog=4096;
        server_name _;

        # Last-Modified, and 304 to an If-Modified-Since that matches it, are nginx's defaults
        # for files; expires adds Cache-Control and Expires.
        location /static/ {{
            alias {dep.static_dir}/;
            expires 1h;                 # assets change only with a new deployment
        }}
        location /files/ {{
            alias {dep.files}/;
            expires 7d;                 # uploads are stored under new names, never rewritten
            location ~ /\\. {{ return 404; }}   # never the store's dot-files
        }}
        location / {{
            proxy_pass http://gunicorn;
            proxy_set_header Host $http_host;
            proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
            proxy_set_header X-Forwarded-Proto $scheme;
            proxy_redirect off;
            # Responses are buffered (the default): a sync worker hands its page to nginx and
            # is free again, however slowly the client reads.
        }}
    }}
}}
"""


def gunicorn_conf(dep, user):
    return f"""\
# Written by olio_deploy (conventional.py) at every `up`; edits are lost. Runs olio.wsgi:app.
bind = "unix:{dep.gunicorn_socket}"
# gunicorn's advice, (2 x cores) + 1 sync workers: nginx buffers slow clients, so a worker is
# only ever busy with the app, and while one waits for PostgreSQL another can run. Measured
# on one core against gthread (3 x 4 and 1 x 8 threads), 16 clients: sync served as much or
# more (131-137 against 76-130 requests/s) with the shortest tail (p99 212-260 ms).
workers = {dep.workers}
worker_class = "sync"
# Import the app once in the master and fork the workers from it (as Sprout forks sandboxes
# from a Zygote): less memory, and a dead worker is replaced in milliseconds. The app opens
# its database connections lazily, after the fork.
preload_app = True
timeout = 30             # a worker stuck longer is killed and replaced (Sprout's limits.timeout_ms)
graceful_timeout = 30
backlog = 2048
{_identity_conf(user)}
umask = 0o007
daemon = True
pidfile = "{dep.state.run}/gunicorn.pid"
errorlog = "{dep.state.logs}/gunicorn.log"
capture_output = True    # the app's own prints go to the error log too
accesslog = None         # nginx logs every request
forwarded_allow_ips = "*"   # only nginx can reach the socket
proc_name = "olio-{dep.state.dir.name}"
# gunicorn 25.1+ opens a control socket (for gunicornc); each deployment keeps its own.
control_socket = "{dep.state.run}/gunicorn/control.sock"
# On {dep.venv}/bin/python (Debian's python3 in a virtual environment).
"""


def _identity_conf(user):
    if user is None:
        return "# Not started as root: the workers run as the starting user."
    return (f"# The master keeps root (it binds, writes the pid file and forks); the workers run as {user}\n"
            f"# and the socket is rw for {WEB_USER}'s group only (nginx's workers).\n"
            f'user = "{user}"\ngroup = "{WEB_USER}"')


def _app_env(dep):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "PYENV", "VIRTUAL_ENV"))}
    env["PYTHONPATH"] = dep.pythonpath
    env["OLIO_CONFIG"] = str(dep.state.conf / "olio.toml")
    return env


def gunicorn_user(dep):
    """www-data when it can run the interpreter and import the app, else root (warned)."""
    if os.geteuid() != 0:
        return None
    env = _app_env(dep)
    try:
        out = subprocess.run([str(dep.venv / "bin" / "python"), "-c", "import olio.wsgi"], env=env, capture_output=True,
                             preexec_fn=demote_to(WEB_USER), timeout=120, cwd="/")
        if out.returncode == 0:
            return WEB_USER
        why = out.stderr.decode(errors="replace").strip().splitlines()[-1:] or [f"exit {out.returncode}"]
    except (OSError, subprocess.SubprocessError) as e:
        why = [str(e)]
    dep.log(f"warning: {WEB_USER} cannot import the app with {dep.venv}/bin/python ({why[0]}); "
            "gunicorn runs as root, its workers with group " + WEB_USER)
    return "root"


def venv_requirements(dep):
    """What the virtual environment holds: Olio's pins and gunicorn's."""
    return (dep.app_dir / "requirements.txt").read_text() + f"\n{GUNICORN}\n"


def venv_path(dep, root=VENV_ROOT):
    """VENV_ROOT/<hash of the interpreter build and the requirements>: one per set of pins."""
    build = interpreter.identity(interpreter.sha256_file(os.path.realpath(SYSTEM_PYTHON)), None)  # Debian's: static libpython
    key = hashlib.sha256((build + "\n" + venv_requirements(dep)).encode()).hexdigest()[:16]
    return root / key


def ensure_venv(dep, root=VENV_ROOT):
    """The deployment's virtual environment, made on first use: Debian's python3 -m venv, then
    pip install of the pinned requirements and gunicorn. Complete ones carry a marker; a
    half-made one (an interrupted `up`) is made again. Deployments share it (read-only)."""
    if not os.path.exists(SYSTEM_PYTHON):
        raise DeployError(f"{SYSTEM_PYTHON} is missing (apt-get install python3 python3-venv)")
    venv = venv_path(dep, root)
    marker = venv / ".olio-deploy-complete"
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o755)
    with open(root / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two deployments starting at once make it once
        if marker.exists():
            return venv
        shutil.rmtree(venv, ignore_errors=True)
        dep.log(f"making the virtual environment {venv} ({SYSTEM_PYTHON}, Olio's pins and {GUNICORN}; once per set of pins)")
        made = subprocess.run([SYSTEM_PYTHON, "-m", "venv", str(venv)], capture_output=True, text=True)
        if made.returncode:
            shutil.rmtree(venv, ignore_errors=True)
            raise DeployError(f"{SYSTEM_PYTHON} -m venv failed (is python3-venv installed? scripts/setup.sh installs it):\n"
                              f"{made.stderr.strip()[-1500:]}")
        reqs = venv / "requirements.txt"
        reqs.write_text(venv_requirements(dep))
        pip = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                              "--no-input", "-r", str(reqs)], capture_output=True, text=True)
        if pip.returncode:
            shutil.rmtree(venv, ignore_errors=True)
            raise DeployError(f"pip install into {venv} failed:\n{(pip.stderr or pip.stdout).strip()[-2000:]}")
        marker.write_text(time.strftime("%Y-%m-%dT%H:%M:%S%z\n"))
        return venv


def write_app_config(dep):
    path = dep.state.conf / "olio.toml"
    values = {"db": dep.db_url, "cache": dep.cache_servers, "files": str(dep.files), "secret": dep.secret}
    path.write_text("# Written by olio_deploy at every `up`: Olio's settings for gunicorn.\n"
                    + "".join(f"{k} = {json.dumps(v)}\n" for k, v in values.items()))
    os.chmod(path, 0o640)
    if os.geteuid() == 0:
        os.chown(path, 0, group_id(WEB_USER))
    return path


def start(dep):
    state = dep.state
    if not os.path.exists(NGINX):
        raise DeployError("nginx is not installed (scripts/setup.sh installs it: apt-get install nginx)")
    if dep.cache and not os.path.exists(MEMCACHED):
        raise DeployError("memcached is not installed (scripts/setup.sh installs it)")
    dep.venv = ensure_venv(dep)
    write_app_config(dep)
    user = gunicorn_user(dep)
    sock_dir = dep.gunicorn_socket.parent
    sock_dir.mkdir(exist_ok=True)
    temp = state.run / "nginx"
    temp.mkdir(exist_ok=True)
    if os.geteuid() == 0:
        os.chown(sock_dir, 0, group_id(WEB_USER))
        os.chown(temp, 0, group_id(WEB_USER))
    sock_dir.chmod(0o770)
    temp.chmod(0o770)
    (state.conf / "gunicorn.conf.py").write_text(gunicorn_conf(dep, user))
    (state.conf / "nginx.conf").write_text(nginx_conf(dep))

    if dep.cache:
        start_memcached(dep)
    dep.log(f"starting gunicorn: {dep.workers} sync workers as {user or 'this user'}")
    run([str(dep.venv / "bin" / "python"), "-m", "gunicorn", "-c", str(state.conf / "gunicorn.conf.py"), "olio.wsgi:app"],
        "starting gunicorn", preexec=dep.confinement.enter, env=_app_env(dep), cwd=str(state.dir))
    wait_for_gunicorn(dep)
    nginx = [NGINX, "-p", str(state.run), "-e", str(state.logs / "nginx-error.log"), "-c", str(state.conf / "nginx.conf")]
    run(nginx + ["-t", "-q"], "checking nginx.conf")
    dep.log(f"starting nginx: {dep.cores} worker process(es) on {dep.bind}:{dep.port}")
    run(nginx, "starting nginx", preexec=dep.confinement.enter)
    wait_for_port(dep.bind, dep.port, 30, pid=read_pid(state.run / "nginx.pid"), log=state.logs / "nginx-error.log",
                  what="nginx")


def start_memcached(dep):
    state = dep.state
    argv = [MEMCACHED, "-l", "127.0.0.1", "-p", str(dep.ports["cache"]), "-U", "0",
            "-m", str(dep.cache_mb), "-t", str(dep.cores), "-c", "4096"]
    if os.geteuid() == 0:
        argv += ["-u", "memcache"]  # Debian's user for it; memcached refuses to run as root
    dep.log(f"starting memcached: {dep.cores} thread(s), {dep.cache_mb} MiB on 127.0.0.1:{dep.ports['cache']}")
    pid = start_daemon(argv, state.logs / "memcached.log", state.run / "memcached.pid", preexec=dep.confinement.enter)
    wait_for_port("127.0.0.1", dep.ports["cache"], 30, pid=pid, log=state.logs / "memcached.log", what="memcached")


def wait_for_gunicorn(dep, seconds=120):
    """Until gunicorn's socket answers HTTP (any status: the site's own check comes later)."""
    wait_for_socket(dep.state.run / "gunicorn.pid", dep.gunicorn_socket, dep.state.logs / "gunicorn.log", "gunicorn", seconds)


def wait_for_socket(pidfile, socket, log, what, seconds):
    """Until the gunicorn of `pidfile` answers HTTP on its Unix `socket` (any status); its
    `log`'s tail in the error when it exits or does not answer within `seconds`."""
    deadline = time.monotonic() + seconds
    while True:
        pid = read_pid(pidfile)
        if pid and not alive(pid):
            raise DeployError(f"{what} exited during start-up:\n{tail(log)}")
        if pid and socket.exists():
            try:
                conn = UnixHTTPConnection(socket, timeout=60)
                conn.request("GET", "/static/")
                conn.getresponse().read()
                conn.close()
                return
            except OSError:
                pass
        if time.monotonic() > deadline:
            raise DeployError(f"{what} did not answer on {socket} within {seconds} s:\n{tail(log)}")
        time.sleep(0.1)


def processes(dep):
    """{component: [pids]} of what runs now."""
    found = {}
    for name, pidfile in (("nginx", "nginx.pid"), ("gunicorn", "gunicorn.pid")):
        pid = read_pid(dep.state.run / pidfile)
        if pid and alive(pid):
            found[name] = [pid, *children(pid)]
    pid = daemon_pid(dep.state.run / "memcached.pid")
    if pid:
        found["memcached"] = [pid]
    return found


def stop_all(dep):
    """Stop nginx, then gunicorn, then memcached; returns what was running."""
    stopped = []
    for name, pidfile, sig in (("nginx", "nginx.pid", signal.SIGQUIT), ("gunicorn", "gunicorn.pid", signal.SIGTERM)):
        pid = read_pid(dep.state.run / pidfile)
        if pid and alive(pid):
            stop(pid, sig, grace=35)
            stopped.append(name)
    pid = daemon_pid(dep.state.run / "memcached.pid")
    if pid:
        stop(pid, signal.SIGTERM, grace=10)
        stopped.append("memcached")
    return stopped


def status(dep):
    procs = processes(dep)
    return {
        "nginx": {"running": "nginx" in procs, "pid": procs.get("nginx", [None])[0],
                  "workers": len(procs.get("nginx", [])[1:])},
        "gunicorn": {"running": "gunicorn" in procs, "pid": procs.get("gunicorn", [None])[0],
                     "workers": len(procs.get("gunicorn", [])[1:]), "socket": str(dep.gunicorn_socket)},
        "memcached": {"running": "memcached" in procs, "enabled": dep.cache, "address": dep.cache_servers or None},
    }


def interpreter_record(dep):
    """The venv's interpreter, and what gunicorn's master and workers run."""
    info = interpreter.describe(str(venv_path(dep) / "bin" / "python"))
    return interpreter.report(info, processes(dep).get("gunicorn", []))


def expected(dep):
    return ["nginx", "gunicorn"] + (["memcached"] if dep.cache else [])


def site_check(dep):
    return http_get(dep.url, "/", timeout=30)
