"""Where a warm request's CPU goes: a worker of each build (`--binary`, repeatable) pinned to
one CPU, a no-op lambda, warm requests in a closed loop from another CPU, and `perf record -e
cpu-clock` sampling the worker's CPU meanwhile. Each sample is charged to its process kind
(the worker's threads, the handler, the worker's log writer) and function, and divided by the
requests: microseconds of CPU per warm request. Builds run alternately `--rounds` times; the
figures are the rounds' medians. JSON, a markdown table and a plot go to `--out`.

    python3 bench/profile_warm_path.py --binary /var/tmp/sprout-ab/<sha>/target/release/sprout \
        --label before --binary target/release/sprout --label this --rounds 3

The client is Python's http.client on one connection, so requests/s here are the client's
bound as much as the worker's; the CPU per request is the worker CPU's alone. Needs perf.
"""

import argparse
import http.client
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "python"))
from bench_worker import wait_started  # noqa: E402
from cpus_awake import NAME, cpus_awake  # noqa: E402
from profile_sandbox_life import checkout_of, machine, write_results  # noqa: E402

CONFIG = """[worker]
listen = "127.0.0.1:{port}"
name = "warm-profile-{port}"
log = "warn"

[sandbox]
backend = "sock"
cpuset = "{cpu}"
seccomp = true

[network]
isolate = true

[instances]
keep_warm = true
max_per_lambda = 1
"""


def kind_of(comm):
    if comm.startswith(NAME):
        return None  # bench/cpus_awake.py's spinner
    if comm.startswith("python"):
        return "handler"
    if comm.startswith("sprout-logs"):
        return "log writer"
    if comm.startswith(("tokio", "sprout")):
        return "worker"
    return "other"


def perf_rows(perf_data, sort):
    out = subprocess.run(["perf", "report", "-i", perf_data, "--stdio", "--no-children", "--sort", sort, "-g", "none",
                          "--percent-limit", "0.05"], capture_output=True, text=True, check=True).stdout
    return [(float(m.group(1)), m.group(2).split(None, 1)) for m in re.finditer(r"^\s+([\d.]+)%\s+(\S.*\S)\s*$", out, re.M)]


def profile_once(binary, args, port):
    """One worker of `binary`: requests/s, p50, and microseconds of its CPU per request by kind
    and by (process, function)."""
    work = tempfile.mkdtemp(prefix="warm-path-", dir=args.scratch)
    Path(work, "config.toml").write_text(CONFIG.format(port=port, cpu=args.worker_cpu))
    tree = checkout_of(binary)
    subprocess.run([str(binary), "worker", "init", work], check=True, capture_output=True, cwd=tree)
    log = open(os.path.join(work, "worker.log"), "w")
    worker = subprocess.Popen(["taskset", "-c", str(args.worker_cpu), str(binary), "worker", "up", work], stdout=log,
                              stderr=log, cwd=tree)
    try:
        client = wait_started(port, worker, work, 300, f"{binary}: the worker")
        lambda_dir = Path(work, "noop")
        lambda_dir.mkdir()
        (lambda_dir / "f.py").write_text("def f(event):\n    return None\n")
        client.deploy(str(lambda_dir))
        conn = http.client.HTTPConnection("127.0.0.1", port)

        def call():
            conn.request("POST", "/run/noop", body=b"null", headers={"Content-Type": "application/json"})
            reply = conn.getresponse()
            reply.read()
            if reply.status != 200:
                sys.exit(f"{binary}: /run/noop answered {reply.status}")

        for _ in range(300):
            call()
        perf_data = os.path.join(work, "perf.data")
        perf = subprocess.Popen(["perf", "record", "-q", "-e", "cpu-clock", "-F", "4000", "-C", str(args.worker_cpu), "-o",
                                 perf_data], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(0.5)
        latencies, began = [], time.perf_counter()
        while time.perf_counter() - began < args.seconds:
            t = time.perf_counter()
            call()
            latencies.append(time.perf_counter() - t)
        window = time.perf_counter() - began
        perf.send_signal(2)
        perf.wait()
    finally:
        worker.terminate()
        worker.wait()
        subprocess.run([str(binary), "worker", "down", work], capture_output=True)
    # perf sampled a little longer than the loop ran (its start and stop): its share of
    # samples is taken over the loop's window, an upper bound by that margin.
    recorded = window + 0.5
    per_request = lambda share: share / 100.0 * recorded * 1e6 / len(latencies)  # noqa: E731
    kinds, functions = {}, {}
    for share, (comm, *rest) in perf_rows(perf_data, "comm,sym"):
        if comm.startswith("swapper") or kind_of(comm) is None:
            continue
        function = re.sub(r"^\[.\]\s+", "", rest[0] if rest else "?")[:90]
        kinds[kind_of(comm)] = kinds.get(kind_of(comm), 0.0) + per_request(share)
        key = f"{kind_of(comm)}: {function}"
        functions[key] = functions.get(key, 0.0) + per_request(share)
    shutil.rmtree(work, ignore_errors=True)
    latencies.sort()
    return {"requests_per_s": len(latencies) / window, "p50_ms": latencies[len(latencies) // 2] * 1e3,
            "cpu_us_per_request": sum(kinds.values()), "by_kind_us": kinds, "by_function_us": functions}


def summarize(runs):
    med = statistics.median
    keys = sorted({k for r in runs for k in r["by_function_us"]})
    functions = {k: med([r["by_function_us"].get(k, 0.0) for r in runs]) for k in keys}
    kinds = sorted({k for r in runs for k in r["by_kind_us"]})
    return {"rounds": len(runs), "requests_per_s": med([r["requests_per_s"] for r in runs]),
            "p50_ms": med([r["p50_ms"] for r in runs]), "cpu_us_per_request": med([r["cpu_us_per_request"] for r in runs]),
            "by_kind_us": {k: med([r["by_kind_us"].get(k, 0.0) for r in runs]) for k in kinds},
            "by_function_us": dict(sorted(functions.items(), key=lambda kv: -kv[1])), "runs": runs}


def markdown(result):
    builds = result["builds"]
    names = [b["label"] for b in builds]
    lines = [f"CPU of a warm request (no-op lambda, sock with seccomp and a network namespace, one connection); "
             f"{result['machine']}; medians of {builds[0]['rounds']} alternating rounds"
             f"{'; CPUs kept awake (bench/cpus_awake.py)' if result.get('cpus_kept_awake') else ''}.", "",
             "| | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    lines.append("| requests/s (the client's bound too) | " + " | ".join(f"{b['requests_per_s']:.0f}" for b in builds) + " |")
    lines.append("| p50 (ms) | " + " | ".join(f"{b['p50_ms']:.3f}" for b in builds) + " |")
    lines.append("| **CPU per request (µs)** | " + " | ".join(f"**{b['cpu_us_per_request']:.0f}**" for b in builds) + " |")
    for kind in sorted({k for b in builds for k in b["by_kind_us"]}):
        lines.append(f"| {kind} (µs) | " + " | ".join(f"{b['by_kind_us'].get(kind, 0.0):.1f}" for b in builds) + " |")
    first, last = builds[0]["by_function_us"], builds[-1]["by_function_us"]
    grown = sorted(set(first) | set(last), key=lambda k: -(last.get(k, 0.0) - first.get(k, 0.0)))[:25]
    lines += ["", f"What grew most from {names[0]} to {names[-1]} (µs per request):", "",
              f"| process kind: function | {names[0]} | {names[-1]} |", "|---|---:|---:|"]
    lines += [f"| {k} | {first.get(k, 0.0):.2f} | {last.get(k, 0.0):.2f} |" for k in grown]
    return "\n".join(lines) + "\n"


def plot(result, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    builds = result["builds"]
    kinds = sorted({k for b in builds for k in b["by_kind_us"]})
    fig, ax = plt.subplots(figsize=(max(4.5, 2.0 * len(builds)), 4))
    bottoms = [0.0] * len(builds)
    for kind in kinds:
        values = [b["by_kind_us"].get(kind, 0.0) for b in builds]
        ax.bar(range(len(builds)), values, 0.6, bottom=bottoms, label=kind)
        bottoms = [x + v for x, v in zip(bottoms, values)]
    for i, b in enumerate(builds):
        ax.annotate(f"{b['cpu_us_per_request']:.0f} µs\n{b['requests_per_s']:.0f}/s", (i, bottoms[i]), ha="center",
                    va="bottom", fontsize=8)
    ax.set_xticks(range(len(builds)))
    ax.set_xticklabels([b["label"] for b in builds], fontsize=8)
    ax.set_ylabel("worker CPU per warm request, µs")
    ax.set_ylim(0, max(bottoms) * 1.4)
    ax.legend(fontsize=7)
    ax.set_title(result["machine"], fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--binary", action="append", required=True, help="a sprout binary (repeat to compare builds)")
    parser.add_argument("--label", action="append", help="a name for each --binary, in order")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5)
    parser.add_argument("--worker-cpu", type=int, default=0)
    parser.add_argument("--client-cpu", type=int, default=1)
    parser.add_argument("--port", type=int, default=5720)
    parser.add_argument("--scratch", default="/var/tmp")
    parser.add_argument("--out", default="bench/results/warm-path")
    parser.add_argument("--keep-cpus-awake", action="store_true",
                        help="an idle-class spinner per CPU meanwhile (bench/cpus_awake.py; left out of the profile)")
    args = parser.parse_args()
    if not shutil.which("perf"):
        sys.exit("perf is needed (Debian: apt-get install linux-perf)")
    os.sched_setaffinity(0, {args.client_cpu})
    binaries = [Path(b).resolve() for b in args.binary]
    labels = (args.label or []) + [str(b) for b in binaries[len(args.label or []):]]
    runs = {i: [] for i in range(len(binaries))}
    with cpus_awake(args.keep_cpus_awake, {args.worker_cpu, args.client_cpu}):
        for r in range(args.rounds):
            for i in (range(len(binaries)) if r % 2 == 0 else reversed(range(len(binaries)))):
                run = profile_once(binaries[i], args, args.port + i)
                runs[i].append(run)
                print(f"round {r + 1}/{args.rounds} {labels[i]}: {run['requests_per_s']:.0f}/s, "
                      f"{run['cpu_us_per_request']:.0f} µs CPU per request", file=sys.stderr)
    result = {"machine": machine(), "seconds": args.seconds, "cpus_kept_awake": args.keep_cpus_awake,
              "builds": [{"label": labels[i], "binary": str(binaries[i]), **summarize(runs[i])} for i in runs]}
    write_results(args.out, result, markdown, plot)


if __name__ == "__main__":
    main()
