"""The page faults of a sandbox's life, by what they fell on: `sprout bench sandboxes` of one
back-end at one concurrency with `perf record -e page-faults` (every fault, its data address)
on the worker's CPU, then each handler process's faults split by the mapping the address is in
(anonymous memory, the interpreter's binary, its heap, each library) and by whether it was an
instruction fetch (the address on the faulting instruction's page).

A handler forked from a Zygote shares the Zygote's pages copy-on-write: a write faults and
copies a page; a file mapping's pages are not copied at fork at all, so each one first read
faults too. This counts both; it is what the kernel's share of a sandbox's life (about two
thirds of it, bench/profile_sandbox_life.py) is made of.

    python3 bench/faults_per_life.py --binary target/release/sprout --out bench/results/faults-per-life

Needs perf (Debian's linux-perf); page-faults is a software event, so it works on hosts
without hardware counters.
"""

import argparse
import collections
import json
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SAMPLE = re.compile(r"\s*(\d+)\s+([0-9a-f]+)\s+\(([^)]*)\)\s+([0-9a-f]+)\s+\(([^)]*)\)")


def record(binary, backend, concurrency, seconds, cpu, data):
    """Run the bench under perf, recording every page fault on `cpu`; returns its output."""
    bench = [str(binary), "bench", "sandboxes", "--backends", backend, "--concurrency", str(concurrency),
             "--seconds", str(seconds), "--worker-cpu", str(cpu), "--out", str(data.parent / "bench")]
    perf = ["perf", "record", "-q", "-e", "page-faults", "-c", "1", "-d", "-C", str(cpu), "-o", str(data), "--"]
    run = subprocess.run(perf + bench, capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit(f"perf record or the bench failed ({run.returncode}):\n{run.stderr[-3000:]}")
    return run.stdout


def faults_by_process(data, comm):
    """{pid: Counter of (mapping, fetch?)} for the processes named `comm`."""
    script = subprocess.run(["perf", "script", "-i", str(data), "--comm", comm, "-F", "pid,addr,ip,dso"],
                            capture_output=True, text=True, check=True).stdout
    by_pid = collections.defaultdict(collections.Counter)
    for line in script.splitlines():
        m = SAMPLE.match(line)
        if not m:
            continue
        pid, addr, mapping, ip, _ = m.groups()
        fetch = int(addr, 16) >> 12 == int(ip, 16) >> 12
        by_pid[pid][(mapping.rsplit("/", 1)[-1] or "anon", fetch)] += 1
    return by_pid


def summarize(by_pid):
    """Per handler life (the median process's count, and each mapping's mean share)."""
    totals = sorted(sum(c.values()) for c in by_pid.values())
    # The Zygotes and the worker's helpers fault too, but live long: a handler's life is the
    # typical process, so outliers (a Zygote's thousands) are left out of the means.
    median = statistics.median(totals)
    lives = [c for c in by_pid.values() if sum(c.values()) <= 3 * median]
    mappings = collections.Counter()
    fetches = collections.Counter()
    for c in lives:
        for (mapping, fetch), n in c.items():
            mappings[mapping] += n
            fetches[mapping] += n if fetch else 0
    return {
        "processes": len(by_pid),
        "lives": len(lives),
        "faults_per_life_p10": totals[len(totals) // 10],
        "faults_per_life_p50": median,
        "faults_per_life_p90": totals[9 * len(totals) // 10],
        "by_mapping": [{"mapping": m, "per_life": round(n / len(lives), 1), "instruction_fetches": round(fetches[m] / len(lives), 1)}
                       for m, n in mappings.most_common(12)],
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--binary", default=str(REPO / "target/release/sprout"))
    ap.add_argument("--backend", default="sock-isolated")
    ap.add_argument("--concurrency", type=int, default=10)
    ap.add_argument("--seconds", type=int, default=4)
    ap.add_argument("--cpu", type=int, default=0, help="the worker's CPU, where faults are recorded")
    ap.add_argument("--comm", default="python3", help="the handlers' command name")
    ap.add_argument("--out", type=Path, default=REPO / "bench/results/faults-per-life")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="sprout-faults-") as tmp:
        data = Path(tmp) / "perf.data"
        bench = record(args.binary, args.backend, args.concurrency, args.seconds, args.cpu, data)
        summary = summarize(faults_by_process(data, args.comm))
    summary.update(backend=args.backend, concurrency=args.concurrency,
                   bench=[line.strip() for line in bench.splitlines() if "cold c=" in line or "per sandbox life" in line])
    (args.out / "faults.json").write_text(json.dumps(summary, indent=2) + "\n")
    rows = [f"| {m['mapping']} | {m['per_life']} | {m['instruction_fetches']} |" for m in summary["by_mapping"]]
    table = (f"Page faults per sandbox life ({args.backend}, c={args.concurrency}): median "
             f"{summary['faults_per_life_p50']} (p10 {summary['faults_per_life_p10']}, p90 "
             f"{summary['faults_per_life_p90']}) over {summary['lives']} handler processes.\n\n"
             "| mapping faulted on | per life | of them instruction fetches |\n|---|---:|---:|\n" + "\n".join(rows) + "\n")
    (args.out / "faults.md").write_text(table)
    print(table)


if __name__ == "__main__":
    main()
