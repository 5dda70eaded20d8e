"""Plot bench/results/asgi.json: ASGI apps against WSGI ones, cold and warm (p50 bars with
each round's p50 as a dot, p99 as a tick): bare hello worlds, and FastAPI against Flask.

usage: python3 bench/plot_asgi.py asgi.json asgi.png
"""

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

APPS = ["wsgi-hello", "asgi-hello", "post-echo", "fastapi-hello"]
LABELS = {"wsgi-hello": "bare WSGI", "asgi-hello": "bare ASGI", "post-echo": "Flask", "fastapi-hello": "FastAPI"}
COLORS = {"wsgi-hello": "#2a9d8f", "asgi-hello": "#e76f51", "post-echo": "#2a9d8f", "fastapi-hello": "#e76f51"}


def main(src, dst):
    results = json.load(open(src))
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    for ax, start in zip(axes, ["cold", "warm"]):
        for i, app in enumerate(APPS):
            data = results["apps"][app]
            p50, p99 = data[f"{start}_p50_ms"], data[f"{start}_p99_ms"]
            ax.bar(i, p50, color=COLORS[app], width=0.6)
            ax.plot([i - 0.3, i + 0.3], [p99, p99], color="black", lw=1.5)
            rounds = [r[f"{start}_p50_ms"] for r in data["rounds"]]
            ax.plot([i] * len(rounds), rounds, "o", color="black", ms=3, alpha=0.6)
            ax.annotate(f"{p50:.2f}", (i, p50), textcoords="offset points", xytext=(0, 4), ha="center", fontsize=8)
        bare, framework = results["asgi_over_wsgi"][f"{start}_p50"], results["fastapi_over_flask"][f"{start}_p50"]
        ax.set_xticks(range(len(APPS)), [LABELS[a] for a in APPS])
        ax.set_ylabel("latency, ms (bar: median p50; tick: p99; dots: rounds)")
        ax.set_title(f"{start} start, p50: bare ASGI ÷ WSGI {bare:.2f}×, FastAPI ÷ Flask {framework:.2f}×", fontsize=9)
        ax.set_ylim(bottom=0)
    fig.suptitle("Through the worker, one client (" + results["machine"][:60] + ")", fontsize=9)
    fig.tight_layout()
    fig.savefig(dst, dpi=120)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
