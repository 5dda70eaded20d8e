"""Synthetic packages for SOCK's scalability experiment (figure 20), seeded and reproducible.

A universe of N packages (100,000 by default), `synth-<rank>==1.0`, whose popularity follows
a Zipf distribution (s = 2.5). Each package's dependencies, import cost and size are drawn
from a generator seeded by (seed, rank), so every package is defined whether or not it is
written out:

* dependencies, like PyPI's: a Poisson(0.8) number (at most 4) of more popular packages,
  chosen by popularity;
* import cost, like real packages': CPU time log-normal around 15 ms (1-300 ms) and memory
  log-normal around 1.5 MiB (0.1-40 MiB), burned and touched when the module is imported;
* size on disk: the module, its bytecode and a data file of a quarter of its memory.

Handlers import 1-3 distinct packages drawn by popularity; each lists its full pinned
closure (pip-compile style), so the worker resolves nothing. The packages some handler's
closure reaches are written straight into the install cache's layout (what `pip install
--no-deps --target` leaves, with Sprout's .sprout-package.json), as if pre-installed (SOCK
pre-installed all of them); the rest of the universe is never imported by anyone.

usage: synthetic_packages.py --cache CACHE_DIR --out manifest.json [--handlers 100,500,...]
                             [--universe 100000] [--seed 1]
"""

import argparse
import bisect
import compileall
import json
import math
import os
import random
import time

ZIPF_S = 2.5


class Universe:
    def __init__(self, size, seed):
        self.size = size
        self.seed = seed
        weights = [r ** -ZIPF_S for r in range(1, size + 1)]
        total = 0.0
        self.cumulative = []
        for w in weights:
            total += w
            self.cumulative.append(total)

    def popular(self, rng, below=None):
        """A rank drawn by popularity (among ranks < below when given)."""
        top = self.cumulative[(below or self.size + 1) - 2]
        return bisect.bisect_left(self.cumulative, rng.random() * top) + 1

    def package(self, rank):
        rng = random.Random(self.seed * 1_000_003 + rank)
        deps = set()
        if rank > 1:
            wanted = min(4, poisson(rng, 0.8))
            for _ in range(wanted):
                deps.add(self.popular(rng, below=rank))
        cpu_ms = min(300.0, max(1.0, rng.lognormvariate(math.log(15), 1.0)))
        memory = int(min(40.0, max(0.1, rng.lognormvariate(math.log(1.5), 1.0))) * (1 << 20))
        return {"rank": rank, "deps": sorted(deps), "cpu_ms": round(cpu_ms, 2), "memory": memory}

    def closure(self, ranks):
        out, stack = set(), list(ranks)
        while stack:
            r = stack.pop()
            if r not in out:
                out.add(r)
                stack.extend(self.package(r)["deps"])
        return sorted(out)


def poisson(rng, mean):
    limit, k, p = math.exp(-mean), 0, 1.0
    while True:
        p *= rng.random()
        if p <= limit:
            return k
        k += 1


def name(rank):
    return f"synth-{rank}"


def module(rank):
    return f"synth_{rank}"


def write_package(installed, spec):
    rank = spec["rank"]
    key = f"{name(rank)}==1.0"
    root = os.path.join(installed, key)
    if os.path.exists(os.path.join(root, ".sprout-package.json")):
        return
    tmp = root + ".writing"
    pkg = os.path.join(tmp, module(rank))
    info = os.path.join(tmp, f"synth_{rank}-1.0.dist-info")
    os.makedirs(pkg, exist_ok=True)
    os.makedirs(info, exist_ok=True)
    imports = "".join(f"import {module(d)}\n" for d in spec["deps"])
    source = (
        f'"""Synthetic package {rank}: burns {spec["cpu_ms"]} ms of CPU and holds {spec["memory"]} bytes."""\n'
        f"{imports}import time as _time\n"
        f"_end = _time.process_time() + {spec['cpu_ms'] / 1000.0!r}\n"
        "while _time.process_time() < _end:\n    pass\n"
        f"MEMORY = bytearray({spec['memory']})\n"
        "for _i in range(0, len(MEMORY), 4096):\n    MEMORY[_i] = 1\n"
        f"RANK = {rank}\n"
    )
    with open(os.path.join(pkg, "__init__.py"), "w") as f:
        f.write(source)
    with open(os.path.join(pkg, "data.bin"), "wb") as f:
        f.write(os.urandom(spec["memory"] // 4))
    requires = [f"{name(d)}==1.0" for d in spec["deps"]]
    with open(os.path.join(info, "METADATA"), "w") as f:
        f.write("Metadata-Version: 2.1\n" f"Name: {name(rank)}\nVersion: 1.0\n" + "".join(f"Requires-Dist: {r}\n" for r in requires))
    with open(os.path.join(info, "top_level.txt"), "w") as f:
        f.write(module(rank) + "\n")
    compileall.compile_dir(pkg, quiet=1)
    size = files = 0
    for dirpath, _, names in os.walk(tmp):
        for n in names:
            size += os.stat(os.path.join(dirpath, n)).st_blocks * 512
            files += 1
    meta = {
        "key": key, "name": name(rank), "version": "1.0", "top_level": [module(rank)],
        "requires_dist": requires, "size_bytes": size, "files": files,
        "installed_at": int(time.time()), "install_ms": 0,
    }
    with open(os.path.join(tmp, ".sprout-package.json"), "w") as f:
        json.dump(meta, f)
    os.rename(tmp, root)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache", required=True, help="the install cache directory (its installed/ is filled)")
    parser.add_argument("--out", required=True, help="where to write the manifest (JSON)")
    parser.add_argument("--handlers", default="100,500,1000,10000")
    parser.add_argument("--universe", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()

    universe = Universe(args.universe, args.seed)
    counts = sorted(int(n) for n in args.handlers.split(","))
    rng = random.Random(args.seed)
    handlers = []
    for i in range(counts[-1]):
        picked = set()
        for _ in range(rng.randint(1, 3)):
            picked.add(universe.popular(rng))
        closure = universe.closure(picked)
        handlers.append({
            "name": f"h{i}",
            "imports": [module(r) for r in sorted(picked)],
            "requirements": [f"{name(r)}==1.0" for r in closure],
            # What package-aware routing hashes on (PASch): the import that costs the most.
            "largest": module(max(sorted(picked), key=lambda r: universe.package(r)["cpu_ms"])),
        })
    reached = sorted(set(r for h in handlers for r in universe.closure(int(m.split("_")[1]) for m in h["imports"])))
    installed = os.path.join(args.cache, "installed")
    os.makedirs(installed, exist_ok=True)
    specs = [universe.package(r) for r in reached]
    for spec in specs:
        write_package(installed, spec)
    manifest = {
        "seed": args.seed,
        "universe": args.universe,
        "zipf_s": ZIPF_S,
        "materialized": len(reached),
        "distinct_import_sets": {str(n): len({tuple(h["imports"]) for h in handlers[:n]}) for n in counts},
        "mean_import_cpu_ms": sum(s["cpu_ms"] for s in specs) / len(specs),
        "mean_import_memory_mb": sum(s["memory"] for s in specs) / len(specs) / (1 << 20),
        "handlers": handlers,
    }
    with open(args.out, "w") as f:
        json.dump(manifest, f)
    print(json.dumps({k: v for k, v in manifest.items() if k != "handlers"}))


if __name__ == "__main__":
    main()
