"""A fleet on Sprout: one worker whose app port serves every site by Host, a lambda per site.

Stacks `sprout` (lean sandboxes forked from Zygotes), `sprout-runc` (a runc container per
sandbox, started on demand as Knative or Cloud Run start one per service) and `sprout-gvisor`
(a gVisor sandbox per site, a second kernel, its sandboxes forked inside it; started on
demand and stopped when idle): the same worker configuration but for the back-end. Every site is the same Olio code as a
lambda named after the site, whose olio.toml names the site's own database; the worker's
`[app.sites]` maps each host to its lambda (with /static/ and /files/ served from disk, as
for one site), a host the fleet does not name gets 404 `site_not_found`. One Sprout cache
serves all sites (Olio's keys carry a hash of the site's database URL, so sites never share
a value). Lambdas are uploaded straight to the worker's API, a few at once, from one packed
copy of the code.
"""

import gzip
import io
import json
import shutil
import tarfile
import time
from concurrent.futures import ThreadPoolExecutor

from . import sprout_stack
from .fleet_db import database
from .procs import alive, daemon_pid, http_get, read_pid, run, start_daemon, wait_for_port

STACKS = ("sprout", "sprout-runc", "sprout-gvisor")
BACKENDS = {"sprout": "sock", "sprout-runc": "runc", "sprout-gvisor": "gvisor"}
DB_SERVICE, CACHE_SERVICE = sprout_stack.DB_SERVICE, sprout_stack.CACHE_SERVICE
FILES_IN_SANDBOX = sprout_stack.FILES_IN_SANDBOX
MAX_PER_LAMBDA = 3
IDLE_TIMEOUT_S = 600
UPLOADS_AT_ONCE = 4
PARK_AFTER_MS = 30_000  # sprout-gvisor: a site idle this long is parked
PARK_DISK_MB = 32_768
CREATED_AHEAD = 3  # sprout-gvisor: containers kept created ahead (a runsc sandbox and gofer, ~25 MiB each)
# Every site runs the same code with its own olio.toml: the worker loads Olio once, in a code
# Zygote all the sites' sandboxes are forked from (olio.web.prepare builds the application
# without settings there; each sandbox's create_app gives it its site's).
PRELOAD = """\
# Written by olio_deploy (fleet_sprout.py): every site's lambda shares this code but for olio.toml.
preload:
  modules: [olio.web]
  call: olio.web:prepare
  settings: [olio.toml]
"""


def worker_name(fd):
    return "fleet-" + fd.confinement.name.rsplit("-", 1)[-1]


def cgroup_names(fd):
    """The worker's own cgroups (config.rs, cgroup_parents)."""
    return [f"sprout-{worker_name(fd)}", f"sprout-{worker_name(fd)}-runc"]


def worker_config(fd):
    t = json.dumps  # TOML basic strings read JSON's escapes
    plan, backend = fd.plan, BACKENDS[fd.stack]
    statics = f'{{ "/static/" = {t(str(fd.static_dir))}, "/files/" = {t(str(fd.files))} }}'
    sites = "".join(f"\n[app.sites.{t(s.host)}]\nlambda = {t(s.name)}\nstatic = {statics}\n" for s in fd.sites)
    v2_root = fd.confinement.worker_v2_root
    if backend == "gvisor":
        budget = """\
# The worker's memory budget applies to the sock back-ends only: a gVisor site's pod is parked
# to disk when idle ([gvisor] below), and the running pods are kept within resident_mb.
memory_budget_mb = 0
# Each site's pod is started as it is deployed, its handler loaded, and parked once idle: a
# site's first visit restores it (as a later one does) instead of starting from the template.
start_on_deploy = true"""
    elif backend != "sock":
        budget = f"""\
# The worker's memory budget applies to the sock back-ends only ({backend}'s sandboxes are not in
# its cgroup): the fleet's budget is kept by a count instead, max_total sandboxes of about
# {plan['sandbox_mb']} MiB each (fleet_memory.py, memory_plan).
memory_budget_mb = 0"""
    else:
        budget = f"""\
# The fleet's budget B = {fd.memory_mb} MiB less a reserve for PostgreSQL, the cache, the worker and
# the database connections its sandboxes hold (fleet.py, memory_plan): the memory limit of
# the cgroup holding every sandbox and Zygote, kept by evicting idle sandboxes.
memory_budget_mb = {plan['budget_mb']}"""
    network = f"""
# Each site's lambda has a network of its own, made ahead and kept while it exists.
[network]
max_namespaces = {max(1024, len(fd.sites) + 16)}
"""
    cache = f"""
[[network.allow]]
name = {t(CACHE_SERVICE)}
address = {t(f"127.0.0.1:{fd.ports['cache']}")}
""" if fd.cache else ""
    return f"""\
# Written by olio_deploy (fleet_sprout.py) at every fleet-up; edits are lost. A fleet of
# {len(fd.sites)} Olio site(s), one lambda each, on one app port. Keys not set here keep the
# defaults documented in `sprout worker init`'s template.

[worker]
listen = {t(f"127.0.0.1:{fd.ports['api']}")}   # the worker's API (deploys, /stats; token: api-token)
name = {t(worker_name(fd))}
log = "info"

[app]
# The sites, by the request's Host; no default site, so any other host gets 404.
listen = {t(f"{fd.bind}:{fd.port}")}
{sites}
[base]
path = {t(sprout_stack.SANDBOX_BASE)}

[sandbox]
backend = {t(backend)}
# The file store, shared by every site (uploads are stored under random names).
volumes = [{{ host = {t(str(fd.files))}, path = {t(FILES_IN_SANDBOX)}, writable = true }}]

[limits]
memory_mb = 256               # per sandbox, as for one site (a thumbnail decodes a picture)
timeout_ms = 30000
max_body_mb = 16

[instances]
# Elastic, as a provider runs many mostly idle sites: each site's sandboxes are kept for the
# window its own idle times give (the hybrid histogram policy), falling back to a fixed 10
# minutes (providers' usual keep-alive) while a site has too few idle times to judge.
keep_alive = "histogram"
idle_timeout_s = {IDLE_TIMEOUT_S}
# A site's peak in a Cloudstone fleet is a few users; three sandboxes serve a burst while the
# budget, not a per-site reservation, bounds the whole.
max_per_lambda = {MAX_PER_LAMBDA}
queue_depth = 256
# Every site may hold a sandbox at once (each holds one database connection); the budget
# evicts idle ones before that.
max_total = {plan['max_total']}
sandbox_estimate_mb = {plan['sandbox_mb']}
{budget}

{handler_cache(fd)}

[packages]
cache_dir = {t(str(fd.package_cache))}
{network}
# What every site's lambda may reach (no `lambdas` list: every lambda here is a site).
[[network.allow]]
name = {t(DB_SERVICE)}
address = {t(f"127.0.0.1:{fd.ports['postgres']}")}
{cache}""" + (f"""
[cgroups]
# The worker's cgroups inside the deployment's cpuset group, so sandboxes stay on its CPUs.
v2_root = {t(str(v2_root))}
""" if v2_root else "")


def handler_cache(fd):
    """The [handler_cache] section, and for gVisor the [gvisor] one."""
    if BACKENDS[fd.stack] != "gvisor":
        return """[handler_cache]
# No pausing: an idle Olio sandbox sleeps in a read and costs no CPU, so freezing it saves
# nothing but puts a thaw before a mostly idle site's next request; memory is bounded by the
# budget above, which evicts the idle sandboxes holding the most memory per recent request."""
    return f"""[handler_cache]
# A gVisor sandbox is not frozen when paused: pausing marks it idle, and a site whose sandboxes
# are all idle for park_after_ms has its pod parked.
pause = true
pause_after_ms = 100

[gvisor]
# An idle site's pod is written to disk (its handler's state in it) past the longest gap
# between a visitor's page views (Olio's cycle times: 5 s on average, 25 s at most), and
# restored by its next request; the running pods share resident_mb, idle ones parked early
# to make room; parked images may take park_disk_mb of disk (the oldest go past it).
park_after_ms = {PARK_AFTER_MS}
resident_mb = {fd.plan['resident_mb']}
park_disk_mb = {PARK_DISK_MB}
# A new site's first pod is restored from the codebase's template into a container created
# ahead; sessions start at several sites at once, so a few are kept ready.
created_ahead = {CREATED_AHEAD}"""


def site_config(fd, site):
    """olio.toml of a site's lambda: its own database, by the worker's service names."""
    values = {"db": fd.postgres.url_of(database(site.name), fd.db_password, host=DB_SERVICE, port=False),
              "cache": f"{CACHE_SERVICE}:{fd.ports['cache']}" if fd.cache else "",
              "files": FILES_IN_SANDBOX, "secret": fd.site_secret(site.name)}
    return (f"# Written by olio_deploy: the settings of Olio site {site.name} ({site.host}) inside its sandbox.\n"
            + "".join(f"{k} = {json.dumps(v)}\n" for k, v in values.items()))


def build_code(fd):
    """STATE/lambda: the code every site's lambda shares (no olio.toml: each archive adds
    its own); returns the uncompressed tar of it, without the end-of-archive blocks."""
    out = fd.state.lambda_dir
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    sprout_stack.copy_code(fd, out)
    (out / "f.py").write_text('"""An Olio site of a fleet as one WSGI lambda (olio_deploy builds it)."""\n'
                              "from olio.wsgi import app  # noqa: F401\n")
    (out / "ol.yaml").write_text(PRELOAD)
    buffer = io.BytesIO()
    archive = tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT)
    for entry in sorted(out.iterdir()):
        archive.add(entry, arcname=entry.name)
    return buffer.getvalue()  # not closed: a site's member and the end blocks follow


def site_archive(shared, text):
    """The tar.gz of one site's lambda: the shared code and its olio.toml."""
    tail = io.BytesIO()
    with tarfile.open(fileobj=tail, mode="w", format=tarfile.PAX_FORMAT) as archive:
        info = tarfile.TarInfo("olio.toml")
        data = text.encode()
        info.size, info.mode, info.mtime = len(data), 0o644, int(time.time())
        archive.addfile(info, io.BytesIO(data))
    return gzip.compress(shared + tail.getvalue(), compresslevel=1)


def deploy_lambdas(fd):
    """Upload every site's lambda ({UPLOADS_AT_ONCE} at once); progress every 50."""
    from sprout.client import Client

    shared = build_code(fd)
    token = sprout_stack.api_token(fd)
    started, sites = time.monotonic(), fd.sites
    fd.log(f"deploying {len(sites)} lambda(s) to the worker ({len(shared) >> 10} KiB of code each)")

    fd.site_secret(sites[0].name)  # made once, before the threads read it
    fd.db_password  # noqa: B018

    def upload(site):
        Client(fd.api_url, token=token, timeout=300).upload(site.name, site_archive(shared, site_config(fd, site)))

    with ThreadPoolExecutor(UPLOADS_AT_ONCE) as pool:
        for i, _ in enumerate(pool.map(upload, sites), 1):
            if i % 50 == 0 or i == len(sites):
                fd.log(f"  {i} of {len(sites)} lambdas deployed ({time.monotonic() - started:.1f} s)")
    if BACKENDS[fd.stack] == "gvisor":
        wait_for_starts_on_deploy(fd, token)


def wait_for_starts_on_deploy(fd, token):
    """Wait until the worker has started every site's pod ([instances] start_on_deploy, one at a
    time), so the load does not begin beside the deployment's own work; progress every 10 s."""
    started, said = time.monotonic(), 0.0
    while True:
        code, _, body = http_get(fd.api_url, "/stats", timeout=10, headers={"Authorization": f"Bearer {token}"})
        if code != 200:
            raise RuntimeError(f"the worker's /stats answered {code} while its sites' pods started; {log_hint(fd)}")
        starts = json.loads(body)["lambdas"]["started_on_deploy"]
        waited = time.monotonic() - started
        if starts["pending"] == 0:
            fd.log(f"  {starts['made']} site pod(s) started on deploy, {starts['failed']} failed, "
                   f"{starts['skipped']} skipped ({waited:.1f} s)")
            return
        if waited - said >= 10:
            said = waited
            fd.log(f"  site pods started on deploy: {starts['made']} of {len(fd.sites)} ({waited:.0f} s)")
        if waited > 60 + 5 * len(fd.sites):
            raise RuntimeError(f"the sites' pods were not all started in {waited:.0f} s; {log_hint(fd)}")
        time.sleep(0.5)


def start(fd):
    state = fd.state
    state.worker.mkdir(exist_ok=True)
    (state.worker / "config.toml").write_text(worker_config(fd))
    sprout = str(fd.sprout_bin)
    run([sprout, "worker", "init", str(state.worker)], "sprout worker init (the sandbox base image is built once per machine)",
        timeout=1800)
    if fd.cache:
        start_cache(fd)
    kind = {"sock": "lean sandboxes", "runc": "runc containers", "gvisor": "a gVisor sandbox per site"}[BACKENDS[fd.stack]]
    fd.log(f"starting the Sprout worker ({kind}): "
           f"app port {fd.bind}:{fd.port}, API 127.0.0.1:{fd.ports['api']}, {len(fd.sites)} site(s)")
    run([sprout, "worker", "up", "--detach", str(state.worker)], "starting the Sprout worker", preexec=fd.enter, timeout=180)
    deploy_lambdas(fd)


def start_cache(fd):
    port, mb = fd.ports["cache"], fd.plan["cache_mb"]
    argv = [str(fd.sprout_bin), "cache", "serve", "-l", "127.0.0.1", "-p", str(port), "-t", str(fd.cores),
            "--cpus", ",".join(map(str, fd.cpus)), "-m", str(mb), "-c", "4096"]
    fd.log(f"starting the Sprout cache: {fd.cores} core(s), {mb} MiB on 127.0.0.1:{port}")
    pid = start_daemon(argv, fd.state.logs / "cache.log", fd.state.run / "cache.pid", preexec=fd.enter)
    wait_for_port("127.0.0.1", port, 30, pid=pid, log=fd.state.logs / "cache.log", what="the Sprout cache")


def failure(body):
    """The message of a worker error that retrying cannot fix (the lambda fails), or None."""
    return sprout_stack._worker_error(body)


def log_hint(fd):
    return f"see {fd.state.worker / 'worker.log'}"


def processes(fd):
    found = {}
    pid = read_pid(fd.state.worker / "worker.pid")
    if pid and alive(pid):
        found["worker"] = [pid]
    pid = daemon_pid(fd.state.run / "cache.pid")
    if pid:
        found["cache"] = [pid]
    return found


def expected(fd):
    return ["worker"] + (["cache"] if fd.cache else [])


def stop_all(fd):
    return sprout_stack.stop_all(fd, cgroup_names(fd), timeout=300)


def leftovers(fd):
    """Mounts under the worker's directory and its cgroups that still exist."""
    return sprout_stack.leftovers(fd, cgroup_names(fd))


def status(fd):
    running = processes(fd)
    stats = None
    if "worker" in running:
        try:
            code, _, body = http_get(fd.api_url, "/stats", timeout=10,
                                     headers={"Authorization": f"Bearer {sprout_stack.api_token(fd)}"})
            stats = json.loads(body) if code == 200 else None
        except (OSError, ValueError):
            stats = None
    return {"worker": {"running": "worker" in running, "api": fd.api_url, "log": str(fd.state.worker / "worker.log"),
                       "sandboxes": _sandboxes(stats), "parking": _parking(stats)},
            "cache": {"running": "cache" in running, "address": f"127.0.0.1:{fd.ports['cache']}"}}


def _parking(stats):
    """What the gVisor back-end's parking has done (parks, restores and their time and CPU,
    images on disk), from /stats; None without it."""
    if not isinstance(stats, dict):
        return None
    gvisor = (stats.get("backends") or {}).get("gvisor") or {}
    return (gvisor.get("counters") or {}).get("parking")


def _sandboxes(stats):
    """The worker's sandboxes by state and its memory budget, from /stats (None when it does
    not answer)."""
    if not isinstance(stats, dict):
        return None
    budget = (stats.get("lambdas") or {}).get("memory_budget")
    return {**(stats.get("sandboxes") or {}), "memory_budget": budget}
