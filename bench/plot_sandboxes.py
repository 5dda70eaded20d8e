"""Plot bench/results/sandboxes.json: cold-start throughput against latency per backend
(SOCK figures 14-15) and cold against warm latency (figure 16).

usage: python3 bench/plot_sandboxes.py sandboxes.json sandboxes.png
"""

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ORDER = ["sock", "sock-nozygote", "runc", "docker"]
COLORS = {"sock": "#2a9d8f", "sock-nozygote": "#8ab17d", "runc": "#e9c46a", "docker": "#e76f51"}


def main(src, dst):
    results = json.load(open(src))
    backends = {k: v for k, v in results["backends"].items() if "skipped" not in v}
    fig, (tput, bars) = plt.subplots(1, 2, figsize=(13, 5.2))

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
    cold = [backends[n]["c1"]["cold_p50_ms"] for n in names]
    warm = [backends[n]["warm_p50_ms"] for n in names]
    xs = range(len(names))
    bars.bar([x - 0.2 for x in xs], cold, 0.4, label="cold start (c=1)", color="#457b9d")
    bars.bar([x + 0.2 for x in xs], warm, 0.4, label="warm invocation", color="#a8dadc")
    for x, c, w in zip(xs, cold, warm):
        bars.annotate(f"{c:.1f}", (x - 0.2, c), ha="center", va="bottom", fontsize=8)
        bars.annotate(f"{w:.2f}", (x + 0.2, w), ha="center", va="bottom", fontsize=8)
    bars.set_xticks(list(xs))
    bars.set_xticklabels(names)
    bars.set_yscale("log")
    bars.set_ylabel("latency p50, ms (log)")
    bars.set_title("Cold start against reuse of a kept sandbox")
    bars.legend()

    fig.suptitle(results.get("machine", ""), fontsize=8)
    fig.tight_layout()
    fig.savefig(dst, dpi=130)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
