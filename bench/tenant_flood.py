"""Does a tenant flooding its quota slow another tenant? (issue 52: the other's warm p99 within
1.2x of alone). One worker pinned to a CPU; two tenants: `quiet`, whose no-op lambda one
client calls in a closed loop on one keep-alive connection (only warm answers count), and
`flood`, whose lambda spends `--busy-ms` (2) ms of CPU a call under a quota of `--quota` invocations a
second (and 4 in flight), called at `--times` (10) times that rate, paced, from a separate
process of 8 threads. Rounds alternate the quiet tenant alone and beside the flood (ABBA...);
per phase its p50 and p99, the figures the medians of the rounds, and the flood's admitted
and refused rates. Worker on CPU 0, clients on CPU 1, CPUs kept awake (bench/cpus_awake.py).
JSON, a markdown table and a plot go to `--out`.

    python3 bench/tenant_flood.py --rounds 6 --seconds 5
"""

import argparse
import http.client
import json
import multiprocessing
import os
import statistics
import sys
import threading
import time
from pathlib import Path

from bench_worker import REPO, admin, running_worker, upload
from cpus_awake import cpus_awake
from profile_sandbox_life import machine, write_results

SECTIONS = """[sandbox]
cpuset = "{cpu}"

[instances]
max_per_lambda = 4
"""
QUIET = "def f(event):\n    return event\n"
BUSY = """import time


def f(event):
    t0 = time.process_time()
    while time.process_time() - t0 < {seconds}:
        pass
    return None
"""
THREADS = 8


def flood(port, rate, seconds, out):
    """Send `rate` requests a second for `seconds` from THREADS paced threads; counts by status."""
    counts, lock = {}, threading.Lock()

    def sender(offset):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        interval = THREADS / rate
        start = time.monotonic() + offset * interval / THREADS
        i = 0
        while True:
            due = start + i * interval
            if due - start > seconds:
                break
            delay = due - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            try:
                conn.request("POST", "/run/busy", body=b"null", headers={"Content-Type": "application/json"})
                reply = conn.getresponse()
                reply.read()
                status = reply.status
            except OSError:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
                status = "error"
            with lock:
                counts[status] = counts.get(status, 0) + 1
            i += 1

    threads = [threading.Thread(target=sender, args=(k,)) for k in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out.put(counts)


def victim(port, seconds):
    """Warm latencies (s) of the quiet tenant's lambda for `seconds`, and the answers not warm."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    latencies, other, began = [], 0, time.perf_counter()
    while time.perf_counter() - began < seconds:
        t = time.perf_counter()
        conn.request("POST", "/run/quiet", body=b'{"hello": "world"}', headers={"Content-Type": "application/json"})
        reply = conn.getresponse()
        reply.read()
        elapsed = time.perf_counter() - t
        if reply.status == 200 and reply.headers.get("X-Sprout-Start") == "warm":
            latencies.append(elapsed)
        else:
            other += 1
    conn.close()
    return latencies, other


def quantile(values, q):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def markdown(result):
    f, r = result["figures"], result["ratios"]
    lines = [result["method"], "", f"Machine: {result['machine']}.", "",
             "| quiet tenant's warm calls | p50 (ms) | p99 (ms) | rounds' p99 range (ms) |", "|---|---:|---:|---:|"]
    for phase in ("alone", "beside the flood"):
        p = f[phase]
        lines.append(f"| {phase} | {p['p50_ms']:.3f} | {p['p99_ms']:.3f} | {min(p['round_p99s_ms']):.3f}-{max(p['round_p99s_ms']):.3f} |")
    fl = result["flood"]
    lines += ["", f"Beside the flood / alone: p99 **{r['p99']:.3f}x**, p50 {r['p50']:.3f}x (target: p99 within 1.2x).",
              "", f"The flood: {fl['sent_per_s']:.0f} requests/s sent at {result['times']}x a quota of "
              f"{result['quota']}/s, {result['busy_ms']} ms of CPU a call; "
              f"{fl['admitted_per_s']:.1f}/s admitted, {fl['refused_per_s']:.0f}/s refused "
              f"(429 quota_exceeded), {fl['other']} other answers."]
    return "\n".join(lines) + "\n"


def plot(result, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3))
    for phase, color in (("alone", "tab:gray"), ("beside the flood", "tab:red")):
        p99s = result["figures"][phase]["round_p99s_ms"]
        ax.plot(range(1, len(p99s) + 1), p99s, "o-", color=color, label=f"{phase} (p99)")
    ax.set_xlabel("round")
    ax.set_ylabel("quiet tenant's warm p99 (ms)")
    ax.set_title(f"a tenant flooding at {result['times']}x its quota: p99 {result['ratios']['p99']:.2f}x alone", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--binary", default=str(REPO / "target/release/sprout"))
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--seconds", type=float, default=5)
    parser.add_argument("--quota", type=float, default=50, help="the flooding tenant's invocations a second")
    parser.add_argument("--times", type=float, default=10, help="how many times its quota it sends")
    parser.add_argument("--busy-ms", type=float, default=2, help="CPU milliseconds each of the flood's calls spends")
    parser.add_argument("--worker-cpu", default="0")
    parser.add_argument("--client-cpu", type=int, default=1)
    parser.add_argument("--out", default="bench/results/tenant-flood")
    args = parser.parse_args()
    os.sched_setaffinity(0, {args.client_cpu})
    port = 5791
    phases = {"alone": [], "beside the flood": []}
    floods, other = [], 0
    with running_worker(args.binary, port, args.worker_cpu, SECTIONS.format(cpu=args.worker_cpu), "tenant-flood") as work:
        token = Path(work, "api-token").read_text().strip()
        keys = {}
        for name in ("quiet", "flood"):
            admin(port, token, "POST", "/tenants", json.dumps({"name": name}).encode())
            keys[name] = admin(port, token, "POST", f"/tenants/{name}/keys", b"{}")["key"]
        quotas = {"invocations_per_s": args.quota, "concurrent": 4}
        admin(port, token, "PUT", "/tenants/flood/quotas", json.dumps(quotas).encode())
        upload(port, keys["quiet"], "quiet", {"f.py": QUIET})
        upload(port, keys["flood"], "busy", {"f.py": BUSY.format(seconds=args.busy_ms / 1e3)})
        victim(port, 1.0)
        with cpus_awake(True):
            for i in range(args.rounds):
                order = ("alone", "beside the flood") if i % 2 == 0 else ("beside the flood", "alone")
                for phase in order:
                    process, queue = None, multiprocessing.Queue()
                    if phase != "alone":
                        process = multiprocessing.Process(target=flood, args=(port, args.quota * args.times,
                                                                              args.seconds + 1.5, queue))
                        process.start()
                        time.sleep(1.0)  # the flood under way first
                    latencies, not_warm = victim(port, args.seconds)
                    other += not_warm
                    phases[phase].append(latencies)
                    if process:
                        floods.append(queue.get(timeout=120))
                        process.join()
                print(f"round {i + 1}/{args.rounds}: " + ", ".join(
                    f"{p} p99 {quantile(phases[p][-1], 0.99) * 1e3:.3f} ms" for p in phases) + f"; flood {floods[-1]}",
                    file=sys.stderr)
    figures = {}
    for phase, rounds in phases.items():
        p50s = [quantile(r, 0.5) * 1e3 for r in rounds]
        p99s = [quantile(r, 0.99) * 1e3 for r in rounds]
        figures[phase] = {"p50_ms": statistics.median(p50s), "p99_ms": statistics.median(p99s), "round_p50s_ms": p50s,
                          "round_p99s_ms": p99s, "calls": sum(len(r) for r in rounds)}
    span = len(floods) * (args.seconds + 1.5)
    admitted = sum(c.get(200, 0) for c in floods)
    refused = sum(c.get(429, 0) for c in floods)
    result = {
        "method": f"`python3 bench/tenant_flood.py --rounds {args.rounds} --seconds {args.seconds} --quota {args.quota} "
                  f"--times {args.times} --busy-ms {args.busy_ms}`: a worker on CPU {args.worker_cpu}, the clients on CPU "
                  f"{args.client_cpu}, CPUs kept "
                  "awake; phases alternating ABBA; medians of the rounds' figures.",
        "machine": machine(),
        "quota": args.quota,
        "times": args.times,
        "busy_ms": args.busy_ms,
        "figures": figures,
        "ratios": {"p99": figures["beside the flood"]["p99_ms"] / figures["alone"]["p99_ms"],
                   "p50": figures["beside the flood"]["p50_ms"] / figures["alone"]["p50_ms"]},
        "flood": {"sent_per_s": sum(sum(c.values()) for c in floods) / span, "admitted_per_s": admitted / span,
                  "refused_per_s": refused / span,
                  "other": sum(v for c in floods for k, v in c.items() if k not in (200, 429)),
                  "quiet_not_warm": other},
    }
    write_results(args.out, result, markdown, plot)


if __name__ == "__main__":
    main()
