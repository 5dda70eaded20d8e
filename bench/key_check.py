"""What a key check costs a warm invocation (issue 52: at most 2%): one worker pinned to a CPU,
one tenant owning three copies of a no-op lambda, and warm requests in a closed loop from
another CPU on one connection, in rounds rotating the order of three variants:

- `open`: a lambda that wants no key, called without credentials (OpenLambda's way);
- `open, key sent`: the same lambda with the tenant's key in `Authorization` (the worker
  takes it out of what the handler sees, as for the keyed lambda: the same work but the check);
- `keyed`: a lambda whose ol.yaml says `auth: key`, called with the tenant's key (the check:
  the key's digest, its lookup, the owner's).

Each round's p50 and the mean per variant; the figures are the medians of the rounds, with
`keyed / open, key sent` (the check alone) and `keyed / open`. The worker's side of a check is
also timed alone (`cargo run --release -p sprout-api --example key_check`: nanoseconds per
check among 100 tenants of 3 keys) and given as a share of the keyed variant's p50, since a
shared VM's round-to-round noise is larger than the check. CPUs are kept awake
(bench/cpus_awake.py) so a halted vCPU's wake-up does not swamp a 0.2 ms request. JSON, a
markdown table and a plot go to `--out`.

    python3 bench/key_check.py --rounds 6 --seconds 4
"""

import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench_worker import REPO, admin, running_worker, upload
from cpus_awake import cpus_awake
from profile_sandbox_life import machine, write_results

SECTIONS = """[sandbox]
cpuset = "{cpu}"

[instances]
keep_warm = true
max_per_lambda = 1
"""
NOOP = "def f(event):\n    return None\n"
VARIANTS = ("open", "open, key sent", "keyed")


def measure(port, lambda_name, key, seconds):
    """Latencies (s) of warm requests for `seconds` on one connection."""
    conn = http.client.HTTPConnection("127.0.0.1", port)
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"

    def call():
        conn.request("POST", f"/run/{lambda_name}", body=b"null", headers=headers)
        reply = conn.getresponse()
        reply.read()
        if reply.status != 200:
            sys.exit(f"/run/{lambda_name} answered {reply.status}")

    for _ in range(200):
        call()
    latencies, began = [], time.perf_counter()
    while time.perf_counter() - began < seconds:
        t = time.perf_counter()
        call()
        latencies.append(time.perf_counter() - t)
    conn.close()
    return latencies


def markdown(result):
    lines = [result["method"], "", f"Machine: {result['machine']}.", "",
             "| variant | p50 (ms, median of rounds) | mean (ms) | rounds' p50 range |", "|---|---:|---:|---:|"]
    for v in VARIANTS:
        f = result["figures"][v]
        lines.append(f"| {v} | {f['p50_ms']:.4f} | {f['mean_ms']:.4f} | {min(f['round_p50s_ms']):.4f}-{max(f['round_p50s_ms']):.4f} |")
    r = result["ratios"]
    alone = result["check_alone"]
    lines += ["", f"The check alone, timed in the worker's code: {alone['ns_per_check'] / 1e3:.2f} µs "
              f"({alone['tenants']} tenants of {alone['keys_each']} keys), **{r['check_share_of_keyed_p50'] * 100:.2f}%** "
              "of the keyed variant's warm p50."]
    lines += ["", f"The check alone (keyed / open, key sent): p50 **{r['check_p50']:.3f}x**, mean {r['check_mean']:.3f}x; "
              f"keyed / open: p50 {r['keyed_vs_open_p50']:.3f}x, mean {r['keyed_vs_open_mean']:.3f}x."]
    return "\n".join(lines) + "\n"


def plot(result, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3))
    for v in VARIANTS:
        p50s = result["figures"][v]["round_p50s_ms"]
        ax.plot(range(1, len(p50s) + 1), p50s, "o-", label=v)
    ax.set_xlabel("round")
    ax.set_ylabel("warm p50 (ms)")
    ax.set_title(f"a key check: {result['ratios']['check_p50']:.3f}x the same request without it", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--binary", default=str(REPO / "target/release/sprout"))
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--seconds", type=float, default=4)
    parser.add_argument("--worker-cpu", default="0")
    parser.add_argument("--client-cpu", type=int, default=1)
    parser.add_argument("--out", default="bench/results/key-check")
    args = parser.parse_args()
    os.sched_setaffinity(0, {args.client_cpu})
    port = 5790
    samples = {v: [] for v in VARIANTS}
    with running_worker(args.binary, port, args.worker_cpu, SECTIONS.format(cpu=args.worker_cpu), "key-check") as work:
        token = Path(work, "api-token").read_text().strip()
        admin(port, token, "POST", "/tenants", json.dumps({"name": "bench"}).encode())
        key = admin(port, token, "POST", "/tenants/bench/keys", b"{}")["key"]
        upload(port, key, "open-fn", {"f.py": NOOP})
        upload(port, key, "keyed-fn", {"f.py": NOOP, "ol.yaml": "auth: key\n"})
        runs = {"open": ("open-fn", None), "open, key sent": ("open-fn", key), "keyed": ("keyed-fn", key)}
        with cpus_awake(True):
            for i in range(args.rounds):
                order = VARIANTS[i % 3:] + VARIANTS[:i % 3]
                for v in order:
                    samples[v].append(measure(port, *runs[v], args.seconds))
                print(f"round {i + 1}/{args.rounds}: " + ", ".join(
                    f"{v} p50 {statistics.median(samples[v][-1]) * 1e3:.4f} ms" for v in VARIANTS), file=sys.stderr)
    figures = {}
    for v in VARIANTS:
        p50s = [statistics.median(r) * 1e3 for r in samples[v]]
        means = [statistics.fmean(r) * 1e3 for r in samples[v]]
        figures[v] = {"p50_ms": statistics.median(p50s), "mean_ms": statistics.median(means), "round_p50s_ms": p50s,
                      "requests": sum(len(r) for r in samples[v])}
    ratio = lambda a, b, k: figures[a][k] / figures[b][k]  # noqa: E731
    alone = json.loads(subprocess.run(["cargo", "run", "--release", "-q", "-p", "sprout-api", "--example", "key_check"],
                                      check=True, capture_output=True, text=True, cwd=REPO).stdout)
    result = {
        "method": f"`python3 bench/key_check.py --rounds {args.rounds} --seconds {args.seconds}`: a worker on CPU "
                  f"{args.worker_cpu}, the client (http.client, one connection) on CPU {args.client_cpu}, CPUs kept awake; "
                  "three variants in rotating order each round; medians of the rounds' figures.",
        "machine": machine(),
        "figures": figures,
        "check_alone": alone,
        "ratios": {"check_share_of_keyed_p50": alone["ns_per_check"] / 1e6 / figures["keyed"]["p50_ms"],
                   "check_p50": ratio("keyed", "open, key sent", "p50_ms"),
                   "check_mean": ratio("keyed", "open, key sent", "mean_ms"),
                   "keyed_vs_open_p50": ratio("keyed", "open", "p50_ms"),
                   "keyed_vs_open_mean": ratio("keyed", "open", "mean_ms")},
    }
    write_results(args.out, result, markdown, plot)


if __name__ == "__main__":
    main()
