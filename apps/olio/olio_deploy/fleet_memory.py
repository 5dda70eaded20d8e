"""The fleet's memory: how the budget B is divided and kept, its limit, and its measurement.

B is the budget for every process of the deployment together, judged as the peak PSS
of all of them (the processes found under the printed cgroup). How each stack keeps it:

- sprout: the worker's `memory_budget_mb`, the kernel's limit on the cgroup holding every
  sandbox and Zygote, kept by evicting idle sandboxes, is B less a reserve for the rest
  (`memory_plan`): PostgreSQL (shared_buffers B/8 and its processes), the cache (B/32,
  16-64 MiB), the worker, and the database connection each sandbox holds (a backend per
  sandbox, outside the worker's cgroup, so the budget is scaled by sandbox / (sandbox +
  backend)). The figures are fixed, measured on this VM, not re-measured at each start.
- sprout-runc: the worker's budget applies to sock back-ends only, so B is kept by a count:
  at most (B - fixed reserve) / (sandbox + backend) sandboxes at once (`max_total`), a runc
  container each.
- sprout-gvisor: every site may keep its sandbox (`max_total`), since an idle site's pod is
  parked to disk (`[gvisor] park_after_ms`) and holds no memory, nor a database connection
  (sprout.store lets it go at the park); the running pods are kept within the same share of
  B as sprout's sandboxes (`[gvisor] resident_mb`, scaled for the connection each running
  site holds), parking the idle ones least recently used first to make room. The worker
  moves every pod's processes into its own cpuset group, so the runner's memory and CPU
  columns count them.
- conventional, conventional-ondemand: nothing inside adapts to the budget (every gunicorn
  keeps its workers; uWSGI's Emperor starts a site's vassal at its first request whatever
  the others hold, and stops it only when idle), so the budget is a limit: on cgroup v1 a
  memory group of B MiB, named as the confinement and made below the memory cgroup fleet-up
  runs in (so whatever limits that one has still hold), holds every process (they join it
  with the cpuset group; vassals are the Emperor's children, so in it too); a fleet that
  does not fit is OOM-killed during start-up, which fleet-up reports as a failure naming B
  (on demand: later, at whichever site's start finds the memory used).

On cgroup v1 the confinement is a cpuset group only, and the Sprout worker makes its own
cgroups at the root of the other hierarchies (memory, pids, cpu, freezer): its sandboxes
would leave any deployment memory group, so for the Sprout stacks on v1 no memory group is
made (the worker is not changed for it); the worker's budget and measurement stand in. On v2
the worker makes its cgroups inside the confinement (`cgroups.v2_root`), so there B is also
`memory.max` of the confinement group, for every stack. Sandboxes stay in the cpuset group
on v1 (the worker does not use the cpuset controller; runc containers are moved back into
it, runc.rs), so walking the printed cgroup finds every process.
"""

import ctypes
import platform
import statistics
import time
from pathlib import Path

from . import confine, fleet_conventional, fleet_ondemand, fleet_sprout
from .procs import DeployError

MIN_MEMORY_MB = 512
LIMITED_STACKS = ("conventional", "conventional-ondemand")  # the budget is a memory cgroup's limit

# Measured on this VM (2 cores, Debian 12, cgroup v1) with each site's home page served, MiB.
WORKER_MB = 16  # the worker alone (PSS 11-25 at 3-1,000 sites; Zygotes and sandboxes are in its budget)
PG_BASE_MB = 32  # the postmaster and its helpers, shared_buffers aside (PSS 28 at 3 sites)
PG_BACKEND_MB = 10  # one backend after Olio's pages (PSS 9 among 3, 4-5 among 40-1,000)
SANDBOX_MB = 25  # one Olio sandbox forked from the Zygote (its cgroup 16-25, PSS 17-24)
RUNC_SANDBOX_MB = 45  # one Olio runc container, its own interpreter (PSS 34-40)
# One Olio site's gVisor sandbox: PSS 118 after five page views with one handler, its spares
# let go (Sentry 75, gofer 7, the Zygote's and handler's stubs 35; each address space once),
# about 22 more while its two spares are up after a cold start, 178 with three handlers; the
# template's container created ahead (25) is shared. 2026-11-27, `sprout olio up --stack
# sprout-gvisor`. (245, measured earlier, counted each systrap stub twice.)
GVISOR_SANDBOX_MB = 150


def memory_plan(stack, memory_mb, sites, cores, per_worker=None, stack_options=None):
    """How B is divided (see the module's docstring): JSON-able. `workers` is each site's app
    processes (gunicorn's sync workers, or a vassal's processes when its site is busy)."""
    shared_buffers = memory_mb // 8
    cache_mb = min(64, max(16, memory_mb // 32))
    plan = {"memory_mb": memory_mb, "cache_mb": cache_mb, "pg_shared_buffers_mb": shared_buffers}
    if stack == "conventional":
        per_worker = per_worker or fleet_conventional.users_per_worker()
        workers = {s.name: fleet_conventional.workers_for(s.peak_users, cores, per_worker) for s in sites}
        plan.update(users_per_worker=per_worker, workers=workers, max_connections=sum(workers.values()) + 20)
        return plan
    if stack == "conventional-ondemand":
        workers, per_worker = fleet_ondemand.processes_per_site(sites, cores, stack_options, per_worker)
        # Every vassal's processes at once, each with its database connection: the most there can be.
        plan.update(users_per_worker=per_worker, workers=workers, max_connections=sum(workers.values()) + 20)
        return plan
    fixed = PG_BASE_MB + shared_buffers + cache_mb + WORKER_MB
    room = memory_mb - fixed
    if room < 4 * SANDBOX_MB:
        raise DeployError(f"--memory-mb {memory_mb}: PostgreSQL, the cache and the worker take about {fixed} MiB of it, "
                          f"leaving too little for sandboxes; give at least {fixed + 4 * SANDBOX_MB + PG_BACKEND_MB * 4}")
    want = len(sites) + fleet_sprout.MAX_PER_LAMBDA
    if stack == "sprout":
        budget = room * SANDBOX_MB // (SANDBOX_MB + PG_BACKEND_MB)
        plan.update(budget_mb=budget, reserve_mb=memory_mb - budget, sandbox_mb=SANDBOX_MB, max_total=want)
    elif stack == "sprout-gvisor":
        resident = room * GVISOR_SANDBOX_MB // (GVISOR_SANDBOX_MB + PG_BACKEND_MB)
        plan.update(budget_mb=None, resident_mb=resident, reserve_mb=memory_mb - resident, sandbox_mb=GVISOR_SANDBOX_MB,
                    max_total=want)
    else:
        sandbox_mb = RUNC_SANDBOX_MB
        fit = room // (sandbox_mb + PG_BACKEND_MB)
        plan.update(budget_mb=None, reserve_mb=fixed, sandbox_mb=sandbox_mb, max_total=max(1, min(want, fit)))
    plan["max_connections"] = plan["max_total"] + 20
    return plan


class FleetConfinement(confine.Confinement):
    """The confinement, and the budget's memory limit: on v1 a memory group named as the
    confinement below the memory cgroup fleet-up runs in (so whatever limits that one
    still holds), joined with the cpuset group; on v2 memory.max of the confinement group."""

    memory_dir = None  # the memory group (from the record for down and status)
    memory_procs = None  # set once processes are to join it

    def limit_memory(self, mb):
        """Limit the memory of everything that enters from now on to `mb` MiB; the group, or
        None where there is no memory controller."""
        limit = str(mb << 20)
        if self.kind == "v2":
            confine._write(self.group / "memory.max", limit)
            self.memory_dir = self.group
            return self.group
        point = next((p for p, fstype, opts in confine._mounts() if fstype == "cgroup" and "memory" in opts), None)
        if self.kind != "v1" or point is None:
            return None
        own = next((line.split(":", 2)[2].strip() for line in Path("/proc/self/cgroup").read_text().splitlines()
                    if "memory" in line.split(":", 2)[1].split(",")), "/")
        group = Path(point) / own.lstrip("/") / self.name
        group.mkdir(exist_ok=True)
        confine._write(group / "memory.limit_in_bytes", limit)
        self.memory_dir, self.memory_procs = group, group / "cgroup.procs"
        return group

    def enter(self):
        if self.memory_procs is not None:
            with open(self.memory_procs, "w") as f:
                f.write("0")
        super().enter()

    def oom_kills(self):
        """Processes the memory limit killed (v1 memory.oom_control, v2 memory.events)."""
        name = "memory.oom_control" if self.kind == "v1" else "memory.events"
        try:
            for line in (self.memory_dir / name).read_text().splitlines():
                if line.startswith("oom_kill "):
                    return int(line.split()[1])
        except (OSError, TypeError):
            pass
        return 0

    def destroy(self, grace=10.0):
        strays = super().destroy(grace)
        group = self.memory_dir
        for _ in range(50):
            try:
                if group is not None and group.is_dir():
                    group.rmdir()
                break
            except OSError:
                time.sleep(0.1)
        else:
            raise DeployError(f"cannot remove the memory cgroup {group}")
        return strays


def pss_mib(pids):
    """(PSS of `pids` in MiB, how many were measured): /proc/PID/smaps_rollup, each address
    space once (gVisor's systrap stubs share theirs two to one, and each shows all of it)."""
    pss, _, counted = _rollup_totals(pids)
    return round(pss / 1024, 1), counted


def _rollup_totals(pids):
    """(PSS, private memory in KiB, processes read) of `pids`, each address space counted once."""
    pss = private = counted = 0
    spaces = {}  # rollup range -> pids of the address spaces counted, in the kernel's order
    for pid in pids:
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                text = f.read()
        except OSError:
            continue
        fields = {k: int(v.split()[0]) for k, _, v in (line.partition(":") for line in text.splitlines()[1:]) if v.strip()}
        if "Pss" not in fields:
            continue
        counted += 1
        if _another_address_space(spaces.setdefault(text.partition("\n")[0], []), pid):
            pss += fields["Pss"]
            private += fields.get("Private_Clean", 0) + fields.get("Private_Dirty", 0)
    return pss, private, counted


def site_memory(pids):
    """What the sites hold, by the processes among `pids` that serve one site (a Sprout
    sandbox: a lean sandbox's handler, a runc container, a gVisor pod; a gunicorn's master and
    workers; a uWSGI vassal's) and the database connections: how many of each there are, and
    the median of their PSS and of their private memory (pages no other process maps), MiB.
    The rest (PostgreSQL's own processes, the cache, nginx, the worker, Zygotes, spares, the
    Emperor) is shared by every site."""
    units, connections = {}, []
    for pid in pids:
        unit = _site_unit(pid)
        if unit == "db":
            connections.append([pid])
        elif unit is not None:
            units.setdefault(unit, []).append(pid)

    def summary(groups):
        measured = [m for m in map(_rollup_totals, groups) if m[2]]
        if not measured:
            return {"count": 0, "pss_mb": None, "private_mb": None}
        return {"count": len(measured), "pss_mb": round(statistics.median(m[0] for m in measured) / 1024, 1),
                "private_mb": round(statistics.median(m[1] for m in measured) / 1024, 1)}

    return {"site_processes": summary(units.values()), "db_connections": summary(connections)}


def _site_unit(pid):
    """The site unit `pid` belongs to (see `site_memory`), "db" for a database connection, or None."""
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        cgroups = Path(f"/proc/{pid}/cgroup").read_text()
    except OSError:
        return None
    if command.startswith("postgres: olio olio_"):
        return "db"
    if " -m gunicorn -c " in command and ".gunicorn.py" in command:  # a site's master and workers (fleet_conventional)
        return "gunicorn " + command.split(".gunicorn.py", 1)[0].rsplit("/", 1)[-1]
    if command.startswith("olio-") and " uWSGI " in command:
        return "vassal " + command.split(" ", 1)[0]
    memory = next((line.split(":", 2)[2] for line in cgroups.splitlines() if line.split(":", 2)[1] in ("memory", "")), "")
    parent, _, last = memory.rstrip().rpartition("/")
    if last.startswith("sb-") or last.startswith("pod-") or parent.endswith("-runc"):
        return "sandbox " + memory
    return None


_KCMP = {"x86_64": 312, "aarch64": 272}.get(platform.machine())
_libc = ctypes.CDLL(None, use_errno=True)


def _another_address_space(counted, pid):
    """Whether `pid`'s address space is none of `counted`'s (kept in kcmp(2)'s order, where
    it is then placed); True where the kernel cannot compare."""
    low, high = 0, len(counted)
    while low < high:
        middle = (low + high) // 2
        order = _libc.syscall(_KCMP, counted[middle], pid, 1, 0, 0) if _KCMP else -1  # KCMP_VM
        if order == 0:
            return False
        if order not in (1, 2):
            return True
        low, high = (middle + 1, high) if order == 1 else (low, middle)
    counted.insert(low, pid)
    return True
