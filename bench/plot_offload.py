"""Plot bench/results/offload.json: sprout.map against Ray and multiprocessing.Pool on the same
CPUs: no-op tasks per second (with the goals' lines), one task's round trip, the makespan
of CPU-bound tasks against the ideal; the tiled matmul against NumPy's, and the worker's
memory over a Matrix's life. A part the run left out is a panel saying so.

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


MATMUL_PEERS = ["numpy", "sprout", "multiprocessing", "ray"]
MATMUL_LABELS = {"numpy": "NumPy\none process", "sprout": "sprout.elastic", "multiprocessing": "Pool\nover tiles",
                 "ray": "Ray\nover tiles"}
MATMUL_COLORS = {"numpy": "#999999", "sprout": COLORS["sprout"], "multiprocessing": COLORS["multiprocessing"],
                 "ray": COLORS["ray"]}


def not_run(ax, title):
    ax.set_title(title)
    ax.text(0.5, 0.5, "not run", ha="center", va="center", transform=ax.transAxes, color="grey")
    ax.set_xticks([])
    ax.set_yticks([])


def matmul_panel(ax, r):
    m = r.get("matmul") or {}
    plan = r.get("plan", {}).get("matmul", {})
    title = f"(c) {plan.get('n', '?')}x{plan.get('n', '?')} float64 matmul, tiles of {plan.get('tile', '?')}"
    peers = [p for p in MATMUL_PEERS if p in m]
    if not peers:
        return not_run(ax, title)
    xs = range(len(peers))
    values = [m[p]["matmul_s"] for p in peers]
    ax.bar(xs, values, color=[MATMUL_COLORS[p] for p in peers])
    ax.set_xticks(list(xs), [MATMUL_LABELS[p] for p in peers], fontsize=8)
    numpy = m.get("numpy", {}).get("matmul_s")
    for x, v in zip(xs, values):
        label = f"{v:.2f} s" + (f"\n{v / numpy:.2f}x" if numpy else "")
        ax.annotate(label, (x, v), ha="center", va="bottom", fontsize=8, xytext=(0, 2), textcoords="offset points")
    if numpy:
        ax.axhline(1.3 * numpy, color=COLORS["sprout"], ls=":", lw=1, label="goal: 1.3x NumPy")
        ax.legend(fontsize=8, loc="upper left")
    ax.set_ylabel("seconds for A @ B")
    ax.set_title(title)


def memory_panel(ax, r):
    memory = (r.get("matmul") or {}).get("sprout", {}).get("memory")
    title = "(d) the worker's memory over a Matrix's life"
    if not memory or not memory.get("series"):
        return not_run(ax, title)
    t = [p[0] for p in memory["series"]]
    pss = [p[1] for p in memory["series"]]
    files = [p[2] for p in memory["series"]]
    ax.stackplot(t, pss, files, labels=["PSS: worker and sandboxes", "leases' files"],
                 colors=[COLORS["sprout"], "#e9c46a"], alpha=0.8)
    ax.axhline(memory["before_mib"], color="black", ls="--", lw=1, label=f"before: {memory['before_mib']:.0f} MiB")
    for name, at_s in (memory.get("events") or {}).items():
        ax.axvline(at_s, color="grey", ls=":", lw=1)
        ax.annotate(name, (at_s, ax.get_ylim()[1] * 0.95), rotation=90, fontsize=7, va="top", ha="right")
    back = memory.get("back_s")
    released = (memory.get("events") or {}).get("released")
    if back is not None and released is not None:
        ax.axvline(released + 5, color="#e76f51", ls="--", lw=1, label="goal: back 5 s after release")
    ax.set_xlabel("seconds")
    ax.set_ylabel("MiB")
    ax.set_title(title + (f": back {back:.2f} s after release" if back is not None else ": never back"))
    ax.legend(fontsize=7, loc="upper right")


def main(src, dst):
    r = json.load(open(src))
    peers = [p for p in PEERS if r["peers"].get(p, {}).get("noop_tasks_per_s")]
    at = lambda p, k: r["peers"][p].get(k)
    plan = r.get("plan", {})
    fig, axes = plt.subplots(2, 3, figsize=(16, 10))
    (a, b, c), (d, e, unused) = axes
    unused.axis("off")
    matmul_panel(d, r)
    memory_panel(e, r)
    if not peers:
        for ax, title in ((a, "(a) no-op tasks"), (b, "(a) round trip"), (c, "(b) CPU tasks")):
            not_run(ax, title)
        return finish(fig, r, plan, dst)

    bars(a, peers, [at(p, "noop_tasks_per_s") for p in peers], "{:,.0f}")
    a.set_yscale("log")
    lowest = min((at(p, "noop_tasks_per_s") for p in peers if at(p, "noop_tasks_per_s")), default=1000)
    a.set_ylim(bottom=min(lowest, 1000 / 0.3) / 10)
    a.set_ylabel("no-op tasks per second (log)")
    a.set_title(f"(a) {plan.get('tasks', '?'):,} no-op tasks at once")
    a.axhline(1000 / 0.3, color="#2a9d8f", ls=":", lw=1, label="goal: 0.3 ms per task")
    if "ray" in peers:
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

    finish(fig, r, plan, dst)


def finish(fig, r, plan, dst):
    goals = "\n".join(
        f"{'met' if g.get('met') else ('not measured' if g.get('met') is None else 'NOT met')}: {g['goal'].split(' (')[0]}"
        f" ({'—' if g.get('measured') is None else format(g['measured'], '.3g')})"
        for g in r.get("goals", [])
    )
    title = "sprout.map against Ray and multiprocessing.Pool, every peer on the same CPUs"
    if plan.get("quick"):
        title += " (--quick run)"
    fig.suptitle(f"{title}\n{r.get('machine', '')}", fontsize=10)
    fig.text(0.67, 0.06, goals, ha="left", fontsize=8, wrap=True)
    fig.tight_layout(rect=(0, 0.02, 1, 0.95))
    fig.savefig(dst, dpi=110)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
