"""A fleet conventionally: nginx with a server per site, a gunicorn per site, one memcached.

nginx, memcached and each site's olio.toml are fleet_front.py's; nginx proxies each site to
its gunicorn over a Unix socket. Each site's gunicorn runs `olio.wsgi:app` with its own
olio.toml (its own database), the app preloaded and as few sync workers as meet the site's
peak: max(1, ceil(peak_users / U)), at most 2 x cores + 1, where U is one sync worker's
capacity in Cloudstone users (`users_per_worker`). Every gunicorn starts at fleet-up and
stays, a few starting at a time, with progress. The virtual environment is the single-site
deployment's (conventional.py).
"""

import json
import math
import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from . import conventional, fleet_front
from .fleet_front import app_env, site_dir
from .procs import alive, children, read_pid, run, stop

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


def start(fd):
    fleet_front.prepare(fd)
    user = fleet_front.app_user(fd, "gunicorn")
    for site in fd.sites:
        workers = fd.plan["workers"][site.name]
        (fd.state.conf / "sites" / f"{site.name}.gunicorn.py").write_text(gunicorn_conf(fd, site, workers, user))
    fleet_front.start_cache(fd)
    start_gunicorns(fd, user)
    fleet_front.start_nginx(fd, fleet_front.nginx_conf(fd, lambda site: site_dir(fd, site) / "gunicorn.sock"))


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
    found = fleet_front.processes(fd)
    masters = [p for p in (read_pid(site_dir(fd, s) / "gunicorn.pid") for s in fd.sites) if p and alive(p)]
    if masters:
        found["gunicorn"] = masters
    return found


def expected(fd):
    return ["nginx", "gunicorn"] + (["memcached"] if fd.cache else [])


def stop_all(fd):
    """nginx, then every gunicorn (all told at once, then waited for), then memcached."""
    stopped = fleet_front.stop_nginx(fd)
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
    return stopped + fleet_front.stop_cache(fd)


def failure(body):
    return None  # nginx and gunicorn say nothing a retry cannot fix


def log_hint(fd):
    return f"see {fd.state.logs}/nginx-error.log and {fd.state.logs}/sites/"


def status(fd):
    running = processes(fd)
    masters = running.get("gunicorn", [])
    return {**fleet_front.status(fd, running),
            "gunicorn": {"running": len(masters), "sites": len(fd.sites),
                         "workers": sum(len(children(p)) for p in masters)}}
