"""The Sprout deployment: the Olio lambda on a worker's app port, and the Sprout cache. Stack
`sprout` runs it in lean sandboxes; `sprout-gvisor` in a gVisor sandbox (a second kernel).

The worker (STATE/worker) maps the static prefixes to disk and mounts the file store into every
sandbox; the lambda is built in STATE/lambda and deployed to it."""

import json
import os
import re
import shutil
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

from . import interpreter
from .procs import DeployError, alive, daemon_pid, descendants, http_get, read_pid, run, start_daemon, stop, tail, wait_for_port

LAMBDA = "olio"
DB_SERVICE = "olio-db"  # the worker's names of PostgreSQL and the cache, inside the sandbox
CACHE_SERVICE = "olio-cache"
SANDBOX_BASE = "/var/lib/sprout/base-bookworm"  # the machine-wide base image (the worker's default)
FILES_IN_SANDBOX = "/srv/olio-files"
SPROUT_MODULES = ("__init__.py", "client.py", "platform.py", "cache.py", "store")  # what `olio` imports of python/sprout


def worker_name(dep):
    return "olio-" + dep.confinement.name.rsplit("-", 1)[-1]


def cgroup_names(dep):
    """The worker's own cgroups (config.rs, cgroup_parents)."""
    return [f"sprout-{worker_name(dep)}", f"sprout-{worker_name(dep)}-runc"]


# `up --network shared`: the host's network, as SOCK's sandboxes had; services at their real
# addresses (sprout.store and sprout.cache find them by name in $SPROUT_SERVICE_*).
SHARED_NETWORK = """
# --network shared: no namespace; the sandboxes share the host's network.
[network]
isolate = false
"""


# `--stack sprout-gvisor`: the lambda's sandboxes in a gVisor sandbox of their own.
GVISOR = """backend = "gvisor"
start_timeout_ms = 120000     # the pod's first start imports Flask, Jinja2, Pillow and psycopg under gVisor
"""


def worker_config(dep):
    t = json.dumps  # TOML basic strings read JSON's escapes
    v2_root = dep.confinement.worker_v2_root
    return f"""\
# Written by olio_deploy (sprout_stack.py) at every `up`; edits are lost. Keys not set here
# keep the defaults documented in `sprout worker init`'s template.

[worker]
listen = {t(f"127.0.0.1:{dep.ports['api']}")}   # the worker's API (deploys, /stats, /metrics; token: api-token)
name = {t(worker_name(dep))}
log = "info"

[app]
# The site: every request to this port that no static prefix claims goes to the Olio lambda,
# with the full path as PATH_INFO (the same links as behind nginx).
listen = {t(f"{dep.bind}:{dep.port}")}
lambda = {t(LAMBDA)}
# Served by the worker from disk, with Last-Modified and 304s, before the lambda.
static = {{ "/static/" = {t(str(dep.static_dir))}, "/files/" = {t(str(dep.files))} }}

[base]
path = {t(SANDBOX_BASE)}        # its python3 is the conventional stack's too (scripts/align-python.sh)

[sandbox]
# The file store, shared with every sandbox (the app writes uploads and thumbnails there).
volumes = [{{ host = {t(str(dep.files))}, path = {t(FILES_IN_SANDBOX)}, writable = true }}]
{GVISOR if dep.stack == "sprout-gvisor" else ""}
[gvisor]
network = {t(dep.gvisor_network)}     # the lambda's sockets: gVisor's network stack, or the host's in its namespace

[limits]
# Flask, Jinja2, Pillow and psycopg in one interpreter take about 60 MiB; a thumbnail of an
# upload needs the decoded picture besides.
memory_mb = 256
timeout_ms = 30000            # as gunicorn's worker timeout
max_body_mb = {dep.max_body_mb}               # as nginx's client_max_body_size: an image and a PDF per form

[instances]
# As many request-serving processes as the conventional stack's gunicorn workers, (2 x
# cores) + 1: a sandbox serves one request at a time, and while one waits for PostgreSQL
# another can run.
max_per_lambda = {dep.workers}
# Requests beyond them wait here (gunicorn's backlog is 2048); past it, 429.
queue_depth = 2048
# Elastic: a sandbox idle past the keep-alive window goes (and with it its database
# connection), so after a burst the site shrinks back to what its load needs. The window is
# the hybrid histogram policy's, falling back to 60 s (Knative's stable window for scaling
# down) while the site has too few idle times to judge.
keep_alive = "histogram"
idle_timeout_s = 60

[handler_cache]
# One lambda: an idle sandbox sleeps in a read and costs no CPU, so freezing it would only
# put a thaw in front of the next request.
pause = false

[packages]
# Olio's pinned requirements, installed once per machine and shared by its workers.
cache_dir = {t(str(dep.package_cache))}

# The Olio lambda has a network of its own: PostgreSQL (and the cache) are all it can reach,
# by name (olio.toml says postgresql://...@{DB_SERVICE}/...).{SHARED_NETWORK if dep.network == "shared" else ""}
[[network.allow]]
name = {t(DB_SERVICE)}
address = {t(f"127.0.0.1:{dep.ports['postgres']}")}
lambdas = [{t(LAMBDA)}]
""" + (f"""
[[network.allow]]
name = {t(CACHE_SERVICE)}
address = {t(dep.cache_servers)}
lambdas = [{t(LAMBDA)}]
""" if dep.cache else "") + (f"""
[cgroups]
# Make the worker's cgroups inside the deployment's cpuset group, so sandboxes stay on its CPUs.
v2_root = {t(str(v2_root))}
""" if v2_root else "")


def api_token(dep):
    """The worker's API token (STATE/worker/api-token, made by `sprout worker init`): its
    /registry and /packages need it."""
    return (dep.state.worker / "api-token").read_text().strip()


def lambda_config(dep):
    """olio.toml: the services by the names the worker gives them in the sandbox (the cache at
    its port; sprout.store finds PostgreSQL's port itself)."""
    db = urlsplit(dep.db_url)
    userinfo = db.netloc.rpartition("@")[0]
    db_url = db._replace(netloc=f"{userinfo}@{DB_SERVICE}").geturl()
    cache = f"{CACHE_SERVICE}:{dep.ports['cache']}" if dep.cache else ""
    values = {"db": db_url, "cache": cache, "files": FILES_IN_SANDBOX, "secret": dep.secret}
    return ("# Written by olio_deploy: Olio's settings inside the sandbox (olio.config reads olio.toml beside\n"
            "# the olio package). The sandbox has a network of its own, where PostgreSQL and the cache\n"
            "# are the worker's services olio-db and olio-cache (its /etc/hosts names them).\n"
            + "".join(f"{k} = {json.dumps(v)}\n" for k, v in values.items()))


def build_lambda(dep):
    """STATE/lambda: f.py, the code (`copy_code`), olio.toml."""
    out = dep.state.lambda_dir
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    copy_code(dep, out)
    (out / "olio.toml").write_text(lambda_config(dep))
    (out / "f.py").write_text('"""The Olio site as one WSGI lambda (olio_deploy builds it)."""\nfrom olio.wsgi import app  # noqa: F401\n')
    return out


def copy_code(dep, out):
    """Into `out`: olio/ (its templates compiled ahead), the parts of sprout/ it imports and
    requirements.txt, from `dep`'s app_dir and python_dir."""
    requirements = dep.app_dir / "requirements.txt"
    if not requirements.exists():
        raise DeployError(f"{requirements} is missing: the lambda's packages are installed from it")
    skip = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(dep.app_dir / "olio", out / "olio", ignore=skip)
    (out / "sprout").mkdir()
    for name in SPROUT_MODULES:
        source = dep.python_dir / "sprout" / name
        if source.is_dir():
            shutil.copytree(source, out / "sprout" / name, ignore=skip)
        else:
            shutil.copy2(source, out / "sprout" / name)
    shutil.copy2(requirements, out / "requirements.txt")
    dep.log(compile_templates(out / "olio"))


def compile_templates(olio_dir):
    """Olio's templates compiled to Python modules in the lambda's olio/compiled_templates
    (olio.web.compile_templates; the worker compiles them to bytecode at upload), so that a
    new sandbox imports a page's template instead of compiling it: what was done, or why not
    (this interpreter lacks Olio's packages: the sandboxes compile them as before)."""
    try:
        from olio.web import compile_templates as compile_into
    except ImportError as e:
        return f"templates left to be compiled in the sandboxes: {e}"
    compile_into(olio_dir / "compiled_templates")
    return f"templates compiled ahead into {olio_dir.name}/compiled_templates"


def start(dep):
    state = dep.state
    state.worker.mkdir(exist_ok=True)
    (state.worker / "config.toml").write_text(worker_config(dep))
    sprout = str(dep.sprout_bin)
    run([sprout, "worker", "init", str(state.worker)], "sprout worker init (the sandbox base image is built once per machine)",
        timeout=1800)
    if dep.cache:
        start_cache(dep)
    dep.log(f"starting the Sprout worker: app port {dep.bind}:{dep.port}, API 127.0.0.1:{dep.ports['api']}, "
            f"up to {dep.workers} sandboxes")
    run([sprout, "worker", "up", "--detach", str(state.worker)], "starting the Sprout worker", preexec=dep.confinement.enter,
        timeout=180)
    build_lambda(dep)
    run([sprout, "deploy", str(state.lambda_dir), "--name", LAMBDA, "--url", dep.api_url], "deploying the Olio lambda",
        env={**os.environ, "SPROUT_TOKEN": api_token(dep)})


def start_cache(dep):
    port = dep.ports["cache"]
    argv = [str(dep.sprout_bin), "cache", "serve", "-l", "127.0.0.1", "-p", str(port), "-t", str(dep.cores),
            "--cpus", ",".join(map(str, dep.cpus)), "-m", str(dep.cache_mb), "-c", "4096"]
    dep.log(f"starting the Sprout cache: {dep.cores} core(s), {dep.cache_mb} MiB on 127.0.0.1:{port}")
    pid = start_daemon(argv, dep.state.logs / "cache.log", dep.state.run / "cache.pid", preexec=dep.confinement.enter)
    wait_for_port("127.0.0.1", port, 30, pid=pid, log=dep.state.logs / "cache.log", what="the Sprout cache")


def _requirement_keys(path):
    keys = set()
    for line in Path(path).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            name = re.sub(r"\[.*\]", "", name)
            keys.add(f"{re.sub(r'[-_.]+', '-', name.strip()).lower()}=={version.strip()}")
    return keys


def _installed_keys(dep):
    status, _, body = http_get(dep.api_url, "/packages", timeout=10, headers={"Authorization": f"Bearer {api_token(dep)}"})
    if status != 200:
        return set()
    return {f"{re.sub(r'[-_.]+', '-', p['name']).lower()}=={p['version']}" for p in json.loads(body)}


def wait_for_site(dep, seconds):
    """Until GET / answers 200. The first request waits for the lambda's packages (pip, once
    per machine) and its Zygote: say what happens meanwhile."""
    wanted = _requirement_keys(dep.state.lambda_dir / "requirements.txt")
    begun = time.monotonic()
    done = threading.Event()

    def progress():
        while not done.wait(5):
            try:
                have = len(wanted & _installed_keys(dep))
                dep.log(f"  waiting for the site: {time.monotonic() - begun:.0f} s; "
                        f"packages in the install cache: {have} of {len(wanted)}")
            except (OSError, ValueError):
                pass

    reporter = threading.Thread(target=progress, daemon=True)
    reporter.start()
    try:
        while True:
            left = seconds - (time.monotonic() - begun)
            try:
                status, _, body = http_get(dep.url, "/", timeout=max(left, 1))
            except OSError as e:
                status, body = None, str(e).encode()
            if status == 200:
                return
            fatal = _worker_error(body)
            if fatal:
                raise DeployError(f"the Olio lambda fails: {fatal}\n(worker log: {dep.state.worker / 'worker.log'})")
            if time.monotonic() - begun > seconds:
                raise DeployError(f"the site did not answer 200 within {seconds:.0f} s (last: {status} "
                                  f"{body[:300]!r}); see {dep.state.worker / 'worker.log'}")
            time.sleep(1)
    finally:
        done.set()


def _worker_error(body):
    """The message of a worker error that retrying cannot fix, or None."""
    try:
        error = json.loads(body)
    except ValueError:
        return None
    if not isinstance(error, dict) or error.get("error") not in ("install_failed", "load_error", "handler_exception",
                                                                  "lambda_not_found", "invalid_result"):
        return None
    detail = error.get("pip_output") or error.get("traceback") or ""
    return f"{error['error']}: {error.get('message', '')}\n{detail[-2000:]}".strip()


def processes(dep):
    found = {}
    pid = read_pid(dep.state.worker / "worker.pid")
    if pid and alive(pid):
        found["worker"] = [pid, *descendants(pid)]
    pid = daemon_pid(dep.state.run / "cache.pid")
    if pid:
        found["cache"] = [pid]
    return found


def stop_all(dep, names=None, timeout=120):
    """Stop the worker (and clean up after it) and the cache; `names`: the worker's cgroups
    (default `cgroup_names`)."""
    stopped = []
    sprout = str(dep.sprout_bin)
    if (dep.state.worker / "config.toml").exists():
        out = run([sprout, "worker", "down", str(dep.state.worker), "--grace", "30"], "stopping the Sprout worker", timeout=timeout)
        if "stopped" in out:
            stopped.append("worker")
        if leftovers(dep, names):
            run([sprout, "worker", "cleanup", str(dep.state.worker)], "cleaning up after the Sprout worker", timeout=timeout)
    pid = daemon_pid(dep.state.run / "cache.pid")
    if pid:
        stop(pid, grace=10)
        stopped.append("cache")
    return stopped


def leftovers(dep, names=None):
    """Mounts under the worker's directory and its cgroups (`names`, default `cgroup_names`)
    that still exist."""
    left = []
    with open("/proc/self/mountinfo") as f:
        left += [line.split()[4] for line in f if line.split()[4].startswith(str(dep.state.worker))]
    roots = [p for p in Path("/sys/fs/cgroup").iterdir() if p.is_dir()]
    if dep.confinement.worker_v2_root:
        roots.append(dep.confinement.worker_v2_root)
    for name in names or cgroup_names(dep):
        left += [str(r / name) for r in roots if (r / name).exists()]
    return left


def status(dep):
    procs = processes(dep)
    worker = procs.get("worker", [])
    return {
        "worker": {"running": bool(worker), "pid": worker[0] if worker else None, "api": dep.api_url,
                   "processes": len(worker), "log": str(dep.state.worker / "worker.log")},
        "cache": {"running": "cache" in procs, "enabled": dep.cache, "address": dep.cache_servers or None},
    }


def interpreter_record(dep):
    """The sandbox base's interpreter, and what the worker's Zygotes and handlers run."""
    info = interpreter.describe("/usr/bin/python3", root=SANDBOX_BASE)
    return interpreter.report(info, processes(dep).get("worker", []))


def expected(dep):
    return ["worker"] + (["cache"] if dep.cache else [])


def log_tail(dep):
    return tail(dep.state.worker / "worker.log")
