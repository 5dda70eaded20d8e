"""A fleet conventionally: nginx with a server per site, a gunicorn per site, one memcached.

nginx has one `server` per site (server_name its host; /static/ and /files/ from disk as for
one site; everything else proxied to the site's gunicorn over its Unix socket) and a default
server answering 404 to any other host. Each site's gunicorn runs `olio.wsgi:app` with its
own olio.toml (its own database), the app preloaded and as few sync workers as meet the
site's peak: max(1, ceil(peak_users / U)), at most 2 x cores + 1, where U is one sync
worker's capacity in Cloudstone users (`users_per_worker`). The gunicorns start a few at a
time, with progress. The virtual environment, the user check and memcached are the
single-site deployment's (conventional.py).
"""

import json
import math
import os
import signal
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from . import conventional
from .conventional import MEMCACHED, NGINX, WEB_USER
from .fleet_db import database
from .procs import (
    DeployError,
    alive,
    children,
    daemon_pid,
    demote_to,
    group_id,
    read_pid,
    run,
    stop,
    wait_for_port,
)

REPO = Path(__file__).resolve().parents[3]
CLOUDSTONE_RESULT = REPO / "bench" / "results" / "cloudstone.json"
# The repository's single-site Cloudstone result (bench/results/cloudstone.json, docs/
# cloudstone.md): the conventional stack on one core (--cpus 0, so 2 x 1 + 1 = 3 sync workers)
# met SLA-2 with 1,037 users: 345 users per worker. Read from the file when it is there.
MEASURED = {"sla2_users": 1037, "workers": 3}


def users_per_worker(path=CLOUDSTONE_RESULT):
    """U: Cloudstone users one sync worker serves within SLA-2, from the single-site result
    (its users at SLA-2 over its workers: the gunicorn processes it ran, less the master)."""
    users, workers = MEASURED["sla2_users"], MEASURED["workers"]
    try:
        stack = json.loads(Path(path).read_text())["stacks"]["conventional"]
        users = int(stack["sla2_users"])
        workers = max(1, sum(stack["interpreter"]["processes"].values()) - 1)
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return max(1, users // workers)


def workers_for(peak_users, cores, per_worker):
    return min(2 * cores + 1, max(1, math.ceil(peak_users / per_worker)))


def site_dir(fd, site):
    """STATE/run/sites/<name>: the site's socket, pid file and gunicorn's control socket."""
    return fd.state.run / "sites" / site.name


def nginx_conf(fd):
    run_dir, logs, temp = fd.state.run, fd.state.logs, fd.state.run / "nginx"
    upstreams, servers = [], []
    for site in fd.sites:
        upstreams.append(f"    upstream site_{site.name} {{ server unix:{site_dir(fd, site)}/gunicorn.sock fail_timeout=0; }}\n")
        servers.append(f"""
    server {{
        listen {fd.bind}:{fd.port};
        server_name {site.host};
        include {fd.state.conf}/nginx-site-common.conf;
        location / {{
            proxy_pass http://site_{site.name};
            include {fd.state.conf}/nginx-proxy.conf;
        }}
    }}
""")
    return f"""\
# Written by olio_deploy (fleet_conventional.py) at every fleet-up; edits are lost.
# {len(fd.sites)} Olio site(s), one server each, told apart by Host; any other host: 404.

user {WEB_USER};
worker_processes {fd.cores};
worker_rlimit_nofile 16384;
pid {run_dir}/nginx.pid;
error_log {logs}/nginx-error.log warn;

events {{
    worker_connections 4096;
}}

http {{
    include /etc/nginx/mime.types;
    default_type application/octet-stream;
    server_tokens off;
    server_names_hash_max_size {max(512, 2 * len(fd.sites))};
    server_names_hash_bucket_size 128;

    log_format olio '$host $remote_addr [$time_local] "$request" $status $body_bytes_sent '
                    '$request_time "$upstream_addr" $upstream_response_time';
    access_log {logs}/nginx-access.log olio buffer=64k flush=5s;

    sendfile on;
    tcp_nopush on;
    tcp_nodelay on;
    keepalive_timeout 65s;
    keepalive_requests 10000;
    client_max_body_size {fd.max_body_mb}m;
    client_body_buffer_size 256k;
    open_file_cache max=10000 inactive=60s;
    open_file_cache_valid 30s;

    client_body_temp_path {temp}/client_body;
    proxy_temp_path {temp}/proxy;
    fastcgi_temp_path {temp}/fastcgi;
    uwsgi_temp_path {temp}/uwsgi;
    scgi_temp_path {temp}/scgi;

{"".join(upstreams)}
    # A host the fleet does not name.
    server {{
        listen {fd.bind}:{fd.port} default_server backlog=4096;
        server_name _;
        return 404;
    }}
{"".join(servers)}}}
"""


def nginx_includes(fd):
    common = f"""\
# Every site's static assets and file store, as for one site (conventional.py).
location /static/ {{
    alias {fd.static_dir}/;
    expires 1h;
}}
location /files/ {{
    alias {fd.files}/;
    expires 7d;
    location ~ /\\. {{ return 404; }}
}}
"""
    proxy = """\
proxy_set_header Host $http_host;
proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
proxy_set_header X-Forwarded-Proto $scheme;
proxy_redirect off;
"""
    return {"nginx-site-common.conf": common, "nginx-proxy.conf": proxy}


def gunicorn_conf(fd, site, workers, user):
    d = site_dir(fd, site)
    return f"""\
# Written by olio_deploy (fleet_conventional.py): Olio site {site.name} ({site.host}).
bind = "unix:{d}/gunicorn.sock"
# The fewest sync workers that meet the site's peak of {site.peak_users:g} users at {fd.plan['users_per_worker']}
# users per worker (bench/results/cloudstone.json), at most 2 x cores + 1.
workers = {workers}
worker_class = "sync"
preload_app = True
timeout = 30
graceful_timeout = 30
backlog = 2048
{conventional._identity_conf(user)}
umask = 0o007
daemon = True
pidfile = "{d}/gunicorn.pid"
errorlog = "{fd.state.logs}/sites/{site.name}.log"
capture_output = True
accesslog = None
forwarded_allow_ips = "*"
proc_name = "olio-{site.name}"
control_socket = "{d}/control.sock"
"""


def site_config_path(fd, site):
    return fd.state.conf / "sites" / f"{site.name}.olio.toml"


def write_site_config(fd, site):
    path = site_config_path(fd, site)
    values = {"db": fd.postgres.url_of(database(site.name), fd.db_password),
              "cache": f"127.0.0.1:{fd.ports['cache']}" if fd.cache else "", "files": str(fd.files),
              "secret": fd.site_secret(site.name)}
    path.write_text(f"# Written by olio_deploy: Olio site {site.name} ({site.host}) for gunicorn.\n"
                    + "".join(f"{k} = {json.dumps(v)}\n" for k, v in values.items()))
    os.chmod(path, 0o640)
    if os.geteuid() == 0:
        os.chown(path, 0, group_id(WEB_USER))


def app_env(fd, site):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "PYENV", "VIRTUAL_ENV"))}
    env["PYTHONPATH"] = fd.pythonpath
    env["OLIO_CONFIG"] = str(site_config_path(fd, site))
    return env


def gunicorn_user(fd):
    """www-data when it can run the interpreter and import the app, else root (warned)."""
    if os.geteuid() != 0:
        return None
    try:
        out = subprocess.run([str(fd.venv / "bin" / "python"), "-c", "import olio.wsgi"], env=app_env(fd, fd.sites[0]),
                             capture_output=True, preexec_fn=demote_to(WEB_USER), timeout=120, cwd="/")
        if out.returncode == 0:
            return WEB_USER
        why = (out.stderr.decode(errors="replace").strip().splitlines() or [f"exit {out.returncode}"])[-1]
    except (OSError, subprocess.SubprocessError) as e:
        why = str(e)
    fd.log(f"warning: {WEB_USER} cannot import the app with {fd.venv}/bin/python ({why}); gunicorn runs as root")
    return "root"


def start(fd):
    state = fd.state
    if not os.path.exists(NGINX):
        raise DeployError("nginx is not installed (scripts/setup.sh installs it: apt-get install nginx)")
    if fd.cache and not os.path.exists(MEMCACHED):
        raise DeployError("memcached is not installed (scripts/setup.sh installs it)")
    fd.venv = conventional.ensure_venv(fd)
    for d in (state.conf / "sites", state.logs / "sites", state.run / "sites", state.run / "nginx"):
        d.mkdir(parents=True, exist_ok=True)
    web_gid = group_id(WEB_USER) if os.geteuid() == 0 else None
    for d in [state.run / "nginx", state.logs / "sites"] + [site_dir(fd, s) for s in fd.sites]:
        d.mkdir(exist_ok=True)
        if web_gid is not None:
            os.chown(d, 0, web_gid)
        d.chmod(0o770)
    for site in fd.sites:
        write_site_config(fd, site)
    user = gunicorn_user(fd)
    for site in fd.sites:
        workers = fd.plan["workers"][site.name]
        (state.conf / "sites" / f"{site.name}.gunicorn.py").write_text(gunicorn_conf(fd, site, workers, user))
    for name, text in nginx_includes(fd).items():
        (state.conf / name).write_text(text)
    (state.conf / "nginx.conf").write_text(nginx_conf(fd))
    if fd.cache:
        conventional.start_memcached(fd)
    start_gunicorns(fd, user)
    nginx = [NGINX, "-p", str(state.run), "-e", str(state.logs / "nginx-error.log"), "-c", str(state.conf / "nginx.conf")]
    run(nginx + ["-t", "-q"], "checking nginx.conf")
    fd.log(f"starting nginx: {fd.cores} worker process(es) on {fd.bind}:{fd.port}, {len(fd.sites)} server(s)")
    run(nginx, "starting nginx", preexec=fd.enter)
    wait_for_port(fd.bind, fd.port, 30, pid=read_pid(state.run / "nginx.pid"), log=state.logs / "nginx-error.log", what="nginx")


def start_gunicorns(fd, user):
    """Start every site's gunicorn, cores + 1 at a time (each imports the app before it
    forks), and wait for each socket to answer; progress every 10 or 5 s."""
    total = sum(fd.plan["workers"].values())
    fd.log(f"starting {len(fd.sites)} gunicorn(s) ({total} sync workers in all) as {user or 'this user'}")
    started, lock, done, said = time.monotonic(), threading.Lock(), [0], [time.monotonic()]

    def launch(site):
        python = str(fd.venv / "bin" / "python")
        conf = fd.state.conf / "sites" / f"{site.name}.gunicorn.py"
        # What an earlier run left (a killed master keeps its pid file) must not be taken for
        # this one; its log is kept as .1.
        for stale in ("gunicorn.pid", "gunicorn.sock", "control.sock"):
            (site_dir(fd, site) / stale).unlink(missing_ok=True)
        log = fd.state.logs / "sites" / f"{site.name}.log"
        if log.exists():
            log.replace(log.with_suffix(".log.1"))
        run([python, "-m", "gunicorn", "-c", str(conf), "olio.wsgi:app"], f"starting gunicorn for site {site.name}",
            preexec=fd.enter, env=app_env(fd, site), cwd=str(fd.state.dir))
        wait_for_gunicorn(fd, site)
        with lock:
            done[0] += 1
            if done[0] % 10 == 0 or done[0] == len(fd.sites) or time.monotonic() - said[0] > 5:
                fd.log(f"  {done[0]} of {len(fd.sites)} gunicorns answer ({time.monotonic() - started:.1f} s)")
                said[0] = time.monotonic()

    with ThreadPoolExecutor(fd.cores + 1) as pool:
        for future in [pool.submit(launch, s) for s in fd.sites]:
            future.result()


def wait_for_gunicorn(fd, site, seconds=120):
    d = site_dir(fd, site)
    conventional.wait_for_socket(d / "gunicorn.pid", d / "gunicorn.sock", fd.state.logs / "sites" / f"{site.name}.log",
                                 f"site {site.name}'s gunicorn", seconds)


def processes(fd):
    found = {}
    pid = read_pid(fd.state.run / "nginx.pid")
    if pid and alive(pid):
        found["nginx"] = [pid, *children(pid)]
    masters = [p for p in (read_pid(site_dir(fd, s) / "gunicorn.pid") for s in fd.sites) if p and alive(p)]
    if masters:
        found["gunicorn"] = masters
    pid = daemon_pid(fd.state.run / "memcached.pid")
    if pid:
        found["memcached"] = [pid]
    return found


def expected(fd):
    return ["nginx", "gunicorn"] + (["memcached"] if fd.cache else [])


def stop_all(fd):
    """nginx, then every gunicorn (all told at once, then waited for), then memcached."""
    stopped = []
    pid = read_pid(fd.state.run / "nginx.pid")
    if pid and alive(pid):
        stop(pid, signal.SIGQUIT, grace=35)
        stopped.append("nginx")
    masters = [p for p in (read_pid(site_dir(fd, s) / "gunicorn.pid") for s in fd.sites) if p and alive(p)]
    for pid in masters:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda p: stop(p, signal.SIGTERM, grace=35), masters))
    if masters:
        stopped.append(f"gunicorn x {len(masters)}")
    pid = daemon_pid(fd.state.run / "memcached.pid")
    if pid:
        stop(pid, signal.SIGTERM, grace=10)
        stopped.append("memcached")
    return stopped


def failure(body):
    return None  # nginx and gunicorn say nothing a retry cannot fix


def log_hint(fd):
    return f"see {fd.state.logs}/nginx-error.log and {fd.state.logs}/sites/"


def status(fd):
    running = processes(fd)
    masters = running.get("gunicorn", [])
    return {"nginx": {"running": "nginx" in running, "workers": len(running.get("nginx", [])[1:])},
            "gunicorn": {"running": len(masters), "sites": len(fd.sites),
                         "workers": sum(len(children(p)) for p in masters)},
            "memcached": {"running": "memcached" in running, "address": f"127.0.0.1:{fd.ports['cache']}"}}
