"""What a lean sandbox's own PID, IPC and UTS namespaces cost per life, against a plain fork:
bench/namespace_cost.c (clone + _exit + waitpid, N times) built with gcc and run pinned to one
CPU for each set of flags, in rounds rotating the order; medians per flag set, the extra
microseconds over a plain fork, JSON and a markdown table (issue 51: is reusing a finished
sandbox's namespaces worth building?). Needs root (new namespaces) and gcc."""

import argparse
import json
import os
import statistics
import subprocess
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
CLONE_NEWUTS, CLONE_NEWIPC, CLONE_NEWPID = 0x04000000, 0x08000000, 0x20000000
VARIANTS = {
    "fork": 0,
    "+pid": CLONE_NEWPID,
    "+ipc": CLONE_NEWIPC,
    "+uts": CLONE_NEWUTS,
    "+pid+ipc+uts (a sandbox's)": CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS,
}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--lives", type=int, default=5000, help="clones per measurement")
    parser.add_argument("--cpu", default="1", help="the CPU to run on")
    parser.add_argument("--out", default="bench/results/namespace-cost")
    args = parser.parse_args()
    binary = Path(tempfile.mkdtemp(prefix="sprout-nscost-")) / "namespace_cost"
    subprocess.run(["gcc", "-O2", "-o", str(binary), str(HERE / "namespace_cost.c")], check=True)
    samples = {name: [] for name in VARIANTS}
    names = list(VARIANTS)
    for i in range(args.rounds):
        for name in names[i % len(names):] + names[:i % len(names)]:
            out = subprocess.run(["taskset", "-c", args.cpu, str(binary), str(VARIANTS[name]), str(args.lives)],
                                 capture_output=True, text=True, check=True)
            samples[name].append(float(out.stdout))
        print(f"round {i + 1}/{args.rounds}: " + ", ".join(f"{n} {samples[n][-1]:.1f} us" for n in names))
    base = statistics.median(samples["fork"])
    result = {
        "method": f"clone(flags)+_exit+waitpid x{args.lives} on CPU {args.cpu}, {args.rounds} rotating rounds; "
                  "wall microseconds per life (the namespaces' teardown work in kworkers elsewhere is not in it)",
        "machine": os.uname().release,
        "samples_us": samples,
        "median_us": {n: statistics.median(v) for n, v in samples.items()},
        "extra_over_fork_us": {n: statistics.median(v) - base for n, v in samples.items()},
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out + ".json").write_text(json.dumps(result, indent=1) + "\n")
    lines = ["| clone flags | µs per life (median) | range | more than a fork |", "|---|---:|---:|---:|"]
    for n, v in samples.items():
        lines.append(f"| {n} | {statistics.median(v):.1f} | {min(v):.1f}-{max(v):.1f} | {statistics.median(v) - base:+.1f} |")
    Path(args.out + ".md").write_text(f"{result['method']}\n\n" + "\n".join(lines) + "\n")
    plot(result, args.out + ".png")
    print("\n".join(lines))


def plot(result, path):
    """Each flag set's lives, one dot a round, the median a bar."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(result["samples_us"])
    fig, ax = plt.subplots(figsize=(7, 3))
    ax.bar(range(len(names)), [result["median_us"][n] for n in names], color="tab:green", alpha=0.5)
    for i, n in enumerate(names):
        ax.plot([i] * len(result["samples_us"][n]), result["samples_us"][n], "k.", markersize=4)
    ax.set_xticks(range(len(names)), [n.replace(" (", "\n(") for n in names], fontsize=7)
    ax.set_ylabel("µs per clone + exit + wait")
    ax.set_title("a lean sandbox's namespaces against a plain fork", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
