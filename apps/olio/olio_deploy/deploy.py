"""Bring a whole Olio deployment up, take it down, or report on it.

Up goes in this order: the confinement, the file store, PostgreSQL (loaded by the loader when
asked), then the chosen stack; down in the reverse."""

import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import confine, conventional, filestore, interpreter, procs, sprout_stack
from .postgres import Postgres, server_log
from .procs import DeployError
from .state import State

REPO = Path(__file__).resolve().parents[3]
STACKS = {"sprout": sprout_stack, "sprout-gvisor": sprout_stack, "conventional": conventional}
EXIT_DOWN, EXIT_DEGRADED = 3, 4


@dataclass
class Options:
    """What `up` is asked for (the CLI's flags)."""
    stack: str
    state: str
    cpus: str = "0"
    port: int = 8080
    bind: str = "127.0.0.1"
    cache: bool = True
    users: int = None
    concurrent: int = None
    seed: int = 1
    allow_small: bool = False
    files: str = None
    workers: int = None  # default: (2 x cores) + 1
    cache_mb: int = 256
    max_body_mb: int = 16
    app_dir: str = None  # the directory holding the `olio` package; default apps/olio
    package_cache: str = "/var/cache/sprout/packages"
    network: str = "isolated"  # Sprout: the lambda's own network (the default) or the host's ("shared")
    gvisor_network: str = "sandbox"  # sprout-gvisor: through gVisor's network stack, or the host's ("host")
    wait_s: float = 900.0


@dataclass
class Site:
    """A running deployment, as `running` yields it."""
    stack: str
    url: str
    db_url: str
    files: Path
    state: Path
    cache_servers: str
    cpus: list = field(default_factory=list)


class Deployment:
    """One deployment, as recorded in STATE/deploy.json: what the stack modules work from."""

    def __init__(self, state, record, log=None):
        self.state, self.record = state, record
        self.log = log or _log
        self.stack = record["stack"]
        self.cpus = record["cpus"]
        self.cores = len(self.cpus)
        self.port, self.bind = record["port"], record["bind"]
        self.cache = record["cache"]
        self.ports = record["ports"]
        self.files = Path(record["files"])
        self.workers = record["workers"]
        self.cache_mb, self.max_body_mb = record["cache_mb"], record["max_body_mb"]
        self.app_dir = Path(record["app_dir"])
        self.package_cache = Path(record["package_cache"])
        self.network = record.get("network", "isolated")
        self.gvisor_network = record.get("gvisor_network", "sandbox")
        self.confinement = confine.Confinement.existing(record["confinement"], self.cpus)
        self.python_dir = REPO / "python"
        self.static_dir = self.app_dir / "olio" / "static"
        self.gunicorn_socket = state.run / "gunicorn" / "gunicorn.sock"
        self.sprout_bin = Path(os.environ.get("SPROUT_BIN") or REPO / "target" / "release" / "sprout")
        self.module = STACKS[self.stack]
        self.postgres = Postgres(state, self.ports["postgres"], self.cores, self.workers + 20, log=self.log)

    # Where to reach the site from this host (a wildcard bind is reached on loopback).
    url = property(lambda self: f"http://{'127.0.0.1' if self.bind in ('0.0.0.0', '') else self.bind}:{self.port}")
    api_url = property(lambda self: f"http://127.0.0.1:{self.ports['api']}")
    pythonpath = property(lambda self: f"{self.python_dir}:{self.app_dir}")
    cache_servers = property(lambda self: f"127.0.0.1:{self.ports['cache']}" if self.cache else "")
    secret = property(lambda self: self.state.secret("cookie-secret"))
    db_url = property(lambda self: self.postgres.url(self.state.secret("db-password")))

    def site(self):
        return Site(self.stack, self.url, self.db_url, self.files, self.state.dir, self.cache_servers, self.cpus)

    def processes(self):
        """{component: [pids]}: PostgreSQL (postmaster and backends) and the stack's."""
        found = self.module.processes(self)
        pg = self.postgres.processes()
        if pg:
            found["postgres"] = pg
        return found

    def expected(self):
        return ["postgres"] + self.module.expected(self)


def _log(message):
    print(message, file=sys.stderr, flush=True)


def _record(options, state):
    cpus = confine.parse_cpus(options.cpus)
    if options.stack not in STACKS:
        raise DeployError(f"--stack {options.stack!r}: choose {' or '.join(STACKS)}")
    if not 0 < options.port < 65536:
        raise DeployError(f"--port {options.port}: not a TCP port")
    if not procs.port_is_free(options.bind, options.port):
        raise DeployError(f"--port {options.port}: {options.bind}:{options.port} is in use")
    app_dir = Path(options.app_dir or REPO / "apps" / "olio").resolve()
    if not (app_dir / "olio" / "__init__.py").exists():
        raise DeployError(f"--app-dir {app_dir}: no olio package there")
    if options.network not in ("isolated", "shared"):
        raise DeployError(f"--network {options.network!r}: choose isolated or shared")
    if options.gvisor_network not in ("sandbox", "host"):
        raise DeployError(f"--gvisor-network {options.gvisor_network!r}: choose sandbox or host")
    workers = options.workers or 2 * len(cpus) + 1
    if workers < 1:
        raise DeployError("--workers must be at least 1")
    return {
        "stack": options.stack, "cpus": cpus, "port": options.port, "bind": options.bind, "cache": options.cache,
        "files": str(Path(options.files).resolve() if options.files else state.files), "workers": workers,
        "cache_mb": options.cache_mb, "max_body_mb": options.max_body_mb, "app_dir": str(app_dir),
        "package_cache": options.package_cache, "network": options.network,
        "gvisor_network": options.gvisor_network, "confinement": confine.group_name(state.dir),
        "ports": procs.service_ports({options.port}),
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def up(options, log=_log):
    """Start everything; returns the Site. On failure, stops what it started and raises."""
    state = State(options.state)
    if (state.dir / "fleet.json").exists():
        raise DeployError(f"{state.dir} holds a fleet (fleet.json, `fleet-up`); give the site a directory of its own")
    with state.lock():
        old = state.record()
        if old is not None:
            running = Deployment(state, old, log).processes()
            if running:
                raise DeployError(f"the {old['stack']} deployment in {state.dir} is already running "
                                  f"({', '.join(sorted(running))}); `down --dir {state.dir}` first")
        record = _record(options, state)
        state.prepare()
        if os.geteuid() == 0:
            procs.require_traversable(state.dir, "postgres", "PostgreSQL's server")
            if options.stack == "conventional":
                procs.require_traversable(state.dir, conventional.WEB_USER, "nginx's workers")
        state.save_record(record)
        dep = Deployment(state, record, log)
        try:
            _start(dep, options)
        except BaseException:
            log("start-up failed; stopping what was started")
            stop_parts(dep)
            raise
        return dep.site()


def _start(dep, options):
    log = dep.log
    dep.confinement = confine.Confinement.create(dep.confinement.name, dep.cpus, warn=log)
    log(f"confining the deployment to CPUs {confine.format_cpus(dep.cpus)} ({dep.confinement.describe()['mechanism']})")
    users = [filestore.SANDBOX_UID, conventional.WEB_USER]
    acls = dep.stack != "sprout-gvisor"
    how = filestore.prepare(dep.files, users, warn=log, acls=acls)
    log(f"file store {dep.files} ({how})")
    pg = dep.postgres
    pg.init()
    pg.configure()
    log(f"starting PostgreSQL on 127.0.0.1:{pg.port} (max_connections {pg.max_connections})")
    pg.start(dep.confinement)
    pg.setup_database(dep.state.secret("db-password"))
    if options.users or options.concurrent:
        load_if_empty(dep, options)
        filestore.prepare(dep.files, users, warn=log, acls=acls)  # the loader's pictures, for every reader
    dep.module.start(dep)
    log(f"waiting for {dep.url}/ to answer")
    if dep.module is sprout_stack:
        sprout_stack.wait_for_site(dep, options.wait_s)
    else:
        _wait_for_200(dep, options.wait_s)
    record = interpreter_record(dep)
    log(f"interpreter: {interpreter.summary(record)}; its processes run "
        + (", ".join(f"{n} x build {k}" for k, n in record.get("processes", {}).items()) or "nothing yet"))


def interpreter_record(dep):
    """Which interpreter build the stack's Python processes run (status's `interpreter`)."""
    try:
        return dep.module.interpreter_record(dep)
    except (OSError, RuntimeError, ValueError, subprocess.SubprocessError) as e:
        return {"error": str(e)}


def _wait_for_200(dep, seconds):
    deadline = time.monotonic() + seconds
    while True:
        try:
            status = procs.http_get(dep.url, "/", timeout=60)[0]
        except OSError as e:
            status = f"no answer: {e}"
        if status == 200:
            return
        if time.monotonic() > deadline:
            raise DeployError(f"{dep.url}/ did not answer 200 within {seconds:.0f} s (last: {status}); "
                              f"see {dep.state.logs}\n{procs.tail(dep.state.logs / 'gunicorn.log')}")
        time.sleep(0.5)


def load_if_empty(dep, options):
    """Run the loader into the empty database (olio/loader.py); keep a loaded one."""
    from olio.models import User
    from sprout.store.model import table_name

    users = dep.postgres.rows_in(table_name(User))
    if users:
        dep.log(f"the database already holds {users} users: not loading (`sprout olio load --recreate` reloads)")
        return
    if not (dep.app_dir / "olio" / "loader.py").exists():
        raise DeployError(f"--users: the loader {dep.app_dir / 'olio' / 'loader.py'} is missing")
    scale = ["--users", str(options.users)] if options.users else ["--concurrent", str(options.concurrent)]
    argv = [sys.executable, "-m", "olio.loader", *scale, "--seed", str(options.seed), "--db", dep.db_url,
            "--files", str(dep.files)] + (["--allow-small"] if options.allow_small else [])
    dep.log(f"loading the database: {' '.join(argv[3:5])} (seed {options.seed})")
    env = dict(os.environ, PYTHONPATH=dep.pythonpath)
    if subprocess.run(argv, env=env).returncode:
        raise DeployError("the loader failed (its message is above)")
    started = time.monotonic()
    dep.postgres.vacuum_analyze()
    dep.log(f"vacuumed and analyzed the loaded database in {time.monotonic() - started:.1f} s")


def down(state_dir, log=_log):
    """Stop everything of the deployment in `state_dir`; returns what was stopped."""
    state = State(state_dir)
    with state.lock():
        record = state.record()
        if record is None:
            log(f"nothing was deployed in {state.dir}")
            return []
        return stop_parts(Deployment(state, record, log))


def stop_parts(dep):
    """Stop the stack's own parts, PostgreSQL and any stray process of the confinement (a
    single site's deployment or a fleet's); a Sprout worker must leave no mount or cgroup."""
    stopped = dep.module.stop_all(dep)
    if dep.postgres.stop():
        stopped.append("postgres")
    strays = dep.confinement.destroy()
    if strays:
        dep.log(f"stopped {len(strays)} stray process(es) left in {dep.confinement.group}: {strays}")
    leftovers = getattr(dep.module, "leftovers", None)
    left = leftovers(dep) if leftovers else []
    if left:
        raise DeployError(f"the Sprout worker left {left}; see {dep.state.worker / 'worker.log'}")
    return stopped


def status(state_dir):
    """(JSON-able dict, exit status): 0 up, 3 down, 4 degraded (part of it runs)."""
    state = State(state_dir)
    record = state.record()
    if record is None:
        return {"state": "down", "dir": str(state.dir), "deployed": False}, EXIT_DOWN
    dep = Deployment(state, record)
    running = dep.processes()
    missing = [c for c in dep.expected() if c not in running]
    answers = None
    if running:
        try:
            answers = procs.http_get(dep.url, "/", timeout=10)[0]
        except OSError:
            answers = None
    condition = "down" if not running else ("up" if not missing and answers == 200 else "degraded")
    pids = sorted(p for ps in running.values() for p in ps)
    report = {
        "state": condition, "stack": dep.stack, "url": dep.url, "dir": str(state.dir), "site_status": answers,
        "missing": missing, "confinement": dep.confinement.describe(),
        "processes": {name: len(ps) for name, ps in running.items()},
        "cpus_allowed": sorted({procs.cpus_allowed(p) for p in pids} - {None}),
        "postgres": {"running": "postgres" in running, "port": dep.ports["postgres"], "data": str(dep.postgres.data),
                     "log": str(server_log(dep.postgres) or "")},
        **dep.module.status(dep),
        "interpreter": interpreter_record(dep) if running else None,
        "settings": {k: record[k] for k in ("cpus", "port", "bind", "cache", "files", "workers", "cache_mb", "started_at")},
    }
    return report, {"up": 0, "down": EXIT_DOWN, "degraded": EXIT_DEGRADED}[condition]
