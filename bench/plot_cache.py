"""Plot bench/results/cache.json (EbbRT figures 4 and 6): throughput and p99 latency of the
Sprout cache and memcached by connections and by value size, for each core budget.

usage: python3 bench/plot_cache.py cache.json cache.png
"""

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COLORS = {"memcached": "#e76f51", "sprout": "#2a9d8f"}
DASH = {"1": "-", "2": "--"}


def series(points, system, field):
    keys = sorted(points, key=int)
    return [int(k) for k in keys], [points[k][system][field] for k in keys]


def main(src, dst):
    r = json.load(open(src))
    fig, axes = plt.subplots(2, 3, figsize=(17, 9))
    for col, (sweep, xlabel) in enumerate([("connections", "concurrent connections"), ("value_bytes", "value size (bytes)")]):
        top, bottom = axes[0][col], axes[1][col]
        for budget, c in sorted(r["cores"].items()):
            for system in ("memcached", "sprout"):
                x, y = series(c[sweep], system, "ops_per_s")
                top.plot(x, [v / 1000 for v in y], "o" + DASH.get(budget, "-"), color=COLORS[system], label=f"{system}, {budget} core(s)")
                x, y = series(c[sweep], system, "p99_us")
                bottom.plot(x, y, "o" + DASH.get(budget, "-"), color=COLORS[system], label=f"{system}, {budget} core(s)")
        for ax in (top, bottom):
            ax.set_xscale("log", base=2)
            ax.set_xlabel(xlabel)
            ax.grid(alpha=0.3)
        top.set_ylabel("thousand ops/s")
        bottom.set_ylabel("p99 latency (µs, memaslap's log2 buckets)")
        bottom.set_yscale("log")
        top.set_title(f"throughput by {xlabel}"
                      + (" (EbbRT fig. 4)" if col == 0 else f" at {r['method']['value_sweep_connections']} conns (fig. 6)"))
        top.legend(fontsize=8)
    ratio = axes[0][2]
    for budget, c in sorted(r["cores"].items()):
        for sweep, marker in (("connections", "o"), ("value_bytes", "s")):
            keys = sorted(c[sweep], key=int)
            mid = [c[sweep][k]["sprout_over_memcached"] for k in keys]
            # The rounds' spread, where the run recorded it (older results have none).
            spread = [c[sweep][k].get("round_ratio_range") or [m, m] for k, m in zip(keys, mid)]
            below, above = [m - lo for m, (lo, _) in zip(mid, spread)], [hi - m for m, (_, hi) in zip(mid, spread)]
            ratio.errorbar(range(len(keys)), mid, yerr=[below, above],
                           fmt=marker + DASH.get(budget, "-"), capsize=3, label=f"{budget} core(s), by {sweep.replace('_', ' ')}")
    ratio.axhline(1.0, color="grey", lw=0.8)
    ratio.axhline(1.3, color="#264653", lw=0.8, ls=":")
    ratio.set_xlabel("point (left to right: the sweep's order)")
    ratio.set_ylabel("sprout ops/s ÷ memcached ops/s")
    ratio.set_title("throughput ratio, bars: the rounds' range (1.3× target dotted)")
    ratio.legend(fontsize=8)
    axes[1][2].axis("off")
    axes[1][2].text(0, 0.9, "\n".join([r["machine"], r["generator"], r["method"]["pinning"], r["memcached_version"]]),
                    fontsize=8, va="top", wrap=True)
    fig.suptitle("Sprout cache against memcached under memaslap", fontsize=11)
    fig.tight_layout()
    fig.savefig(dst, dpi=110)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
