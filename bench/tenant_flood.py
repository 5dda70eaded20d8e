"""Does a tenant flooding its quota slow another tenant? (issue 52: a tenant flooding invocations,
uploads or logs at 10x its quota leaves the other's warm p99 within 1.2x of alone). One worker
pinned to a CPU; two tenants: `quiet`, whose no-op lambda one client calls in a closed loop on
one keep-alive connection (only warm answers count), and `flood`, which a separate process of 8
paced threads floods at `--times` (10) times its quota, by `--kind`:

- `invocations` (the default): its lambda spends `--busy-ms` (2) ms of CPU a call under a quota
  of `--quota` (50) invocations a second (and 4 in flight), called at times x quota a second.
- `uploads`: a `files_mb` quota of `--files-mb` (4) MB; `PUT /blobs/<random name>` of
  `--blob-kb` (256) KB each with its key, at times x files_mb*1024/blob_kb uploads a second
  (times what the quota holds, every second), never deleted: past the first files_mb MB every
  upload is refused (413 files_quota_exceeded, `Connection: close`: the body is left unread).
  An upload that finds its connection closed anyway is sent again on a new one (counted,
  `resent_per_s`); one unanswered on a new connection counts as an error.
- `logs`: a `log_kb_s` quota of `--log-kb-s` (64) KB/s (invocations unlimited); its lambda
  prints `--print-kb` (64) KB of 100-byte lines a call, called at times x log_kb_s/print_kb a
  second; the output dropped is read from /metrics
  (`sprout_tenant_log_dropped_bytes_total`) before and after each flood phase.

Rounds alternate the quiet tenant alone and beside the flood (ABBA...); per phase its p50 and
p99, the figures the medians of the rounds, and what the flood sent, and had admitted or refused
(kept or dropped). Worker on CPU 0, clients on CPU 1, CPUs kept awake (bench/cpus_awake.py).
JSON, a markdown table and a plot go to `--out` (default bench/results/tenant-flood, with
`-<kind>` for uploads and logs).

    python3 bench/tenant_flood.py --rounds 6 --seconds 5 [--kind uploads|logs]
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
import urllib.request
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
PRINTER = """import sys

OUTPUT = ("x" * 99 + "\\n") * {lines}


def f(event):
    sys.stdout.write(OUTPUT)
    sys.stdout.flush()
    return None
"""
LINE_BYTES = 100
THREADS = 8
REFUSED = {"invocations": 429, "uploads": 413, "logs": 429}


def flood(port, rate, seconds, out, method="POST", path="/run/busy", body=b"null", headers=None):
    """Send `rate` requests a second for `seconds` from THREADS paced threads (a `{}` in `path`:
    a new random name each time); counts by status ("error": no answer on a new connection) and
    the requests sent again on a new connection after the worker had closed a used one (as it
    may after refusing an upload without reading its body)."""
    counts, lock, resent = {}, threading.Lock(), [0]
    headers = headers or {"Content-Type": "application/json"}

    def send(conn):
        conn.request(method, path.format(os.urandom(8).hex()), body=body, headers=headers)
        reply = conn.getresponse()
        reply.read()
        return reply.status

    def sender(offset):
        conn, used = http.client.HTTPConnection("127.0.0.1", port, timeout=60), False
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
            for attempt in (1, 2):
                try:
                    status, used = send(conn), True
                    break
                except (OSError, http.client.HTTPException):
                    conn.close()
                    conn, stale, used = http.client.HTTPConnection("127.0.0.1", port, timeout=60), used, False
                    status = "error"
                    if not stale or attempt == 2:
                        break
                    with lock:
                        resent[0] += 1
            with lock:
                counts[status] = counts.get(status, 0) + 1
            i += 1

    threads = [threading.Thread(target=sender, args=(k,)) for k in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out.put((counts, resent[0]))


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


def log_dropped(port, token, tenant="flood"):
    """`tenant`'s output dropped past its log_kb_s so far (bytes), from /metrics."""
    request = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=60) as reply:
        text = reply.read().decode()
    series = f'sprout_tenant_log_dropped_bytes_total{{tenant="{tenant}"}} '
    return next((int(float(line[len(series):])) for line in text.splitlines() if line.startswith(series)), 0)


def prepare(args, port, token, keys):
    """The flood tenant's quotas and lambdas for `args.kind`; the flood's rate and request."""
    if args.kind == "invocations":
        quotas, request = {"invocations_per_s": args.quota, "concurrent": 4}, {}
        lambdas, rate = {"busy": BUSY.format(seconds=args.busy_ms / 1e3)}, args.quota * args.times
    elif args.kind == "uploads":
        quotas, lambdas = {"files_mb": args.files_mb}, {}
        request = {"method": "PUT", "path": "/blobs/flood-{}", "body": os.urandom(int(args.blob_kb * 1024)),
                   "headers": {"Authorization": f"Bearer {keys['flood']}", "Content-Type": "application/octet-stream"}}
        rate = args.times * args.files_mb * 1024 / args.blob_kb
    else:
        quotas, request = {"log_kb_s": args.log_kb_s}, {"path": "/run/printer"}
        lambdas, rate = {"printer": PRINTER.format(lines=args.lines)}, args.times * args.log_kb_s / args.print_kb
    admin(port, token, "PUT", "/tenants/flood/quotas", json.dumps(quotas).encode())
    upload(port, keys["quiet"], "quiet", {"f.py": QUIET})
    for name, source in lambdas.items():
        upload(port, keys["flood"], name, {"f.py": source})
    return rate, request


def quantile(values, q):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def flood_sentence(result):
    """What the flood sent, and what became of it."""
    fl, kind, times = result["flood"], result["kind"], result["times"]
    if kind == "invocations":
        return (f"The flood: {fl['sent_per_s']:.0f} requests/s sent at {times}x a quota of "
                f"{result['quota']}/s, {result['busy_ms']} ms of CPU a call; "
                f"{fl['admitted_per_s']:.1f}/s admitted, {fl['refused_per_s']:.0f}/s refused "
                f"(429 quota_exceeded), {fl['other']} other answers.")
    if kind == "uploads":
        holds = result["files_mb"] * 1024 / result["blob_kb"]
        return (f"The flood: {fl['sent_per_s']:.0f} uploads/s of {result['blob_kb']} KB "
                f"({fl['sent_per_s'] * result['blob_kb'] / 1024:.1f} MB/s) sent to new blob names, never deleted, at {times}x "
                f"what a files_mb quota of {result['files_mb']} MB holds ({holds:.0f} uploads) a second; "
                f"{fl['admitted']} admitted in all ({fl['admitted_per_s']:.2f}/s), {fl['refused_per_s']:.0f}/s refused "
                f"(413 files_quota_exceeded), {fl['other'] - fl['errors']} other answers, {fl['errors']} unanswered; "
                f"{fl['resent_per_s']:.1f}/s sent again after finding their connection closed.")
    return (f"The flood: {fl['sent_per_s']:.1f} calls/s of a lambda printing {result['print_kb']} KB of 100-byte lines a "
            f"call, {fl['output_kb_s']:.0f} KB/s of output at {times}x a log_kb_s quota of {result['log_kb_s']} KB/s; "
            f"{fl['admitted_per_s']:.1f} calls/s answered 200, {fl['other']} other answers; of their output "
            f"{fl['kept_kb_s']:.0f} KB/s kept and {fl['dropped_kb_s']:.0f} KB/s dropped "
            f"(sprout_tenant_log_dropped_bytes_total).")


def markdown(result):
    f, r = result["figures"], result["ratios"]
    lines = [result["method"], "", f"Machine: {result['machine']}.", "",
             "| quiet tenant's warm calls | p50 (ms) | p99 (ms) | rounds' p99 range (ms) |", "|---|---:|---:|---:|"]
    for phase in ("alone", "beside the flood"):
        p = f[phase]
        lines.append(f"| {phase} | {p['p50_ms']:.3f} | {p['p99_ms']:.3f} | {min(p['round_p99s_ms']):.3f}-{max(p['round_p99s_ms']):.3f} |")
    lines += ["", f"Beside the flood / alone: p99 **{r['p99']:.3f}x**, p50 {r['p50']:.3f}x (target: p99 within 1.2x).",
              "", flood_sentence(result)]
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
    ax.set_title(f"a tenant flooding {result['kind']} at {result['times']}x its quota: "
                 f"p99 {result['ratios']['p99']:.2f}x alone", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--binary", default=str(REPO / "target/release/sprout"))
    parser.add_argument("--kind", choices=("invocations", "uploads", "logs"), default="invocations",
                        help="what the flooding tenant floods")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--seconds", type=float, default=5)
    parser.add_argument("--quota", type=float, default=50, help="invocations: the flooding tenant's invocations a second")
    parser.add_argument("--times", type=float, default=10, help="how many times its quota it sends")
    parser.add_argument("--busy-ms", type=float, default=2, help="invocations: CPU milliseconds each of the flood's calls spends")
    parser.add_argument("--files-mb", type=int, default=4, help="uploads: the flooding tenant's files_mb quota")
    parser.add_argument("--blob-kb", type=float, default=256, help="uploads: the KB of each upload")
    parser.add_argument("--log-kb-s", type=int, default=64, help="logs: the flooding tenant's log_kb_s quota")
    parser.add_argument("--print-kb", type=float, default=64, help="logs: the KB of lines its lambda prints a call")
    parser.add_argument("--worker-cpu", default="0")
    parser.add_argument("--client-cpu", type=int, default=1)
    parser.add_argument("--out", help="default bench/results/tenant-flood, -<kind> after it for uploads and logs")
    args = parser.parse_args()
    args.out = args.out or "bench/results/tenant-flood" + ("" if args.kind == "invocations" else f"-{args.kind}")
    args.lines = max(1, round(args.print_kb * 1024 / LINE_BYTES))
    os.sched_setaffinity(0, {args.client_cpu})
    port = 5791
    phases = {"alone": [], "beside the flood": []}
    floods, dropped, resent, other = [], [], [], 0
    with running_worker(args.binary, port, args.worker_cpu, SECTIONS.format(cpu=args.worker_cpu), "tenant-flood") as work:
        token = Path(work, "api-token").read_text().strip()
        keys = {}
        for name in ("quiet", "flood"):
            admin(port, token, "POST", "/tenants", json.dumps({"name": name}).encode())
            keys[name] = admin(port, token, "POST", f"/tenants/{name}/keys", b"{}")["key"]
        rate, request = prepare(args, port, token, keys)
        victim(port, 1.0)
        with cpus_awake(True):
            for i in range(args.rounds):
                order = ("alone", "beside the flood") if i % 2 == 0 else ("beside the flood", "alone")
                for phase in order:
                    process, queue = None, multiprocessing.Queue()
                    if phase != "alone":
                        before = log_dropped(port, token) if args.kind == "logs" else 0
                        process = multiprocessing.Process(target=flood, args=(port, rate, args.seconds + 1.5, queue),
                                                          kwargs=request)
                        process.start()
                        time.sleep(1.0)  # the flood under way first
                    latencies, not_warm = victim(port, args.seconds)
                    other += not_warm
                    phases[phase].append(latencies)
                    if process:
                        counts, again = queue.get(timeout=120)
                        floods.append(counts)
                        resent.append(again)
                        process.join()
                        dropped.append(log_dropped(port, token) - before if args.kind == "logs" else 0)
                print(f"round {i + 1}/{args.rounds}: " + ", ".join(
                    f"{p} p99 {quantile(phases[p][-1], 0.99) * 1e3:.3f} ms" for p in phases) + f"; flood {floods[-1]}"
                    + (f", {dropped[-1] / 1024 / (args.seconds + 1.5):.0f} KB/s dropped" if args.kind == "logs" else ""),
                    file=sys.stderr)
    figures = {}
    for phase, rounds in phases.items():
        p50s = [quantile(r, 0.5) * 1e3 for r in rounds]
        p99s = [quantile(r, 0.99) * 1e3 for r in rounds]
        figures[phase] = {"p50_ms": statistics.median(p50s), "p99_ms": statistics.median(p99s), "round_p50s_ms": p50s,
                          "round_p99s_ms": p99s, "calls": sum(len(r) for r in rounds)}
    span = len(floods) * (args.seconds + 1.5)
    admitted = sum(c.get(200, 0) for c in floods)
    refused = sum(c.get(REFUSED[args.kind], 0) for c in floods)
    errors = sum(c.get("error", 0) for c in floods)
    kind_args = {"invocations": f"--quota {args.quota} --times {args.times} --busy-ms {args.busy_ms}",
                 "uploads": f"--files-mb {args.files_mb} --blob-kb {args.blob_kb} --times {args.times}",
                 "logs": f"--log-kb-s {args.log_kb_s} --print-kb {args.print_kb} --times {args.times}"}[args.kind]
    params = {"invocations": {"quota": args.quota, "busy_ms": args.busy_ms},
              "uploads": {"files_mb": args.files_mb, "blob_kb": args.blob_kb},
              "logs": {"log_kb_s": args.log_kb_s, "print_kb": args.print_kb, "lines_per_call": args.lines}}[args.kind]
    result = {
        "method": f"`python3 bench/tenant_flood.py --kind {args.kind} --rounds {args.rounds} --seconds {args.seconds} "
                  f"{kind_args}`: a worker on CPU {args.worker_cpu}, the clients on CPU {args.client_cpu}, CPUs kept "
                  "awake; phases alternating ABBA; medians of the rounds' figures.",
        "machine": machine(),
        "kind": args.kind,
        **params,
        "times": args.times,
        "figures": figures,
        "ratios": {"p99": figures["beside the flood"]["p99_ms"] / figures["alone"]["p99_ms"],
                   "p50": figures["beside the flood"]["p50_ms"] / figures["alone"]["p50_ms"]},
        "flood": {"sent_per_s": sum(sum(c.values()) for c in floods) / span, "admitted_per_s": admitted / span,
                  "refused_per_s": refused / span,
                  "other": sum(v for c in floods for k, v in c.items() if k not in (200, REFUSED[args.kind])),
                  "quiet_not_warm": other},
    }
    if args.kind == "uploads":
        result["flood"].update(admitted=admitted, errors=errors, resent_per_s=sum(resent) / span)
    if args.kind == "logs":
        output = admitted * args.lines * LINE_BYTES / 1024 / span
        result["flood"].update(output_kb_s=output, dropped_kb_s=sum(dropped) / 1024 / span,
                               kept_kb_s=output - sum(dropped) / 1024 / span)
    write_results(args.out, result, markdown, plot)


if __name__ == "__main__":
    main()
