"""Plot bench/results/neighbours.json: a victim lambda's warm p50 and p99 per phase (alone,
beside each noisy neighbour, alone again at the end) as bars, the first `alone` level as a
line and each bar's ratio to it annotated; beside it G1, the silent victim against one
printing a line per call, round by round.

usage: python3 bench/plot_neighbours.py neighbours.json neighbours.png
"""

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402

LABELS = {
    "alone": "alone",
    "printer": "printer\n20 MB/call",
    "printer-paced": "printer\n100 MB/s",
    "spinner": "spinner\n1 s CPU/call",
    "churner": "churner\n100 MiB/call",
    "tenant-flood": "tenant at 10x\nits quota",
    "alone-end": "alone\n(at the end)",
}
COLORS = {"p50": "#2a9d8f", "p99": "#e76f51"}


def main(src, dst):
    results = json.load(open(src))
    phases = results["phases"]
    fig, (ax, g1ax) = plt.subplots(1, 2, figsize=(13, 5), gridspec_kw={"width_ratios": [3, 1]})
    alone = next(p for p in phases if p["name"] == "alone")["victim"]
    width = 0.38
    for key, offset in [("p50", -width / 2), ("p99", width / 2)]:
        for i, phase in enumerate(phases):
            value = phase["victim"][f"{key}_ms"]
            if value is None:
                continue
            ax.bar(i + offset, value, width=width, color=COLORS[key], label=key if i == 0 else None)
            ratio = phase["ratio"][key]
            if ratio is not None:
                ax.annotate(f"{ratio:.2f}×", (i + offset, value), textcoords="offset points", xytext=(0, 3), ha="center", fontsize=7)
        level = alone[f"{key}_ms"]
        if level is not None:
            ax.axhline(level, color=COLORS[key], ls="--", lw=1, label=f"alone {key} {level:.3f} ms")
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
    ax.yaxis.set_minor_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
    ax.tick_params(axis="y", which="minor", labelsize=7)
    ax.set_xticks(range(len(phases)), [LABELS.get(p["name"], p["name"]) for p in phases], fontsize=8)
    ax.set_ylabel("victim's warm latency, ms (log scale)")
    ax.set_title("The victim beside 3 callers of each neighbour (ratios: ÷ alone)", fontsize=9)
    ax.legend(fontsize=7, loc="upper right")

    g1 = results["g1"]
    for j, (lambda_, color) in enumerate([("victim", "#2a9d8f"), ("victim-prints", "#e76f51")]):
        values = [r[lambda_]["p50_ms"] for r in g1["rounds"] if r[lambda_]["p50_ms"] is not None]
        g1ax.plot([j] * len(values), values, "o", color=color, alpha=0.7, ms=4)
        if values:
            mid = sorted(values)[len(values) // 2]
            g1ax.plot([j - 0.25, j + 0.25], [mid, mid], color="black", lw=1.5)
    g1ax.set_xticks([0, 1], ["silent", "prints a line"])
    g1ax.set_xlim(-0.6, 1.6)
    ratio = g1["p50_ratio"]
    g1ax.set_title(f"G1: warm p50 by round, ratio {ratio:.3f}×" if ratio is not None else "G1: warm p50 by round", fontsize=9)
    g1ax.set_ylabel("warm p50, ms (dots: rounds; line: their median)")
    when = f"{results.get('date') or ''}, commit {results.get('commit') or '?'}"
    fig.suptitle(f"Noisy neighbours on one worker: {results['machine']} ({when})", fontsize=8)
    fig.tight_layout()
    fig.savefig(dst, dpi=120)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
