"""Plot bench/results/keepalive.json: each policy's per-application cold-start share (CDF over
applications, as Serverless in the Wild's figure 14) and the memory time it wastes.

usage: python3 bench/plot_keepalive.py keepalive.json keepalive.png
"""

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ORDER = ["always-on", "fixed-10min", "histogram"]
COLORS = {"always-on": "#8d99ae", "fixed-10min": "#e9c46a", "histogram": "#2a9d8f"}


def main(src, dst):
    r = json.load(open(src))
    policies = r["policies"]
    fig, (cdf, waste) = plt.subplots(1, 2, figsize=(12, 4.8))
    for name in ORDER:
        values = policies[name]["app_cold_pct_cdf"]
        cdf.plot(values, [i / 100 for i in range(len(values))], color=COLORS[name], label=name, linewidth=2)
    cdf.set_xlabel("cold starts, % of an application's invocations")
    cdf.set_ylabel("share of applications")
    cdf.set_title("Cold starts per application (CDF)")
    cdf.axhline(0.75, color="#999", linewidth=0.8, linestyle=":")
    cdf.grid(True, alpha=0.3)
    cdf.legend()

    hours = [policies[n]["wasted_sandbox_hours"] for n in ORDER]
    bars = waste.bar(ORDER, hours, color=[COLORS[n] for n in ORDER])
    for bar, h in zip(bars, hours):
        waste.annotate(f"{h:,.0f}", (bar.get_x() + bar.get_width() / 2, h), ha="center", va="bottom", fontsize=8)
    waste.set_ylabel("sandbox-hours loaded but idle")
    waste.set_title(f"Wasted memory time, {r['apps']} applications over {r['days']} days")
    fig.suptitle(r.get("machine", ""), fontsize=8)
    fig.tight_layout()
    fig.savefig(dst, dpi=130)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
