"""Where the CPU of a sandbox's life goes: `sprout bench sandboxes` of one back-end at one
concurrency (after a c=1 point), with `perf record` sampling the worker's CPU while that
point's closed loop runs.

The CPU per sandbox life is the sampled CPU's busy share (all but the idle task's samples)
times the window, per cold start of the point (the bench's own /proc/stat figure,
`cpu_ms_per_cold_start`, is kept beside it where the build reports one); the samples split it
by who was running (the worker's threads, the Zygotes forking, the handlers' processes from
fork to exit, the kernel's own threads) and by the functions that took most of it. Each
column is one build (`--binary`, repeatable: say main's previous build and this checkout's),
run alternately `--rounds` times; the figures are the rounds' medians. JSON, a markdown
table and a plot go to `--out`.

    python3 bench/profile_sandbox_life.py --binary /var/tmp/sprout-ab/<sha>/target/release/sprout \
        --binary target/release/sprout --rounds 3 --out bench/results/sandbox-life

Needs perf (Debian's linux-perf); software clock sampling (`-e cpu-clock`) works on hosts
without hardware counters.
"""

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# Who a sample's command name says was running (a sandbox's processes are told apart by pid:
# see `kinds_of`).
KINDS = [
    ("worker", re.compile(r"^(sprout|tokio-r.*|sprout-.*)$")),
    ("sandboxes", re.compile(r"^python3?(\.\d+)?$")),
    ("kernel threads", re.compile(r"^(kworker|ksoftirqd|rcu_|migration|kthreadd|cpuhp|khugepaged|kcompactd|idle_inject|watchdog).*")),
    ("idle", re.compile(r"^swapper")),
]
# A sandbox process with at least this share of the samples lived through the window: a
# Zygote (the root one or a lambda's). Each handler lives for one request, about 1/1000th.
ZYGOTE_SHARE = 1.0


def kind_of(comm):
    for kind, pattern in KINDS:
        if pattern.match(comm):
            return kind
    return "other"


def kinds_of(by_pid):
    """Shares by kind from perf's `pid` rows ("pid:comm"): the sandboxes' processes split into
    the Zygotes (long-lived, forking) and the handlers (one sandbox's life each)."""
    kinds = {}
    for share, key in by_pid:
        comm = key.split(":", 1)[1] if ":" in key else key
        kind = kind_of(comm)
        if kind == "sandboxes":
            kind = "Zygotes (forking)" if share >= ZYGOTE_SHARE else "handlers (start, request, exit)"
        kinds[kind] = kinds.get(kind, 0.0) + share
    return kinds


def report(perf_data, sort, limit):
    """perf report's rows for `sort` as (share %, key) pairs, largest first."""
    out = subprocess.run(["perf", "report", "-i", perf_data, "--stdio", "--no-children", "--sort", sort,
                          "--percent-limit", str(limit), "-g", "none"],
                         capture_output=True, text=True, check=True).stdout
    rows = []
    for line in out.splitlines():
        m = re.match(r"^\s+([\d.]+)%\s+(.*\S)\s*$", line)
        if m:
            rows.append((float(m.group(1)), re.sub(r"\s+", " ", m.group(2))))
    return rows


def checkout_of(binary):
    """The checkout a build runs in (target/release/sprout's), which holds its examples and
    runtime; this one for a binary elsewhere."""
    parents = Path(binary).resolve().parents
    return parents[2] if len(parents) > 2 and (parents[2] / "Cargo.toml").exists() else REPO


def write_results(out, result, markdown, plot):
    """`result` as OUT.json, its table as OUT.md (printed too) and its plot as OUT.png."""
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(f"{out}.json").write_text(json.dumps(result, indent=1) + "\n")
    Path(f"{out}.md").write_text(markdown(result))
    plot(result, f"{out}.png")
    print(markdown(result))


def profile_once(binary, args, scratch):
    """One bench run of `binary` with perf sampling the measured closed loop: the bench's
    figures, the busy share by kind of process and the top functions (shares of busy samples)."""
    out = tempfile.mkdtemp(prefix="life-", dir=scratch)
    perf_data = os.path.join(out, "perf.data")
    # A c=1 point first (every build's report wants it), then the profiled one.
    cmd = [str(binary), "bench", "sandboxes", "--backends", args.backend, "--concurrency", f"1,{args.concurrency}",
           "--seconds", str(args.seconds), "--out", out]
    bench = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, cwd=checkout_of(binary))
    started = threading.Event()
    lines = []

    def watch():
        for line in bench.stderr:
            lines.append(line)
            # The profiled point's closed loop begins once the c=1 point is reported.
            if "cold c=1 " in line:
                started.set()
        started.set()

    threading.Thread(target=watch, daemon=True).start()
    started.wait()
    time.sleep(1.0)  # past the point's warm-up
    window = max(1.0, args.seconds - 2.0)
    subprocess.run(["perf", "record", "-q", "-e", "cpu-clock", "-F", "2000", "-C", str(args.worker_cpu), "-g",
                    "-o", perf_data, "--", "sleep", str(window)], check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    if bench.wait() != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{''.join(lines[-20:])}")
    with open(os.path.join(out, "sandboxes.json")) as f:
        figures = json.load(f)["backends"][args.backend]
    point = figures[f"c{args.concurrency}"]
    by_comm = report(perf_data, "comm", 0.1)
    kinds = kinds_of(report(perf_data, "pid", 0.0))
    busy = 100.0 - kinds.get("idle", 0.0)
    in_kernel = sum(share for share, key in report(perf_data, "dso", 0.0) if "kernel" in key)
    symbols = [(share * 100.0 / busy, sym) for share, sym in report(perf_data, "comm,sym", 0.4)
               if not sym.startswith("swapper")]
    shutil.rmtree(out, ignore_errors=True)
    return {
        "cold_per_s": point["cold_per_s"],
        "cold_p99_ms": point["cold_p99_ms"],
        # The CPU's busy share over perf's window per cold start of the point (any build's:
        # older ones report no CPU figure), and the bench's own /proc/stat figure beside it.
        "cpu_ms_per_cold_start": busy / 100.0 * 1000.0 / point["cold_per_s"],
        "bench_cpu_ms_per_cold_start": point.get("cpu_ms_per_cold_start"),
        "busy_share_by_kind": {k: v * 100.0 / busy for k, v in kinds.items() if k != "idle"},
        "busy_share_by_comm": {c: s * 100.0 / busy for s, c in by_comm if not c.startswith("swapper")},
        "busy_share_in_kernel": (in_kernel - kinds.get("idle", 0.0)) * 100.0 / busy,
        "top": symbols[:args.top],
    }


def summarize(runs):
    """The rounds' medians, and each kind's CPU per sandbox life (its busy share of the
    median CPU per life)."""
    med = lambda xs: statistics.median(xs) if xs else None  # noqa: E731
    cpu = med([r["cpu_ms_per_cold_start"] for r in runs if r["cpu_ms_per_cold_start"] is not None])
    kinds = sorted({k for r in runs for k in r["busy_share_by_kind"]})
    shares = {k: med([r["busy_share_by_kind"].get(k, 0.0) for r in runs]) for k in kinds}
    top = {}
    for r in runs:
        for share, sym in r["top"]:
            top.setdefault(sym, []).append(share)
    top_rows = sorted(((statistics.median(v + [0.0] * (len(runs) - len(v))), s) for s, v in top.items()), reverse=True)
    return {
        "rounds": len(runs),
        "busy_share_in_kernel_pct": med([r["busy_share_in_kernel"] for r in runs]),
        "cold_per_s": med([r["cold_per_s"] for r in runs]),
        "cold_p99_ms": med([r["cold_p99_ms"] for r in runs]),
        "cpu_ms_per_cold_start": cpu,
        "by_kind": {k: {"busy_share_pct": s, "cpu_ms_per_life": (cpu or 0.0) * s / 100.0} for k, s in shares.items()},
        "top": [{"busy_share_pct": s, "function": f, "cpu_ms_per_life": (cpu or 0.0) * s / 100.0} for s, f in top_rows[:25]],
        "runs": runs,
    }


def markdown(result):
    builds = result["builds"]
    names = [b["label"] for b in builds]
    lines = [f"CPU of a sandbox's life: `sprout bench sandboxes --backends {result['backend']} --concurrency "
             f"{result['concurrency']}`, perf sampling the worker's CPU; {result['machine']}; medians of "
             f"{builds[0]['rounds']} alternating rounds.", "",
             "| | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    row = lambda label, f: lines.append(f"| {label} | " + " | ".join(f(b) for b in builds) + " |")  # noqa: E731
    row("cold starts/s", lambda b: f"{b['cold_per_s']:.0f}")
    row("cold p99 (ms)", lambda b: f"{b['cold_p99_ms']:.1f}")
    row("**CPU per sandbox life (ms)**", lambda b: f"**{b['cpu_ms_per_cold_start']:.2f}**")
    row("  of it in the kernel", lambda b: f"{b['busy_share_in_kernel_pct']:.0f}%")
    kinds = sorted({k for b in builds for k in b["by_kind"]}, key=lambda k: -builds[-1]["by_kind"].get(k, {}).get("cpu_ms_per_life", 0))
    for k in kinds:
        row(f"  {k} (ms)", lambda b, k=k: f"{b['by_kind'].get(k, {}).get('cpu_ms_per_life', 0.0):.2f}")
    lines += ["", "Where the last build's CPU goes (process and function, share of the CPU's busy time, ms per life):", "",
              "| process, function | share | ms per life |", "|---|---:|---:|"]
    for t in builds[-1]["top"][:20]:
        lines.append(f"| {t['function']} | {t['busy_share_pct']:.1f}% | {t['cpu_ms_per_life']:.3f} |")
    return "\n".join(lines) + "\n"


def plot(result, path):
    """Stacked bars: each build's CPU per sandbox life by who spent it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    builds = result["builds"]
    kinds = sorted({k for b in builds for k in b["by_kind"]}, key=lambda k: -builds[0]["by_kind"].get(k, {}).get("cpu_ms_per_life", 0))
    fig, ax = plt.subplots(figsize=(max(5, 2.2 * len(builds)), 4.5))
    bottoms = [0.0] * len(builds)
    for kind in kinds:
        values = [b["by_kind"].get(kind, {}).get("cpu_ms_per_life", 0.0) for b in builds]
        ax.bar(range(len(builds)), values, 0.6, bottom=bottoms, label=kind)
        bottoms = [x + v for x, v in zip(bottoms, values)]
    for i, b in enumerate(builds):
        ax.annotate(f"{b['cpu_ms_per_cold_start']:.2f} ms\n{b['cold_per_s']:.0f}/s, p99 {b['cold_p99_ms']:.0f} ms",
                    (i, bottoms[i]), ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(builds)))
    ax.set_xticklabels([b["label"] for b in builds], fontsize=8)
    ax.set_ylabel("CPU per sandbox life, ms")
    ax.set_ylim(0, max(bottoms) * 1.55)
    ax.set_title(f"{result['backend']}, concurrency {result['concurrency']}: who spends a sandbox's life", fontsize=9)
    ax.legend(fontsize=7, loc="upper center", ncol=3)
    fig.suptitle(result["machine"], fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def machine():
    model = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
    return f"{os.cpu_count()} cores ({model}), {os.uname().release}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--binary", action="append", help="a sprout binary (repeat to compare builds); "
                        "default this checkout's target/release/sprout")
    parser.add_argument("--label", action="append", help="a name for each --binary, in order")
    parser.add_argument("--backend", default="sock-isolated")
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--seconds", type=float, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--worker-cpu", type=int, default=0, help="the CPU the bench pins the worker to (its default 0)")
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--out", default="bench/results/sandbox-life")
    args = parser.parse_args()
    if not shutil.which("perf"):
        sys.exit("perf is needed (Debian: apt-get install linux-perf)")
    binaries = [Path(b).resolve() for b in (args.binary or [REPO / "target" / "release" / "sprout"])]
    labels = (args.label or []) + [str(b) for b in binaries[len(args.label or []):]]
    scratch = tempfile.mkdtemp(prefix="sprout-life-")
    runs = {i: [] for i in range(len(binaries))}
    for r in range(args.rounds):
        order = range(len(binaries)) if r % 2 == 0 else reversed(range(len(binaries)))
        for i in order:
            run = profile_once(binaries[i], args, scratch)
            runs[i].append(run)
            print(f"round {r + 1}/{args.rounds} {labels[i]}: {run['cold_per_s']:.0f}/s, "
                  f"{run['cpu_ms_per_cold_start']:.2f} ms CPU per life", file=sys.stderr)
    result = {"backend": args.backend, "concurrency": args.concurrency, "seconds": args.seconds, "machine": machine(),
              "builds": [{"label": labels[i], "binary": str(binaries[i]), **summarize(runs[i])} for i in range(len(binaries))]}
    write_results(args.out, result, markdown, plot)


if __name__ == "__main__":
    main()
