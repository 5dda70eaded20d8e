"""A/B of two builds on `sprout bench sandboxes`: the lean back-end's cold starts at concurrency 1
and its warm requests, rounds alternating A and B in one run (so the machine's drift falls on
both), medians and B/A ratios as JSON, a markdown table and a PNG plot.

    python3 bench/ab_sandboxes.py --a OLD/target/release/sprout --b target/release/sprout \\
        --rounds 5 --out bench/results/ab-sandboxes
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

# What is compared: (name, where in the benchmark's JSON under backends.sock, better when)
FIGURES = [
    ("cold_p50_ms", ("c1", "cold_p50_ms"), "lower"),
    ("cold_p99_ms", ("c1", "cold_p99_ms"), "lower"),
    ("cold_per_s", ("c1", "cold_per_s"), "higher"),
    ("paced_cold_p50_ms", ("paced", "cold_p50_ms"), "lower"),
    ("warm_p50_ms", ("warm_p50_ms",), "lower"),
    ("warm_p99_ms", ("warm_p99_ms",), "lower"),
]


def run_once(binary, seconds, scratch):
    """One `sprout bench sandboxes` of the sock back-end at concurrency 1: its figures."""
    out = tempfile.mkdtemp(prefix="ab-", dir=scratch)
    cmd = [binary, "bench", "sandboxes", "--backends", "sock", "--concurrency", "1", "--seconds", str(seconds), "--out", out]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    with open(os.path.join(out, "sandboxes.json")) as f:
        sock = json.load(f)["backends"]["sock"]
    figures = {}
    for name, path, _ in FIGURES:
        value = sock
        for key in path:
            value = value[key]
        figures[name] = value
    return figures


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--a", required=True, help="the build before (its sprout binary)")
    parser.add_argument("--b", required=True, help="the build after")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=int, default=5, help="seconds measured per point")
    parser.add_argument("--out", default="bench/results/ab-sandboxes")
    args = parser.parse_args()
    scratch = tempfile.mkdtemp(prefix="sprout-ab-")
    rounds = {"a": [], "b": []}
    for i in range(args.rounds):
        for side in ("a", "b") if i % 2 == 0 else ("b", "a"):
            started = time.time()
            figures = run_once(getattr(args, side), args.seconds, scratch)
            rounds[side].append(figures)
            print(f"round {i + 1}/{args.rounds} {side.upper()}: {figures} ({time.time() - started:.0f} s)", file=sys.stderr)
    medians = {side: {name: statistics.median(r[name] for r in rounds[side]) for name, _, _ in FIGURES} for side in rounds}
    ratios = {name: medians["b"][name] / medians["a"][name] for name, _, _ in FIGURES}
    result = {
        "method": "sprout bench sandboxes --backends sock --concurrency 1, rounds alternating A and B (ABBA...), "
        "medians of the rounds; ratio = B / A",
        "a": args.a,
        "b": args.b,
        "rounds": rounds,
        "medians": medians,
        "ratios": ratios,
        "better_when": {name: better for name, _, better in FIGURES},
    }
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out + ".json", "w") as f:
        json.dump(result, f, indent=1)
    lines = ["| figure (sock, c1) | A median | B median | B/A | better |", "|---|---:|---:|---:|---|"]
    for name, _, better in FIGURES:
        lines.append(f"| {name} | {medians['a'][name]:.3f} | {medians['b'][name]:.3f} | {ratios[name]:.3f} | {better} |")
    with open(args.out + ".md", "w") as f:
        f.write(f"A: `{args.a}`; B: `{args.b}`; {args.rounds} rounds each, alternating.\n\n" + "\n".join(lines) + "\n")
    plot(rounds, args.out + ".png")
    print("\n".join(lines))


def plot(rounds, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(FIGURES), figsize=(3 * len(FIGURES), 3))
    for ax, (name, _, better) in zip(axes, FIGURES):
        for side, color in (("a", "tab:gray"), ("b", "tab:green")):
            values = [r[name] for r in rounds[side]]
            ax.plot(range(1, len(values) + 1), values, "o-", color=color, label=side.upper())
        ax.set_title(f"{name} ({better} is better)", fontsize=8)
        ax.set_xlabel("round")
        ax.tick_params(labelsize=7)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
