"""Where the time goes at equal load: CPU milliseconds per operation by part of the deployment
(Olio's Python, the front end, PostgreSQL, the cache), Sprout against the conventional stack,
at every user count both searches ran. CPU is every process of the deployment over the whole
run (from its cgroup, /proc), divided by the steady state's operations (the method of the
README's earlier table). Writes breakdown.md and breakdown.json beside the searches.

usage: python3 bench/cloudstone_breakdown.py [bench/results/cloudstone]
"""

import json
import sys
from pathlib import Path

from cloudstone_report import existing, interpreter_text, read_json

PARTS = (
    ("Olio's Python (sandboxes / gunicorn's workers)", ("python helper.py", "python -m gunicorn")),
    ("front end (Sprout worker / nginx)", ("sprout worker", "nginx")),
    ("PostgreSQL (backends, autovacuum, ...)", ("postgres",)),
    ("cache (Sprout cache / memcached)", ("sprout cache", "memcached")),
)


def part_of(kind):
    for name, prefixes in PARTS:
        if any(kind == p or kind.startswith(p + ":") for p in prefixes):
            return name
    return "other"


def per_operation(run):
    ops = sum(o["count"] + o["errors"] for o in run["operations"].values())
    by = {}
    for kind, sec in (run["resources"].get("cpu_seconds_by_process") or {}).items():
        by[part_of(kind)] = by.get(part_of(kind), 0.0) + sec
    return {k: 1000 * v / ops for k, v in by.items()}, ops


def runs(search_dir):
    """{users: [run.json, ...]} of a search (repeats included; a run.json may be kept gzipped)."""
    found = {}
    for path in sorted(filter(None, (existing(d / "run.json") for d in Path(search_dir).glob("run-*")))):
        run = read_json(path)
        found.setdefault(run["users"], []).append((path, run))
    return found


def main():
    root = Path(sys.argv[1] if len(sys.argv) > 1 else "bench/results/cloudstone")
    a, b = runs(root / "sprout"), runs(root / "conventional")
    common = sorted(set(a) & set(b))
    if not common:
        raise SystemExit(f"no user count was run by both searches under {root}")
    md = ["CPU milliseconds per operation at equal load (every process of the deployment; "
          "`python3 bench/cloudstone_breakdown.py`). Each count is one run of each search, taken minutes or hours "
          "apart: on this shared host an operation's CPU drifts by up to 15% between runs, so single levels "
          "disagree; `python3 bench/cloudstone_equal_load.py` measures the difference in alternating rounds.", ""]
    result = {"levels": []}
    for users in common:
        level = {"users": users, "runs": {}}
        for stack, found in (("sprout", a), ("conventional", b)):
            # The first run at this count (a repeat would be a second sample of the same load).
            path, run = found[users][0]
            parts, ops = per_operation(run)
            samples = run["utilization"]
            busy = sum(s["cpu_busy"][c] for s in samples for c in run["sut_cpus"]) / max(1, len(samples) * len(run["sut_cpus"]))
            level["runs"][stack] = {"run": str(path), "ops_per_s": run["ops_per_s"], "operations": ops, "cpu_ms_per_op": parts,
                                    "sla1": run["sla1_passed"], "sla2": run["sla2_passed"], "sut_busy": busy,
                                    "interpreter": interpreter_text(run.get("interpreter"))}
        s, c = level["runs"]["sprout"], level["runs"]["conventional"]
        md += [f"**{users} users** (Sprout {s['ops_per_s']:.1f} ops/s, conventional {c['ops_per_s']:.1f}):", "",
               "| CPU-ms per operation | Sprout | conventional | Sprout ÷ conventional |", "|---|---:|---:|---:|"]
        for name in [p for p, _ in PARTS] + ["other"]:
            x, y = s["cpu_ms_per_op"].get(name, 0.0), c["cpu_ms_per_op"].get(name, 0.0)
            if x or y:
                md.append(f"| {name} | {x:.2f} | {y:.2f} | {x / y:.2f} |" if y else f"| {name} | {x:.2f} | {y:.2f} | |")
        x, y = sum(s["cpu_ms_per_op"].values()), sum(c["cpu_ms_per_op"].values())
        md += [f"| **all** | **{x:.2f}** | **{y:.2f}** | **{x / y:.2f}** |", ""]
        level["all"] = {"sprout": x, "conventional": y, "ratio": x / y}
        result["levels"].append(level)
    (root / "breakdown.md").write_text("\n".join(md) + "\n")
    (root / "breakdown.json").write_text(json.dumps(result, indent=2) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
