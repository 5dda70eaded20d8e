"""Plot bench/results/packages.json: SOCK figures 17-21 on this machine, and memory.

  (a) cold start per package and cache configuration (figure 17)
  (b) latency CDFs of 100 django lambdas per configuration (figure 18)
  (c) handler-cache hits over the first requests, without and with the import cache (figure 19)
  (d) latency CDFs with synthetic packages, by number of handlers (figure 20)
  (e) image resizing: platform and compute time, cold / cold+ / warm (figure 21)
  (f) memory of N django lambdas: Zygote tree against root forks and separate interpreters

usage: python3 bench/plot_packages.py packages.json packages.png
"""

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

CONFIGS = ["none", "install", "import", "all"]
COLORS = {"none": "#e76f51", "handler": "#f4a261", "install": "#e9c46a", "import": "#2a9d8f",
          "all": "#264653", "install+handler": "#8ab17d"}


def cdf(ax, values, label, color=None):
    values = sorted(values)
    if not values:
        return
    ys = [(i + 1) / len(values) for i in range(len(values))]
    ax.step(values, ys, where="post", label=label, color=color)


def missing(ax, what):
    ax.text(0.5, 0.5, f"{what}: not run", ha="center", va="center", transform=ax.transAxes, color="grey")
    ax.set_xticks([])
    ax.set_yticks([])


def per_package(ax, data):
    packages = [p for p in data if isinstance(data[p], dict) and "install" in data[p]]
    width = 0.8 / len(CONFIGS)
    for i, config in enumerate(CONFIGS):
        xs = [j + (i - (len(CONFIGS) - 1) / 2) * width for j in range(len(packages))]
        ys = [data[p].get(config, {}).get("cold_p50_ms") or 0 for p in packages]
        bars = ax.bar(xs, ys, width, label=config, color=COLORS[config])
        for bar, y in zip(bars, ys):
            if y:
                ax.annotate(f"{y:.0f}" if y >= 10 else f"{y:.1f}", (bar.get_x() + bar.get_width() / 2, y),
                            ha="center", va="bottom", fontsize=6, rotation=90)
    floor = data.get("no_package", {}).get("cold_p50_ms")
    if floor:
        ax.axhline(floor, color="black", linestyle="--", linewidth=0.8, label=f"no package ({floor:.1f} ms)")
        ax.axhline(1.5 * floor, color="grey", linestyle=":", linewidth=0.8, label="target: 1.5x no package")
    ax.set_xticks(range(len(packages)))
    ax.set_xticklabels(packages)
    ax.set_yscale("log")
    ax.set_ylabel("cold start p50 (ms, log)")
    ax.set_title("(a) one package per lambda (fig. 17)")
    ax.legend(fontsize=7, ncol=2)


def django_cdfs(ax, data):
    for name, config in data["configs"].items():
        cdf(ax, config.get("latencies_ms", []), f"{name} (p50 {config['p50_ms']:.0f} ms)", COLORS.get(name))
    ax.set_xscale("log")
    ax.set_xlabel("latency (ms, log)")
    ax.set_ylabel("fraction of requests")
    ax.set_title(f"(b) {data['lambdas']} django lambdas at random (fig. 18)")
    ax.legend(fontsize=7)


def hits(ax, data):
    for name, label in (("install+handler", "handler cache, no import cache"), ("all", "handler + import cache")):
        config = data["configs"].get(name)
        if config:
            counts = config["cumulative_hits"]
            ax.plot(range(1, len(counts) + 1), counts, label=f"{label}: {counts[-1]} hits", color=COLORS[name])
    ax.set_xlabel("request")
    ax.set_ylabel("handler-cache hits so far")
    ax.set_title(f"(c) hits within {data['handler_cache_mb']} MiB (fig. 19)")
    ax.legend(fontsize=7)


def scalability(ax, data):
    points = sorted((int(k), v) for k, v in data.items() if k.isdigit())
    for n, point in points:
        share = point["share"]
        label = (f"{n} handlers: p50 {point['p50_ms']:.0f} ms; "
                 f"handler {share['handler']:.0%}, import {share['import']:.0%}, install {share['install']:.0%}")
        cdf(ax, point.get("latencies_ms", []), label)
    ax.set_xscale("log")
    ax.set_xlabel("latency (ms, log)")
    ax.set_ylabel("fraction of requests")
    gen = data.get("generator", {})
    ax.set_title(f"(d) synthetic packages, 10 clients (fig. 20; universe {gen.get('universe', '?')})")
    ax.legend(fontsize=6)


def resize(ax, data):
    cases = ["cold", "cold+", "warm"]
    platform = [data[c]["platform_p50_ms"] for c in cases]
    compute = [data[c]["compute_p50_ms"] for c in cases]
    ax.bar(cases, platform, label="platform", color="#264653")
    ax.bar(cases, compute, bottom=platform, label="compute (resize)", color="#e9c46a")
    for i, (p, c) in enumerate(zip(platform, compute)):
        ax.annotate(f"{p:.1f} + {c:.1f} ms", (i, p + c), ha="center", va="bottom", fontsize=7)
    ax.set_ylabel("p50 (ms)")
    ax.set_title("(e) image resizing with Pillow (fig. 21)")
    ax.legend(fontsize=7)


def memory(ax, data):
    labels = ["Zygote tree", "root forks\n(no import cache)", "separate\ninterpreters"]
    values = [data["zygote_tree_pss_mb"], data["root_forks_pss_mb"], data["separate_pss_mb"]]
    bars = ax.bar(labels, values, color=["#2a9d8f", "#e9c46a", "#e76f51"])
    for bar, v in zip(bars, values):
        ax.annotate(f"{v:.0f} MiB", (bar.get_x() + bar.get_width() / 2, v), ha="center", va="bottom", fontsize=8)
    ax.set_ylabel("PSS of all processes (MiB)")
    ax.set_title(f"(f) memory of {data['lambdas']} paused django lambdas")


def main(src, dst):
    results = json.load(open(src))
    fig, axes = plt.subplots(2, 3, figsize=(19, 10.5))
    panels = [
        ("packages", per_package), ("django", django_cdfs), ("django", hits),
        ("scalability", scalability), ("image_resize", resize), ("memory", memory),
    ]
    for ax, (key, draw) in zip(axes.flat, panels):
        if key in results:
            draw(ax, results[key])
        else:
            missing(ax, key)
    fig.suptitle(f"Sprout: packages and the three caches — {results['machine']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(dst, dpi=110)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
