"""Bring a fleet of Olio sites up on one port, told apart by Host, take it down, or report on it.

`fleet-up --stack sprout|sprout-runc|sprout-gvisor|conventional|conventional-ondemand --dir STATE --fleet FILE`
deploys every site of a fleet file (fleet_file.py) under one memory budget B (`--memory-mb`),
confined to `--cpus`, and prints one line of JSON: the stack, the URL, the sites, B, the cgroup holding
every process of the deployment, the set-up time and the hosts. What all stacks share: the
confinement (confine.py), one PostgreSQL with a database per site copied from one loaded
template (fleet_db.py) and one file store; the stacks are in fleet_sprout.py,
fleet_conventional.py (a gunicorn per site, always running) and fleet_ondemand.py (uWSGI's
Emperor, a vassal per site started on demand and stopped when idle; its settings are
fleet-up's --vassal-idle and --vassal-processes), both behind fleet_front.py's nginx.

Memory: B is the budget of every process of the deployment together, judged as their peak
PSS; how each stack keeps it is fleet_memory.py's.
"""

import functools
import hashlib
import hmac
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from . import confine, conventional, deploy, filestore, fleet_conventional, fleet_file, fleet_ondemand, fleet_sprout, procs
from .fleet_db import FleetPostgres
from .fleet_memory import LIMITED_STACKS, MIN_MEMORY_MB, FleetConfinement, memory_plan, pss_mib, site_memory
from .postgres import server_log
from .procs import DeployError
from .state import State

REPO = Path(__file__).resolve().parents[3]
STACKS = {"sprout": fleet_sprout, "sprout-runc": fleet_sprout, "sprout-gvisor": fleet_sprout, "conventional": fleet_conventional,
          "conventional-ondemand": fleet_ondemand}
RECORD = "fleet.json"
EXIT_DOWN, EXIT_DEGRADED = 3, 4
PROBES = 8  # sites asked for GET / besides the first, spread over the fleet


@dataclass
class FleetOptions:
    """What fleet-up is asked for (the CLI's flags)."""
    stack: str
    state: str
    fleet: str
    cpus: str = "0"
    port: int = 8080
    bind: str = "127.0.0.1"
    memory_mb: int = 2048
    wait_s: float = 900.0
    fresh: bool = False  # copy every site's database again from the template
    app_dir: str = None
    package_cache: str = "/var/cache/sprout/packages"
    vassal_idle: str = None  # conventional-ondemand: seconds idle before a vassal stops (default 60)
    vassal_processes: str = None  # conventional-ondemand: processes per vassal, auto or a number


class FleetDeployment:
    """One fleet, as recorded in STATE/fleet.json: what the stack modules work from."""

    def __init__(self, state, record, log=None):
        self.state, self.record, self.log = state, record, log or _log
        self.stack = record["stack"]
        self.module = STACKS[self.stack]
        self.cpus, self.cores = record["cpus"], len(record["cpus"])
        self.port, self.bind, self.ports = record["port"], record["bind"], record["ports"]
        self.memory_mb, self.plan = record["memory_mb"], record["plan"]
        self.sites = [fleet_file.FleetSite(**s) for s in record["sites"]]
        self.files = Path(record["files"])
        self.cache, self.max_body_mb = True, 16
        self.cache_mb = self.plan["cache_mb"]
        self.app_dir, self.package_cache = Path(record["app_dir"]), Path(record["package_cache"])
        self.python_dir = REPO / "python"
        self.static_dir = self.app_dir / "olio" / "static"
        self.sprout_bin = Path(os.environ.get("SPROUT_BIN") or REPO / "target" / "release" / "sprout")
        self.confinement = FleetConfinement.existing(record["confinement"], self.cpus)
        self.confinement.memory_dir = Path(record["memory_cgroup"]) if record.get("memory_cgroup") else None
        self.postgres = FleetPostgres(state, self.ports["postgres"], self.cores, self.plan["max_connections"], self.memory_mb,
                                      [s.name for s in self.sites], log=self.log)

    url = property(lambda self: f"http://{'127.0.0.1' if self.bind in ('0.0.0.0', '') else self.bind}:{self.port}")
    api_url = property(lambda self: f"http://127.0.0.1:{self.ports['api']}")
    pythonpath = property(lambda self: f"{self.python_dir}:{self.app_dir}")

    @functools.cached_property
    def db_password(self):
        return self.state.secret("db-password")

    @functools.cached_property
    def _cookie_key(self):
        return self.state.secret("cookie-secret").encode()

    def enter(self):
        """preexec_fn: join the confinement (and the budget's memory group, if any)."""
        self.confinement.enter()

    def site_secret(self, name):
        """Each site's session-cookie key (a cookie of one site is no key to another)."""
        return hmac.new(self._cookie_key, name.encode(), hashlib.sha256).hexdigest()

    def processes(self):
        found = self.module.processes(self)
        pg = self.postgres.processes()
        if pg:
            found["postgres"] = pg
        return found

    def pids(self):
        """Every process of the deployment: under the confinement's cgroup, else by pid files."""
        pids = self.confinement.pids()
        if pids is None:
            tops = {p for ps in self.processes().values() for p in ps}
            pids = sorted(tops.union(*(procs.descendants(p) for p in tops)))
        return pids


def _log(message):
    print(message, file=sys.stderr, flush=True)


def _check(options):
    """Everything about the request that can be refused before anything starts."""
    if options.stack not in STACKS:
        raise DeployError(f"--stack {options.stack!r}: choose {', '.join(STACKS)}")
    stack_options = {}
    if options.stack == "conventional-ondemand":
        stack_options = fleet_ondemand.options(options.vassal_idle, options.vassal_processes)
    else:
        given = [flag for flag, value in (("--vassal-idle", options.vassal_idle), ("--vassal-processes", options.vassal_processes))
                 if value is not None]
        if given:
            raise DeployError(f"{' and '.join(given)}: settings of the conventional-ondemand stack, not of {options.stack}")
    fleet = fleet_file.load(options.fleet)
    if options.stack == "conventional-ondemand":
        fleet_ondemand.check(options.state, fleet.sites)
    cpus = confine.parse_cpus(options.cpus)
    if not 0 < options.port < 65536:
        raise DeployError(f"--port {options.port}: not a TCP port")
    if not procs.port_is_free(options.bind, options.port):
        raise DeployError(f"--port {options.port}: {options.bind}:{options.port} is in use")
    if options.memory_mb < MIN_MEMORY_MB:
        raise DeployError(f"--memory-mb {options.memory_mb}: at least {MIN_MEMORY_MB}")
    app_dir = Path(options.app_dir or REPO / "apps" / "olio").resolve()
    if not (app_dir / "olio" / "__init__.py").exists():
        raise DeployError(f"--app-dir {app_dir}: no olio package there")
    plan = memory_plan(options.stack, options.memory_mb, fleet.sites, len(cpus), stack_options=stack_options)
    return fleet, cpus, app_dir, plan, stack_options


def up(options, log=_log):
    """Start the fleet; returns fleet-up's JSON. On failure, stops what it started and raises."""
    begun = time.monotonic()
    fleet, cpus, app_dir, plan, stack_options = _check(options)
    state = State(options.state)
    if state.record_path.exists():
        raise DeployError(f"{state.dir} holds a single-site deployment (deploy.json); give the fleet a directory of its own")
    with state.lock():
        old = _record(state)
        if old is not None:
            running = FleetDeployment(state, old, log).processes()
            if running:
                raise DeployError(f"the {old['stack']} fleet in {state.dir} is already running ({', '.join(sorted(running))}); "
                                  f"`fleet-down --dir {state.dir}` first")
        record = {
            "stack": options.stack, "cpus": cpus, "port": options.port, "bind": options.bind,
            "memory_mb": options.memory_mb, "plan": plan, "stack_options": stack_options, "files": str(state.files),
            "app_dir": str(app_dir),
            "package_cache": options.package_cache, "confinement": confine.group_name(state.dir),
            "ports": procs.service_ports({options.port}),
            "fleet": {"path": str(Path(options.fleet).resolve()), "seed": fleet.seed,
                      "registered_users": fleet.registered_users},
            "sites": [{"name": s.name, "host": s.host, "peak_users": s.peak_users} for s in fleet.sites],
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        state.prepare()
        if os.geteuid() == 0:
            procs.require_traversable(state.dir, "postgres", "PostgreSQL's server")
            if options.stack in LIMITED_STACKS:  # nginx in front
                procs.require_traversable(state.dir, conventional.WEB_USER, "nginx's workers")
        _save(state, record)
        fd = FleetDeployment(state, record, log)
        try:
            _start(fd, options, fleet)
        except BaseException:
            log("start-up failed; stopping what was started")
            deploy.stop_parts(fd)
            raise
        record["setup_s"] = round(time.monotonic() - begun, 1)
        _save(state, record)
        return {"stack": fd.stack, "url": fd.url, "sites": len(fd.sites), "memory_mb": fd.memory_mb,
                "cgroup": str(fd.confinement.group) if fd.confinement.group else None,
                "memory_cgroup": str(fd.confinement.memory_dir) if fd.confinement.memory_dir else None, "setup_s": record["setup_s"],
                "hosts": [s.host for s in fd.sites]}


def _start(fd, options, fleet):
    log = fd.log
    fd.confinement = FleetConfinement.create(fd.confinement.name, fd.cpus, warn=log)
    log(f"confining the fleet to CPUs {confine.format_cpus(fd.cpus)} ({fd.confinement.describe()['mechanism']})")
    if fd.stack in LIMITED_STACKS or fd.confinement.kind == "v2":
        group = fd.confinement.limit_memory(fd.memory_mb)
        log(f"memory limit {fd.memory_mb} MiB on {group}" if group else "warning: no memory cgroup here; the budget is not enforced")
        fd.record["memory_cgroup"] = str(group) if group else None
        _save(fd.state, fd.record)
    log(f"memory plan: {json.dumps({k: v for k, v in fd.plan.items() if k != 'workers'})}")
    users = [filestore.SANDBOX_UID, conventional.WEB_USER]
    acls = fd.stack != "sprout-gvisor"
    log(f"file store {fd.files} ({filestore.prepare(fd.files, users, warn=log, acls=acls)})")
    pg = fd.postgres
    pg.init()
    pg.configure()
    log(f"starting PostgreSQL on 127.0.0.1:{pg.port} (max_connections {pg.max_connections}, {len(fd.sites)} site databases)")
    pg.start(fd.confinement)
    pg.setup_role(fd.db_password)
    if pg.ensure_template(fd.db_password, fleet.registered_users, fleet.seed, fd.files, dict(os.environ, PYTHONPATH=fd.pythonpath)):
        filestore.prepare(fd.files, users, warn=log, acls=acls)  # the loader's pictures, for every reader
    pg.make_site_databases(fresh=options.fresh)
    fd.module.start(fd)
    probe(fd, options.wait_s)
    if fd.stack in LIMITED_STACKS and fd.confinement.oom_kills():
        raise DeployError(f"the fleet does not fit in --memory-mb {fd.memory_mb}: the memory limit killed "
                          f"{fd.confinement.oom_kills()} process(es) during start-up; give it more memory or fewer sites")
    pss, counted = pss_mib(fd.pids())
    log(f"the fleet is up: {len(fd.sites)} site(s) on {fd.url}; {pss:.0f} MiB PSS in {counted} processes")


def probe(fd, seconds):
    """GET / on the first site until 200 (on Sprout, the first request waits for the packages
    and a Zygote), then on up to PROBES others spread over the fleet."""
    deadline = time.monotonic() + seconds
    sites = fd.sites
    step = max(1, (len(sites) - 1) // PROBES) if len(sites) > 1 else 1
    sample = [sites[0]] + [sites[i] for i in range(1, len(sites), step)][:PROBES]
    if sites[-1] not in sample:
        sample.append(sites[-1])
    fd.log(f"asking {len(sample)} of {len(sites)} site(s) for their home page: {', '.join(s.host for s in sample)}")
    for site in sample:
        said = time.monotonic()
        while True:
            try:
                status, _, body = procs.http_get(fd.url, "/", timeout=max(deadline - time.monotonic(), 1),
                                                 headers={"Host": site.host})
            except OSError as e:
                status, body = None, str(e).encode()
            if status == 200:
                break
            fatal = fd.module.failure(body)
            if fatal:
                raise DeployError(f"site {site.name} ({site.host}) fails: {fatal}\n({fd.module.log_hint(fd)})")
            if time.monotonic() > deadline:
                raise DeployError(f"{site.host} did not answer 200 within {seconds:.0f} s (last: {status} {body[:300]!r}); "
                                  f"{fd.module.log_hint(fd)}")
            if time.monotonic() - said > 10:
                fd.log(f"  waiting for {site.host}: {status} {body[:100]!r}")
                said = time.monotonic()
            time.sleep(0.5)


def down(state_dir, log=_log):
    """Stop everything of the fleet in `state_dir`; returns what was stopped."""
    state = State(state_dir)
    with state.lock():
        record = _record(state)
        if record is None:
            log(f"no fleet was deployed in {state.dir}")
            return []
        return deploy.stop_parts(FleetDeployment(state, record, log))




def status(state_dir):
    """(JSON-able dict, exit status): 0 up, 3 down, 4 degraded (part of it runs)."""
    state = State(state_dir)
    record = _record(state)
    if record is None:
        return {"state": "down", "dir": str(state.dir), "deployed": False}, EXIT_DOWN
    fd = FleetDeployment(state, record)
    running = fd.processes()
    missing = [c for c in ["postgres"] + fd.module.expected(fd) if c not in running]
    answers = None
    if running:
        try:
            answers = procs.http_get(fd.url, "/", timeout=30, headers={"Host": fd.sites[0].host})[0]
        except OSError:
            answers = None
    condition = "down" if not running else ("up" if not missing and answers == 200 else "degraded")
    pids = fd.pids() if running else []
    pss, counted = pss_mib(pids)
    report = {
        "state": condition, "stack": fd.stack, "url": fd.url, "dir": str(state.dir), "sites": len(fd.sites),
        "first_site_status": answers, "missing": missing, "confinement": fd.confinement.describe(),
        "memory": {"budget_mb": fd.memory_mb, "pss_mb": pss, "processes": counted,
                   "memory_cgroup": _existing(fd.confinement.memory_dir), "plan": fd.plan, "sites": site_memory(pids)},
        "processes": {name: len(ps) for name, ps in running.items()},
        "cpus_allowed": sorted({procs.cpus_allowed(p) for p in pids} - {None}),
        "postgres": {"running": "postgres" in running, "port": fd.ports["postgres"], "log": str(server_log(fd.postgres) or "")},
        **fd.module.status(fd),
        "settings": {k: record.get(k) for k in ("cpus", "port", "bind", "memory_mb", "files", "fleet", "started_at", "setup_s")},
    }
    return report, {"up": 0, "down": EXIT_DOWN, "degraded": EXIT_DEGRADED}[condition]


def _existing(path):
    return str(path) if path is not None and path.is_dir() else None


def _record(state):
    try:
        return json.loads((state.dir / RECORD).read_text())
    except FileNotFoundError:
        return None
    except ValueError as e:
        raise DeployError(f"{state.dir / RECORD} is damaged ({e}); remove it after checking that nothing runs") from None


def _save(state, record):
    tmp = state.dir / (RECORD + ".tmp")
    tmp.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    tmp.replace(state.dir / RECORD)
