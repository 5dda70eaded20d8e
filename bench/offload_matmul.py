"""Parts (c) and (d) of `sprout bench offload` (bench/offload.py runs them): a tiled float64
matmul of two N x N matrices, side by side on the same CPUs, and the worker's memory over a
Matrix's life.

Peers (each measured in a fresh interpreter pinned to the CPUs):
  numpy            `a @ b` in one process, its BLAS on every CPU (the yardstick)
  sprout           sprout.elastic: A and B uploaded as tiles to a Context of one part per
                   CPU (not timed: `upload_s`), then `A @ B` timed (each part computes its
                   output tiles with one BLAS thread, reading its inputs by mmap); reading
                   C back is `fetch_s`
  multiprocessing  multiprocessing.Pool(CPUs): A and B as memory-mapped .npy files in
                   /dev/shm (not timed), each task one output tile written into a shared
                   memory-mapped C, one BLAS thread per process
  ray              Ray: A's and B's tiles put in its object store (not timed), one task per
                   output tile, its result fetched into the driver
Every peer's C is checked at 64 sampled entries against a dot product of A's row and B's
column.

(d), with the sprout peer: the PSS of the worker's process and every process below it, plus
the bytes of the leases' files, sampled every 0.1 s from before a Matrix's context is made
(after one made and released to warm the elastic lambda's Zygote) to the moment it is back
within max(2%, 8 MiB) of where it was, once the context is released and collected;
`memory_back_s` is that moment after the release.
"""

import gc
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

PEERS = ["numpy", "sprout", "multiprocessing", "ray"]
SAMPLES = 64
MEMORY_TOLERANCE = (0.02, 8 << 20)
MEMORY_WAIT_S = 15.0


def log(message):
    print(f"offload: {message}", file=sys.stderr, flush=True)


def matrices(n):
    rng = np.random.default_rng(1)
    return rng.standard_normal((n, n)), rng.standard_normal((n, n))


def check(c, a, b, peer):
    rng = np.random.default_rng(2)
    worst = 0.0
    for i, j in rng.integers(0, a.shape[0], size=(SAMPLES, 2)):
        want = float(a[i, :] @ b[:, j])
        worst = max(worst, abs(float(c[i, j]) - want))
    if worst > 1e-8 * a.shape[0]:
        raise SystemExit(f"{peer}: C differs from A @ B by {worst} at a sampled entry")
    return worst


def blas_threads(n):
    from sprout.elastic_parts import _set_blas_threads

    _set_blas_threads(n)


def tile_slices(n, t):
    return [slice(s, min(s + t, n)) for s in range(0, n, t)]


# ------------------------------------------------------------------------ peers


def run_numpy(plan):
    a, b = matrices(plan["n"])
    blas_threads(len(plan["cpus"]))
    a @ b  # warm
    t0 = time.perf_counter()
    c = a @ b
    took = time.perf_counter() - t0
    return {"matmul_s": took, "max_error": check(c, a, b, "numpy"), "how": f"a @ b, {len(plan['cpus'])} BLAS threads"}


def _pool_init():
    blas_threads(1)


def _pool_tile(job):
    paths, (i, j), t = job
    a, b = np.load(paths["a"], mmap_mode="r"), np.load(paths["b"], mmap_mode="r")
    c = np.load(paths["c"], mmap_mode="r+")
    n = a.shape[0]
    rows, cols = tile_slices(n, t)[i], tile_slices(n, t)[j]
    acc = None
    for k in tile_slices(n, t):
        part = a[rows, k] @ b[k, cols]
        acc = part if acc is None else acc + part
    c[rows, cols] = acc
    c.flush()


def run_multiprocessing(plan):
    import multiprocessing

    n, t, cpus = plan["n"], plan["tile"], len(plan["cpus"])
    a, b = matrices(n)
    with tempfile.TemporaryDirectory(dir="/dev/shm") as shm:
        paths = {k: os.path.join(shm, f"{k}.npy") for k in "abc"}
        t0 = time.perf_counter()
        np.save(paths["a"], a)
        np.save(paths["b"], b)
        np.lib.format.open_memmap(paths["c"], mode="w+", dtype=np.float64, shape=(n, n)).flush()
        upload = time.perf_counter() - t0
        grid = len(tile_slices(n, t))
        jobs = [(paths, (i, j), t) for i in range(grid) for j in range(grid)]
        with multiprocessing.Pool(cpus, initializer=_pool_init) as pool:
            pool.map(_pool_init_probe, range(cpus))
            t0 = time.perf_counter()
            pool.map(_pool_tile, jobs, chunksize=1)
            took = time.perf_counter() - t0
        c = np.load(paths["c"], mmap_mode="r")
        worst = check(c, a, b, "multiprocessing")
    return {"matmul_s": took, "upload_s": upload, "max_error": worst,
            "how": f"Pool({cpus}).map over {len(jobs)} output tiles of {t}, A, B, C memory-mapped in /dev/shm"}


def _pool_init_probe(_):
    return os.getpid()


def run_ray(plan):
    import ray

    n, t, cpus = plan["n"], plan["tile"], len(plan["cpus"])
    a, b = matrices(n)
    ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"OPENBLAS_NUM_THREADS": "1"}})
    try:
        @ray.remote
        def tile_matmul(*tiles):  # A's row of tiles, then B's column: refs resolved by Ray
            half = len(tiles) // 2
            acc = None
            for x, y in zip(tiles[:half], tiles[half:]):
                part = x @ y
                acc = part if acc is None else acc + part
            return acc

        slices = tile_slices(n, t)
        t0 = time.perf_counter()
        a_refs = [[ray.put(np.ascontiguousarray(a[r, k])) for k in slices] for r in slices]
        b_refs = [[ray.put(np.ascontiguousarray(b[k, c])) for c in slices] for k in slices]
        upload = time.perf_counter() - t0
        ray.get([tile_matmul.remote(np.ones((2, 2)), np.ones((2, 2))) for _ in range(cpus)])  # workers up
        t0 = time.perf_counter()
        refs = {(i, j): tile_matmul.remote(*a_refs[i], *[b_refs[k][j] for k in range(len(slices))])
                for i in range(len(slices)) for j in range(len(slices))}
        tiles = dict(zip(refs, ray.get(list(refs.values()))))
        took = time.perf_counter() - t0
        c = np.empty((n, n))
        for (i, j), tile in tiles.items():
            c[slices[i], slices[j]] = tile
        worst = check(c, a, b, "ray")
    finally:
        ray.shutdown()
    return {"matmul_s": took, "upload_s": upload, "max_error": worst,
            "how": f"ray {ray.__version__}: ray.put tiles of {t}, one task per output tile, ray.get of C's tiles"}


# ------------------------------------------------------------------------ sprout, and memory


def descendants(root):
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rpartition(")")[2].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def pss_bytes(pid):
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) << 10
    except OSError:
        pass
    return 0


class WorkerMemory:
    """The worker's memory: PSS of it and its descendants, and the leases' files."""

    def __init__(self, client, worker_dir):
        self.pid = int(client._check(client._call("GET", "/pid")).body)
        self.leases = os.path.join(worker_dir, "leases") if worker_dir else None
        self.series = []
        self._stop = threading.Event()

    def files_bytes(self):
        total = 0
        if self.leases:
            for root, _dirs, files in os.walk(self.leases):
                for name in files:
                    try:
                        total += os.lstat(os.path.join(root, name)).st_size
                    except OSError:
                        pass
        return total

    def sample(self):
        pss = sum(pss_bytes(p) for p in descendants(self.pid))
        return pss, self.files_bytes()

    def start(self, t0):
        def loop():
            while not self._stop.wait(0.1):
                pss, files = self.sample()
                self.series.append([round(time.perf_counter() - t0, 2), round(pss / 2**20, 1), round(files / 2**20, 1)])

        self._thread = threading.Thread(target=loop, daemon=True)
        self._thread.start()

    def stop(self):
        self._stop.set()
        self._thread.join()


def run_sprout(plan):
    import sprout
    from sprout.elastic import Context

    n, t, cpus = plan["n"], plan["tile"], len(plan["cpus"])
    client = sprout.Client(plan["url"], timeout=600)
    a, b = matrices(n)
    # Warm: the elastic lambda deployed, its Zygote built, its NumPy imported.
    with Context(parts=cpus, client=client, tile=t) as warm:
        m = warm.random((t, t))
        (m @ m).sum()
    del warm, m
    gc.collect()
    time.sleep(2)
    memory = WorkerMemory(client, plan.get("worker_dir"))
    before = sum(memory.sample())
    t_start = time.perf_counter()
    memory.start(t_start)
    events = {}
    ctx = Context(parts=cpus, client=client, tile=t)
    t0 = time.perf_counter()
    A, B = ctx.from_numpy(a), ctx.from_numpy(b)
    upload = time.perf_counter() - t0
    events["uploaded"] = round(time.perf_counter() - t_start, 2)
    t0 = time.perf_counter()
    C = A @ B
    took = time.perf_counter() - t0
    events["multiplied"] = round(time.perf_counter() - t_start, 2)
    t0 = time.perf_counter()
    c = C.to_numpy()
    fetch = time.perf_counter() - t0
    worst = check(c, a, b, "sprout")
    during = max(p + f for _, p, f in memory.series) * 2**20 if memory.series else None
    del A, B, C, ctx
    gc.collect()  # the matrices' tiles deleted, the lease released (its sandboxes and directory)
    released = time.perf_counter()
    events["released"] = round(released - t_start, 2)
    back_s = None
    limit = before + max(MEMORY_TOLERANCE[0] * before, MEMORY_TOLERANCE[1])
    while time.perf_counter() - released < MEMORY_WAIT_S:
        if sum(memory.sample()) <= limit:
            back_s = time.perf_counter() - released
            break
        time.sleep(0.05)
    time.sleep(0.5)
    memory.stop()
    after = sum(memory.sample())
    return {
        "matmul_s": took, "upload_s": upload, "fetch_s": fetch, "max_error": worst,
        "how": f"sprout.elastic.Context(parts={cpus}, tile={t}): A @ B over {len(tile_slices(n, t)) ** 2} output tiles",
        "memory": {"before_mib": before / 2**20, "peak_mib": during / 2**20 if during else None, "after_mib": after / 2**20,
                   "back_s": back_s, "tolerance": f"max({MEMORY_TOLERANCE[0]:.0%}, {MEMORY_TOLERANCE[1] >> 20} MiB)",
                   "events": events, "series": memory.series,
                   "how": "PSS of the worker and every process below it, plus the bytes of its leases' files"},
    }


RUNNERS = {"numpy": run_numpy, "sprout": run_sprout, "multiprocessing": run_multiprocessing, "ray": run_ray}


def measure_in_child(peer, plan):
    cmd = [sys.executable, os.path.abspath(__file__), peer, json.dumps(plan)]
    done = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
    if done.returncode != 0:
        raise SystemExit(f"the matmul of {peer} failed (exit {done.returncode})")
    return json.loads(done.stdout)


def run(peers, plan):
    """Every peer's matmul, `plan["rounds"]` rounds each (the median's round reported)."""
    out = {}
    for peer in [p for p in PEERS if p in peers]:
        rounds = []
        for r in range(plan["rounds"]):
            log(f"matmul {plan['n']}x{plan['n']} in tiles of {plan['tile']}, round {r + 1}/{plan['rounds']}: {peer}")
            got = measure_in_child(peer, plan)
            log(f"  {peer}: {got['matmul_s']:.3f} s")
            rounds.append(got)
        rounds.sort(key=lambda g: g["matmul_s"])
        best = dict(rounds[len(rounds) // 2])
        best["rounds_s"] = sorted(g["matmul_s"] for g in rounds)
        out[peer] = best
    return out


if __name__ == "__main__":
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    peer_name, child_plan = sys.argv[1], json.loads(sys.argv[2])
    os.sched_setaffinity(0, child_plan["cpus"])
    json.dump(RUNNERS[peer_name](child_plan), sys.stdout)
