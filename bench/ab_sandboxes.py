"""A/B guard on `sprout bench sandboxes`: two builds (a binary, or a git revision built here
beside this checkout), the same benchmark in rounds alternating A and B (ABBA..., so a shared
host's drift falls on both), and each figure's B/A ratio of medians with its 95% interval, a
rank-sum p-value and a verdict (bench/ab_stats.py); JSON, a markdown table and a PNG plot.
With --guard it exits 1 when a figure got worse beyond --tolerance. Two configurations of one
build compare the same way: --a-set/--b-set give a side worker settings (`sprout bench
sandboxes --set`).

    python3 bench/ab_sandboxes.py --a-rev 62e4c5f --rounds 6 --guard \\
        --out bench/results/ab-sandboxes
    python3 bench/ab_sandboxes.py --a-set limits.cpu_weight_per=lambda --rounds 6
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import ab_stats
from cpus_awake import cpus_awake

REPO = Path(__file__).resolve().parents[1]
BUILDS = Path(os.environ.get("SPROUT_AB_BUILDS", "/var/tmp/sprout-ab"))

# What is compared: (name, where in the benchmark's JSON under backends.<backend>, better when).
# Figures a build does not report (an older one) are left out of the comparison.
FIGURES = [
    ("c1_cold_p50_ms", ("c1", "cold_p50_ms"), "lower"),
    ("c1_cold_p99_ms", ("c1", "cold_p99_ms"), "lower"),
    ("c1_cold_per_s", ("c1", "cold_per_s"), "higher"),
    ("c10_cold_per_s", ("c10", "cold_per_s"), "higher"),
    ("c10_cold_p99_ms", ("c10", "cold_p99_ms"), "lower"),
    ("paced_cold_p50_ms", ("paced", "cold_p50_ms"), "lower"),
    ("warm_p50_ms", ("warm_p50_ms",), "lower"),
    ("warm_p99_ms", ("warm_p99_ms",), "lower"),
    ("cpu_ms_per_cold_start", ("cpu_ms_per_cold_start",), "lower"),
    # gVisor's parking (its back-end only): a park, and a parked pod's next request.
    ("park_ms", ("park", "park_ms"), "lower"),
    ("restore_parked_p50_ms", ("park", "restore_parked_p50_ms"), "lower"),
]


def build_revision(rev):
    """The sprout binary of git revision `rev`, built once in its own worktree under BUILDS
    (reused while the revision's build is there): (binary, the worktree it runs in)."""
    sha = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--verify", f"{rev}^{{commit}}"],
                         check=True, capture_output=True, text=True).stdout.strip()
    tree = BUILDS / sha[:12]
    binary = tree / "target" / "release" / "sprout"
    if not (tree / ".git").exists():
        BUILDS.mkdir(parents=True, exist_ok=True)
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(tree), sha], check=True)
    if not binary.exists():
        print(f"building {rev} ({sha[:12]}) in {tree}", file=sys.stderr)
        subprocess.run(["cargo", "build", "--release", "--quiet", "--bin", "sprout"], cwd=tree, check=True)
    return binary, tree


def run_once(binary, cwd, backend, concurrency, seconds, scratch, settings=()):
    """One `sprout bench sandboxes` of `backend` (with worker `settings`): its figures (those
    it reports)."""
    out = tempfile.mkdtemp(prefix="ab-", dir=scratch)
    cmd = [str(binary), "bench", "sandboxes", "--backends", backend, "--concurrency", concurrency,
           "--seconds", str(seconds), "--out", out, *(f"--set={s}" for s in settings)]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, cwd=cwd)
    with open(os.path.join(out, "sandboxes.json")) as f:
        figures_in = json.load(f)["backends"][backend]
    figures = {}
    for name, path, _ in FIGURES:
        value = figures_in
        for key in path:
            value = value.get(key) if isinstance(value, dict) else None
        if isinstance(value, (int, float)):
            figures[name] = value
    return figures


def side(args, which):
    """(label, binary, cwd, settings) of side A or B."""
    binary, rev, settings = getattr(args, which), getattr(args, f"{which}_rev"), getattr(args, f"{which}_set")
    with_settings = "".join(f" --set {s}" for s in settings)
    if rev:
        built, tree = build_revision(rev)
        return f"{rev} ({built}){with_settings}", built, tree, settings
    binary = Path(binary or REPO / "target" / "release" / "sprout").resolve()
    return f"{binary}{with_settings}", binary, REPO, settings


# The benchmark counts its CPU's busy time, which the spinners keeping CPUs awake fill.
BUSY_FIGURES = {"cpu_ms_per_cold_start"}


def compare(rounds, tolerance, cpus_awake=False):
    """Each figure both sides reported in every round: its verdict (ab_stats.verdict). With
    the CPUs kept awake, none counting their busy time."""
    out = {}
    for name, _, better in FIGURES:
        if cpus_awake and name in BUSY_FIGURES:
            continue
        a = [r[name] for r in rounds["a"] if name in r]
        b = [r[name] for r in rounds["b"] if name in r]
        if len(a) == len(rounds["a"]) and len(b) == len(rounds["b"]) and a and b:
            out[name] = {**ab_stats.verdict(a, b, better, tolerance=tolerance), "better_when": better}
    return out


def markdown(result):
    lines = [f"A: `{result['a']}`; B: `{result['b']}`; `{result['backend']}`, concurrency {result['concurrency']}, "
             f"{result['rounds_each']} rounds each, alternating; ratio = B / A of the rounds' medians, "
             f"95% bootstrap interval, rank-sum p; a change is named past ±{result['tolerance']:.0%}.", "",
             "| figure | A median | B median | B/A | 95% interval | p | better when | verdict |",
             "|---|---:|---:|---:|---|---:|---|---|"]
    for name, f in result["figures"].items():
        low, high = f["ci95"]
        lines.append(f"| {name} | {f['a_median']:.3f} | {f['b_median']:.3f} | {f['ratio']:.3f} | "
                     f"{low:.3f}-{high:.3f} | {f['p']:.3f} | {f['better_when']} | **{f['verdict']}** |")
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--a", help="the build before: its sprout binary")
    parser.add_argument("--a-rev", help="...or a git revision, built under $SPROUT_AB_BUILDS (/var/tmp/sprout-ab)")
    parser.add_argument("--b", help="the build after (default: this checkout's target/release/sprout)")
    parser.add_argument("--b-rev", help="...or a git revision")
    parser.add_argument("--a-set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="a worker setting of side A (repeatable; `sprout bench sandboxes --set`)")
    parser.add_argument("--b-set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="a worker setting of side B (repeatable)")
    parser.add_argument("--backend", default="sock-isolated", help="the back-end measured (default sock-isolated)")
    parser.add_argument("--concurrency", default="1,10", help="cold-start concurrencies (default 1,10)")
    parser.add_argument("--rounds", type=int, default=6, help="rounds of each build (default 6)")
    parser.add_argument("--seconds", type=int, default=4, help="seconds measured per point (default 4)")
    parser.add_argument("--tolerance", type=float, default=0.03,
                        help="a change smaller than this share is not named (default 0.03)")
    parser.add_argument("--guard", action="store_true", help="exit 1 when a figure got worse")
    parser.add_argument("--keep-cpus-awake", action="store_true",
                        help="an idle-class spinner per CPU meanwhile, so a VM's halted vCPUs' slow wake-ups "
                             "do not swamp the latencies (bench/cpus_awake.py); the CPU per sandbox life, which "
                             "counts busy time, is then left out")
    parser.add_argument("--out", default="bench/results/ab-sandboxes")
    args = parser.parse_args()
    if not (args.a or args.a_rev or args.a_set or args.b_set):
        parser.error("give --a or --a-rev, or settings that tell the sides apart (--a-set, --b-set)")
    sides = {"a": side(args, "a"), "b": side(args, "b")}
    scratch = tempfile.mkdtemp(prefix="sprout-ab-")
    rounds = {"a": [], "b": []}
    with cpus_awake(args.keep_cpus_awake):
        for i in range(args.rounds):
            for which in ("a", "b") if i % 2 == 0 else ("b", "a"):
                started = time.time()
                _, binary, cwd, settings = sides[which]
                figures = run_once(binary, cwd, args.backend, args.concurrency, args.seconds, scratch, settings)
                if not figures:
                    sys.exit(f"ab_sandboxes: side {which.upper()} ({binary}) measured nothing in round {i + 1}: "
                             "its `sprout bench sandboxes` skipped the back-end (its message is above)")
                rounds[which].append(figures)
                print(f"round {i + 1}/{args.rounds} {which.upper()} ({time.time() - started:.0f} s): "
                      + ", ".join(f"{k} {v:.3f}" for k, v in figures.items()), file=sys.stderr)
    awake = ", CPUs kept awake (bench/cpus_awake.py; CPU per sandbox life not compared)" if args.keep_cpus_awake else ""
    result = {
        "method": f"sprout bench sandboxes --backends {args.backend} --concurrency {args.concurrency} "
                  f"--seconds {args.seconds}, rounds alternating A and B (ABBA...){awake}; bench/ab_stats.py",
        "a": sides["a"][0], "b": sides["b"][0], "backend": args.backend, "concurrency": args.concurrency,
        "rounds_each": args.rounds, "tolerance": args.tolerance, "rounds": rounds,
        "figures": compare(rounds, args.tolerance, args.keep_cpus_awake),
    }
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out + ".json", "w") as f:
        json.dump(result, f, indent=1)
    with open(args.out + ".md", "w") as f:
        f.write(markdown(result))
    plot(result, args.out + ".png")
    print(markdown(result))
    worse = [name for name, f in result["figures"].items() if f["verdict"] == "worse"]
    if args.guard and worse:
        print(f"worse: {', '.join(worse)}", file=sys.stderr)
        sys.exit(1)


def plot(result, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(result["figures"])
    fig, axes = plt.subplots(1, len(names), figsize=(2.6 * len(names), 3), squeeze=False)
    for ax, name in zip(axes[0], names):
        f = result["figures"][name]
        for which, color in (("a", "tab:gray"), ("b", "tab:green")):
            values = [r[name] for r in result["rounds"][which]]
            ax.plot(range(1, len(values) + 1), values, "o-", color=color, label=which.upper())
        ax.set_title(f"{name}\nB/A {f['ratio']:.2f}: {f['verdict']}", fontsize=7)
        ax.set_xlabel("round", fontsize=7)
        ax.tick_params(labelsize=6)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
