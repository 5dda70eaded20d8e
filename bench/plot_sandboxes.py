"""Plot bench/results/sandboxes.json: cold-start throughput against latency per backend
(SOCK figures 14-15), cold against warm latency (figure 16), and what isolating sandboxes
costs (the isolated lean sandbox against SOCK's, head to head).

usage: python3 bench/plot_sandboxes.py sandboxes.json sandboxes.png
"""

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ORDER = ["sock", "sock-isolated", "sock-nospares", "sock-nozygote", "gvisor", "runc", "docker"]
COLORS = {
    "sock": "#2a9d8f",
    "sock-isolated": "#264653",
    "sock-nospares": "#90be6d",
    "sock-nozygote": "#8ab17d",
    "gvisor": "#6d597a",
    "runc": "#e9c46a",
    "docker": "#e76f51",
}


def main(src, dst):
    results = json.load(open(src))
    backends = {k: v for k, v in results["backends"].items() if "skipped" not in v}
    isolation = results.get("isolation") or {}
    panels = 3 if "isolated_over_sock" in isolation else 2
    fig, axes = plt.subplots(1, panels, figsize=(6.5 * panels, 5.2))
    tput, bars = axes[0], axes[1]

    for name in [b for b in ORDER if b in backends]:
        data = backends[name]
        points = sorted((int(k[1:]), v) for k, v in data.items() if k.startswith("c") and k[1:].isdigit())
        xs = [v["cold_per_s"] for _, v in points]
        ys = [v["cold_p50_ms"] for _, v in points]
        tput.plot(xs, ys, "o-", color=COLORS.get(name), label=name)
        for (c, _), x, y in zip(points, xs, ys):
            tput.annotate(f"c={c}", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
    tput.set_xscale("log")
    tput.set_yscale("log")
    tput.set_xlabel("cold starts per second (log)")
    tput.set_ylabel("request latency p50, ms (log)")
    tput.set_title("Cold starts of a no-op lambda, by concurrency")
    tput.grid(True, which="both", alpha=0.3)
    tput.legend()

    names = [b for b in ORDER if b in backends]
    xs = range(len(names))
    series = [
        # (A run of other concurrencies has no c=1 point: its bar is left out.)
        ("cold start, closed loop c=1", [(backends[n].get("c1") or {}).get("cold_p50_ms", 0) for n in names], "#457b9d", "{:.1f}"),
        ("cold start, paced (gvisor 20/s)", [(backends[n].get("paced") or {}).get("cold_p50_ms", 0) for n in names], "#1d3557", "{:.1f}"),
        ("warm invocation", [backends[n].get("warm_p50_ms", 0) for n in names], "#a8dadc", "{:.2f}"),
    ]
    for i, (label, values, color, fmt) in enumerate(series):
        offset = (i - 1) * 0.27
        bars.bar([x + offset for x in xs], values, 0.27, label=label, color=color)
        for x, v in zip(xs, values):
            if v:
                bars.annotate(fmt.format(v), (x + offset, v), ha="center", va="bottom", fontsize=7)
    bars.set_xticks(list(xs))
    bars.set_xticklabels(names)
    bars.set_yscale("log")
    bars.set_ylabel("latency p50, ms (log)")
    bars.set_title("Cold start against reuse of a kept sandbox")
    bars.legend()

    if panels == 3:
        iso = axes[2]
        ratios = isolation["isolated_over_sock"]
        labels = ["cold start p50", "warm p50", "service round trip p50", "new connection p50"]
        keys = ["cold_p50", "warm_p50", "service_rtt_p50", "service_connect_p50"]
        values = [ratios.get(k) or 0 for k in keys]
        iso.bar(range(len(keys)), values, color=COLORS["sock-isolated"])
        for x, v in enumerate(values):
            iso.annotate(f"{v:.2f}x", (x, v), ha="center", va="bottom", fontsize=8)
        iso.axhline(1.0, color="#888", linewidth=0.8)
        iso.axhline(1.1, color="#e76f51", linestyle="--", linewidth=0.8, label="promise: <= 1.1x")
        iso.set_xticks(range(len(keys)))
        iso.set_xticklabels(labels, rotation=15, fontsize=8)
        iso.set_ylabel("isolated / sock (median of alternating rounds)")
        iso.set_title(f"What isolation costs ({isolation.get('rounds')} alternating rounds)")
        iso.legend(fontsize=8)

    fig.suptitle(results.get("machine", ""), fontsize=8)
    fig.tight_layout()
    fig.savefig(dst, dpi=130)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
