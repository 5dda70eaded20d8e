"""Elastic offload (docs/offload.md): sprout.map against Ray and multiprocessing.Pool, side by
side in one run, on the same CPUs.

Peers (each a row):
  sprout                   sprout.map over a deployed lambda on the worker at --url, the
                           worker sizing chunks itself (the default)
  sprout_unbatched         the same with chunk=1: every item an invocation of its own
  ray                      Ray (ray==2.60.0), a local cluster: ray.init(num_cpus=2)
  multiprocessing          multiprocessing.Pool(2).map(..., chunksize=1)
  multiprocessing_chunked  multiprocessing.Pool(2).map(...) with its default chunksize

Parts, for each peer:
  (a) no-op tasks: TASKS calls of `noop(x) -> x` at once (tasks per second, and the per-task
      overhead 1000 / tasks per second in ms), and ROUND_TRIPS calls one at a time (the median
      round trip of one task);
  (b) CPU tasks: CPU_TASKS calls of `spin(ms)`, a busy loop until time.process_time() has
      moved TASK_MS ms, at once: the makespan against the ideal CPU_TASKS * TASK_MS / CPUs.
Every answer is checked (a no-op returns its item; a spin reports the CPU time it used).
Parts (c), a tiled matmul against NumPy's, and (d), the worker's memory over a Matrix's
life, are bench/offload_matmul.py's (`--parts` picks them).

The task functions are the same code everywhere: the lambdas' f.py are made from their
source here (inspect.getsource) and deployed with the SDK.

This process pins itself (and so Ray's and the pool's processes, which it starts) to --cpus;
`sprout bench offload` starts the worker on the same CPUs, runs this, and writes
offload.json, .md and .png from its output. Without --url the Sprout peers are left out.
Ray is installed (`python3 -m pip install ray==2.60.0`) when `import ray` fails; a failed
install stops the run.

usage: offload.py OUT.json [--url URL] [--worker-dir DIR] [--cpus 0,1] [--peers a,b,...]
                           [--parts tasks,matmul] [--quick] [--rounds N] [--tasks N]
                           [--cpu-tasks N] [--round-trips N] [--matmul-n N] [--tile N]
"""

import argparse
import importlib
import inspect
import io
import json
import multiprocessing
import os
import platform
import statistics
import subprocess
import sys
import tarfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

RAY_REQUIREMENT = "ray==2.60.0"
PEERS = ["sprout", "sprout_unbatched", "ray", "multiprocessing", "multiprocessing_chunked"]
NOOP_LAMBDA = "offload-noop"
SPIN_LAMBDA = "offload-spin"


# ------------------------------------------------------------------------ the tasks


def noop(x):
    return x


def spin(ms):
    t0 = time.process_time()
    while time.process_time() - t0 < ms / 1000:
        pass
    return time.process_time() - t0


def lambda_source(fn):
    """A lambda's f.py running `fn` on its event: the same source as the local peers run."""
    return f"import time\n\n\n{inspect.getsource(fn)}\n\ndef f(event):\n    return {fn.__name__}(event)\n"


def log(message):
    print(f"offload: {message}", file=sys.stderr, flush=True)


def check_noop(items, results, peer):
    if list(results) != list(items):
        wrong = next(i for i, (a, b) in enumerate(zip(items, results)) if a != b) if len(results) == len(items) else None
        raise SystemExit(f"{peer}: the no-op tasks' results are not their items ({len(results)} for {len(items)}; first wrong: {wrong})")


def check_spin(results, n, ms, peer):
    if len(results) != n or any(not isinstance(r, float) or r < ms / 1000 for r in results):
        raise SystemExit(f"{peer}: the CPU tasks did not all report {ms} ms of CPU ({len(results)} results for {n})")


# ------------------------------------------------------------------------ the peers


class Peer:
    """setup(); noop_many(items) -> results; one(x) -> result; spin_many(n, ms) -> results; teardown()."""

    name = ""
    note = ""

    def setup(self):
        pass

    def teardown(self):
        pass


class SproutPeer(Peer):
    def __init__(self, name, url, chunk=None):
        import sprout

        self.name, self.url, self.chunk = name, url, chunk
        self.sprout = sprout
        self.client = sprout.Client(url, timeout=600)
        self.kwargs = {"client": self.client}
        if chunk is not None:
            params = inspect.signature(sprout.map).parameters
            key = next((k for k in ("chunk", "chunk_size", "chunksize") if k in params), None)
            if key is None:
                raise SystemExit(f"sprout.map{inspect.signature(sprout.map)} takes no chunk size: the unbatched row cannot be run")
            self.kwargs[key] = chunk
        extra = "".join(f", {k}={v!r}" for k, v in self.kwargs.items() if k != "client")
        self.note = f"sprout.map(name, items{extra}, client=sprout.Client(url))"

    def map(self, name, items):
        return list(self.sprout.map(name, items, **self.kwargs))

    def setup(self):
        # Both sandboxes of each lambda warm (keep_warm keeps them).
        self.map(NOOP_LAMBDA, list(range(2000)))
        self.map(SPIN_LAMBDA, [1] * 50)

    def noop_many(self, items):
        return self.map(NOOP_LAMBDA, items)

    def one(self, x):
        return self.map(NOOP_LAMBDA, [x])[0]

    def spin_many(self, n, ms):
        return self.map(SPIN_LAMBDA, [ms] * n)


def deploy(url):
    """Upload the two lambdas with the SDK (their f.py made from this file's functions)."""
    import sprout

    client = sprout.Client(url, timeout=600)
    for name, fn in ((NOOP_LAMBDA, noop), (SPIN_LAMBDA, spin)):
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
            data = lambda_source(fn).encode()
            info = tarfile.TarInfo("f.py")
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
        client.upload(name, buffer.getvalue())
        got = client.run(name, 1)
        if not (got == 1 if fn is noop else isinstance(got, float) and got >= 0.001):
            raise SystemExit(f"lambda {name} answered {got!r} to 1")


def ensure_ray():
    """Install Ray if `import ray` fails; a failed install stops the run. Checked in a child
    interpreter: this one never imports Ray (its processes fork pools)."""
    check = [sys.executable, "-c", "import ray; print(ray.__version__)"]
    found = subprocess.run(check, capture_output=True, text=True)
    if found.returncode == 0:
        return found.stdout.strip()
    log(f"`import ray` failed: installing {RAY_REQUIREMENT} (python3 -m pip install)")
    done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", RAY_REQUIREMENT], capture_output=True, text=True)
    if done.returncode != 0:
        why = done.stderr.strip()[-3000:]
        raise SystemExit(f"could not install {RAY_REQUIREMENT} for the Ray peer (pip exit {done.returncode}):\n{why}")
    found = subprocess.run(check, capture_output=True, text=True)
    if found.returncode != 0:
        raise SystemExit(f"{RAY_REQUIREMENT} installed but `import ray` fails:\n{found.stderr.strip()[-3000:]}")
    return found.stdout.strip()


class RayPeer(Peer):
    name = "ray"

    def __init__(self, cpus):
        self.ray = importlib.import_module("ray")
        self.cpus = cpus
        self.note = f"ray {self.ray.__version__}: ray.init(num_cpus={cpus}, include_dashboard=False); ray.get([f.remote(x) for x in items])"

    def setup(self):
        ray = self.ray
        ray.init(num_cpus=self.cpus, include_dashboard=False, log_to_driver=False)
        self.noop, self.spin = ray.remote(noop), ray.remote(spin)
        # Its workers started and warm.
        ray.get([self.noop.remote(i) for i in range(2000)])
        ray.get([self.spin.remote(1) for _ in range(50)])

    def noop_many(self, items):
        return self.ray.get([self.noop.remote(x) for x in items])

    def one(self, x):
        return self.ray.get(self.noop.remote(x))

    def spin_many(self, n, ms):
        return self.ray.get([self.spin.remote(ms) for _ in range(n)])

    def teardown(self):
        self.ray.shutdown()


class PoolPeer(Peer):
    def __init__(self, name, processes, chunksize):
        self.name, self.processes, self.chunksize = name, processes, chunksize
        self.method = multiprocessing.get_start_method()
        size = "chunksize=1" if chunksize else "its default chunksize"
        self.note = f"multiprocessing.Pool({processes}) ({self.method}): pool.map(f, items) with {size}"

    def setup(self):
        self.pool = multiprocessing.Pool(self.processes)
        self.pool.map(noop, range(2000), chunksize=self.chunksize)
        self.pool.map(spin, [1] * 50, chunksize=self.chunksize)

    def noop_many(self, items):
        return self.pool.map(noop, items, chunksize=self.chunksize)

    def one(self, x):
        return self.pool.apply(noop, (x,)) if self.chunksize else self.pool.map(noop, [x])[0]

    def spin_many(self, n, ms):
        return self.pool.map(spin, [ms] * n, chunksize=self.chunksize)

    def teardown(self):
        self.pool.close()
        self.pool.join()


# ------------------------------------------------------------------------ measuring


def measure(peer, plan):
    """One round of every part for `peer`: its figures."""
    t0 = time.perf_counter()
    peer.setup()
    setup_s = time.perf_counter() - t0
    try:
        items = list(range(plan["tasks"]))
        t0 = time.perf_counter()
        results = peer.noop_many(items)
        noop_s = time.perf_counter() - t0
        check_noop(items, results, peer.name)
        log(f"  {peer.name}: {len(items)} no-op tasks in {noop_s:.3f} s ({len(items) / noop_s:,.0f}/s)")
        trips = []
        for i in range(plan["round_trips"]):
            t0 = time.perf_counter()
            got = peer.one(i)
            trips.append((time.perf_counter() - t0) * 1000)
            if got != i:
                raise SystemExit(f"{peer.name}: a no-op's round trip returned {got!r} for {i}")
        log(f"  {peer.name}: round trip median {statistics.median(trips):.3f} ms of {len(trips)}")
        n, ms = plan["cpu_tasks"], plan["task_ms"]
        t0 = time.perf_counter()
        spun = peer.spin_many(n, ms)
        makespan = time.perf_counter() - t0
        check_spin(spun, n, ms, peer.name)
        ideal = plan["ideal_s"]
        log(f"  {peer.name}: {n} CPU tasks of {ms} ms in {makespan:.3f} s ({makespan / ideal:.3f}x the ideal {ideal:.2f} s)")
    finally:
        peer.teardown()
    trips.sort()
    return {
        "setup_s": setup_s,
        "noop_s": noop_s,
        "noop_tasks_per_s": len(items) / noop_s,
        "round_trip_ms": statistics.median(trips),
        "round_trip_p90_ms": trips[min(len(trips) - 1, int(0.9 * len(trips)))],
        "cpu_makespan_s": makespan,
        "cpu_seconds_in_tasks": sum(spun),
    }


def summarize(rounds, plan, note):
    """A peer's figures: the median over its rounds, and every round's."""
    med = lambda key: statistics.median(r[key] for r in rounds)
    tps = med("noop_tasks_per_s")
    makespan = med("cpu_makespan_s")
    return {
        "noop_tasks_per_s": tps,
        "task_overhead_ms": 1000 / tps,
        "round_trip_ms": med("round_trip_ms"),
        "cpu_makespan_s": makespan,
        "cpu_makespan_ratio": makespan / plan["ideal_s"],
        "matmul_s": None,
        "how": note,
        "rounds": rounds,
    }


def make_peer(name, url, cpus):
    if name == "sprout":
        return SproutPeer(name, url)
    if name == "sprout_unbatched":
        return SproutPeer(name, url, chunk=1)
    if name == "ray":
        return RayPeer(len(cpus))
    if name == "multiprocessing":
        return PoolPeer(name, len(cpus), 1)
    if name == "multiprocessing_chunked":
        return PoolPeer(name, len(cpus), None)
    raise SystemExit(f"unknown peer {name!r}; the peers are {', '.join(PEERS)}")


def measure_in_child(name, url, plan):
    """One round of one peer in a fresh interpreter (nothing of another peer left in it: no
    Ray threads when a pool forks); its figures and how it was called."""
    cmd = [sys.executable, os.path.abspath(__file__), "-", "--measure", name, "--plan", json.dumps(plan)]
    if url:
        cmd += ["--url", url]
    done = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
    if done.returncode != 0:
        raise SystemExit(f"measuring {name} failed (exit {done.returncode})")
    return json.loads(done.stdout)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", help="where to write the peers' figures (JSON)")
    ap.add_argument("--url", help="the Sprout worker (without it the Sprout peers are left out)")
    ap.add_argument("--cpus", default="0,1", help="CPUs for this process and every peer's processes")
    ap.add_argument("--peers", default=",".join(PEERS))
    ap.add_argument("--quick", action="store_true", help="fewer tasks, one round")
    ap.add_argument("--rounds", type=int, help="rounds of every peer, the median reported (default 3; --quick 1)")
    ap.add_argument("--tasks", type=int, help="no-op tasks (default 10,000; --quick 1,000)")
    ap.add_argument("--cpu-tasks", type=int, help="CPU tasks (default 1,000; --quick 200)")
    ap.add_argument("--task-ms", type=float, default=10.0, help="CPU milliseconds per CPU task")
    ap.add_argument("--round-trips", type=int, help="one-at-a-time calls (default 200; --quick 50)")
    ap.add_argument("--parts", default="tasks,matmul", help="tasks: (a) and (b); matmul: (c) and (d)")
    ap.add_argument("--matmul-n", type=int, help="the matmul's N (default 4096; --quick 2048)")
    ap.add_argument("--tile", type=int, default=1024, help="the matmul's tile edge")
    ap.add_argument("--worker-dir", help="the worker's directory (its leases' files are weighed in (d))")
    ap.add_argument("--measure", help=argparse.SUPPRESS)  # one round of one peer (a child's work)
    ap.add_argument("--plan", help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.measure:
        plan = json.loads(args.plan)
        os.sched_setaffinity(0, plan["cpus"])
        peer = make_peer(args.measure, args.url, plan["cpus"])
        json.dump({"figures": measure(peer, plan), "how": peer.note}, sys.stdout)
        return

    cpus = sorted({int(c) for c in args.cpus.split(",") if c.strip()})
    os.sched_setaffinity(0, cpus)
    peers = [p.strip() for p in args.peers.split(",") if p.strip()]
    unknown = [p for p in peers if p not in PEERS]
    if unknown:
        raise SystemExit(f"unknown peers {unknown}; the peers are {', '.join(PEERS)}")
    if not args.url:
        if any(p.startswith("sprout") for p in peers):
            log("no --url: the Sprout peers are left out")
        peers = [p for p in peers if not p.startswith("sprout")]
    plan = {
        "tasks": args.tasks or (1000 if args.quick else 10_000),
        "round_trips": args.round_trips or (50 if args.quick else 200),
        "cpu_tasks": args.cpu_tasks or (200 if args.quick else 1000),
        "task_ms": args.task_ms,
        "cpus": cpus,
        "rounds": args.rounds or (1 if args.quick else 3),
        "quick": args.quick,
    }
    plan["ideal_s"] = plan["cpu_tasks"] * plan["task_ms"] / 1000 / len(cpus)

    ray_version = ensure_ray() if "ray" in peers else None
    if any(p.startswith("sprout") for p in peers):
        log(f"deploying {NOOP_LAMBDA} and {SPIN_LAMBDA} to {args.url} with the SDK")
        deploy(args.url)

    parts = {p.strip() for p in args.parts.split(",") if p.strip()}
    if parts - {"tasks", "matmul"}:
        raise SystemExit(f"unknown parts {sorted(parts - {'tasks', 'matmul'})}; the parts are tasks, matmul")
    rounds = {name: [] for name in peers}
    notes = {}
    for r in range(plan["rounds"] if "tasks" in parts else 0):
        for name in peers:
            log(f"round {r + 1}/{plan['rounds']}: {name}")
            got = measure_in_child(name, args.url, plan)
            rounds[name].append(got["figures"])
            notes[name] = got["how"]
    matmul = {}
    if "matmul" in parts:
        import offload_matmul

        plan["matmul"] = {"n": args.matmul_n or (2048 if args.quick else 4096), "tile": args.tile, "cpus": cpus,
                          "rounds": plan["rounds"], "url": args.url, "worker_dir": args.worker_dir}
        matmul = offload_matmul.run({"numpy", *peers}, plan["matmul"])
    figures = {name: summarize(rounds[name], plan, notes[name]) if rounds[name] else {} for name in peers}
    for name, got in matmul.items():
        figures.setdefault(name, {})["matmul_s"] = got["matmul_s"]
    out = {
        "plan": plan,
        "peers": figures,
        "matmul": matmul,
        "versions": {
            "python": platform.python_version(),
            "ray": ray_version,
            "numpy": importlib.import_module("numpy").__version__ if matmul else None,
            "multiprocessing_start_method": multiprocessing.get_start_method(),
        },
        "affinity": sorted(os.sched_getaffinity(0)),
    }
    with open(args.out, "w") as f:
        json.dump(out, f, indent=2)
        f.write("\n")


if __name__ == "__main__":
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # no reports sent anywhere
    main()
