"""Plot bench/results/offload.json: sprout.map against Ray and multiprocessing.Pool on the same
CPUs: no-op tasks per second (with the goals' lines), one task's round trip, and the makespan
of CPU-bound tasks against the ideal.

usage: python3 bench/plot_offload.py offload.json offload.png
"""

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

PEERS = ["sprout", "sprout_unbatched", "ray", "multiprocessing", "multiprocessing_chunked"]
LABELS = {
    "sprout": "sprout.map",
    "sprout_unbatched": "sprout.map\nchunk=1",
    "ray": "Ray",
    "multiprocessing": "Pool\nchunksize=1",
    "multiprocessing_chunked": "Pool\ndefault chunks",
}
COLORS = {
    "sprout": "#2a9d8f",
    "sprout_unbatched": "#8ab17d",
    "ray": "#e76f51",
    "multiprocessing": "#264653",
    "multiprocessing_chunked": "#6c8ea0",
}


def bars(ax, peers, values, fmt):
    xs = range(len(peers))
    heights = [v if v is not None else 0 for v in values]
    ax.bar(xs, heights, color=[COLORS[p] for p in peers])
    ax.set_xticks(list(xs), [LABELS[p] for p in peers], fontsize=8)
    for x, v in zip(xs, values):
        ax.annotate("—" if v is None else fmt.format(v), (x, v or 0), ha="center", va="bottom", fontsize=8,
                    xytext=(0, 2), textcoords="offset points")


def main(src, dst):
    r = json.load(open(src))
    peers = [p for p in PEERS if p in r["peers"]]
    at = lambda p, k: r["peers"][p].get(k)
    plan = r.get("plan", {})
    fig, (a, b, c) = plt.subplots(1, 3, figsize=(16, 5.4))

    bars(a, peers, [at(p, "noop_tasks_per_s") for p in peers], "{:,.0f}")
    a.set_yscale("log")
    lowest = min((at(p, "noop_tasks_per_s") for p in peers if at(p, "noop_tasks_per_s")), default=1000)
    a.set_ylim(bottom=min(lowest, 1000 / 0.3) / 10)
    a.set_ylabel("no-op tasks per second (log)")
    a.set_title(f"(a) {plan.get('tasks', '?'):,} no-op tasks at once")
    a.axhline(1000 / 0.3, color="#2a9d8f", ls=":", lw=1, label="goal: 0.3 ms per task")
    if "ray" in r["peers"]:
        a.axhline(3 * at("ray", "noop_tasks_per_s"), color="#e76f51", ls="--", lw=1, label="goal: 3x Ray")
    a.legend(fontsize=8, loc="upper left")

    bars(b, peers, [at(p, "round_trip_ms") for p in peers], "{:.2f}")
    b.set_ylabel("ms")
    b.set_title(f"(a) one task's round trip (median of {plan.get('round_trips', '?')})")

    bars(c, peers, [at(p, "cpu_makespan_s") for p in peers], "{:.2f}")
    c.set_ylabel("seconds")
    c.set_title(f"(b) {plan.get('cpu_tasks', '?'):,} tasks of {plan.get('task_ms', '?'):g} ms CPU: makespan")
    ideal = r.get("cpu_ideal_s") or plan.get("ideal_s")
    if ideal:
        c.axhline(ideal, color="black", ls="--", lw=1, label=f"ideal {ideal:.2f} s")
    pools = [at(p, "cpu_makespan_s") for p in ("multiprocessing", "multiprocessing_chunked") if p in r["peers"]]
    if pools:
        c.axhline(1.15 * min(pools), color="#264653", ls=":", lw=1, label="goal: 1.15x the pool's")
    c.legend(fontsize=8, loc="lower right")

    goals = "   ".join(
        f"{'met' if g.get('met') else ('not measured' if g.get('met') is None else 'NOT met')}: {g['goal'].split(' (')[0]}"
        f" ({'—' if g.get('measured') is None else format(g['measured'], '.3g')})"
        for g in r.get("goals", [])
    )
    title = "sprout.map against Ray and multiprocessing.Pool, every peer on the same CPUs"
    if plan.get("quick"):
        title += " (--quick run)"
    fig.suptitle(f"{title}\n{r.get('machine', '')}", fontsize=10)
    fig.text(0.5, 0.01, goals + "\n(c) matmul and (d) memory: not built yet", ha="center", fontsize=8)
    fig.tight_layout(rect=(0, 0.06, 1, 0.93))
    fig.savefig(dst, dpi=110)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
