"""Plot `sprout bench fleet`: each routing policy's latency distribution (CDF, log scale) and
its share of cold starts. usage: plot_fleet_routing.py RESULTS.json OUT.png"""

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

POLICIES = ["round-robin", "least-conn", "consistent", "package-aware"]


def main(path, out):
    results = json.load(open(path))
    fig, (cdf, bars) = plt.subplots(1, 2, figsize=(11, 4.2), gridspec_kw={"width_ratios": [2, 1]})
    for policy in POLICIES:
        latencies = sorted(results["policies"][policy]["latencies_ms"])
        if latencies:
            n = len(latencies)
            cdf.plot(latencies, [(i + 1) / n for i in range(n)], label=policy)
    cdf.set_xscale("log")
    cdf.set_xlabel("latency (ms, log scale)")
    cdf.set_ylabel("share of requests")
    cdf.set_title("latency through HAProxy")
    cdf.grid(alpha=0.3)
    cdf.legend()
    shares = [results["policies"][p]["cold_share"] * 100 for p in POLICIES]
    bars.bar(range(len(POLICIES)), shares, color=["C0", "C1", "C2", "C3"])
    bars.set_xticks(range(len(POLICIES)), POLICIES, rotation=20)
    bars.set_ylabel("cold starts (% of requests)")
    bars.set_title("cold-start share")
    setup = results["setup"]
    fig.suptitle(f"{setup['workers']} workers, {setup['handlers']} synthetic handlers, {setup['clients']} clients")
    fig.tight_layout()
    fig.savefig(out, dpi=120)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
