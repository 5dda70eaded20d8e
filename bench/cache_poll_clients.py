"""How many clients a cache core should poll for: memcached against the Sprout cache polling for
a lone client (--poll-clients 1, the default) and for up to four (--poll-clients 4), under
memaslap, on one core (the generator on the other CPU) and on two (the generator sharing a CPU
with one of them, so the cores float: --no-pin, as memcached's threads do). Each round starts
each server afresh, in turn; the JSON holds every run and the share of Sprout's requests found
by polling (`stats cores`).

    python3 bench/cache_poll_clients.py [--connections 4,16] [--rounds 2] [--seconds 3]

Writes bench/results/cache-poll-policy/poll-clients.{json,md}."""

import argparse
import json
import pathlib
import re
import socket
import statistics
import subprocess
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
SPROUT = ROOT / "target" / "release" / "sprout"
OUT = ROOT / "bench" / "results" / "cache-poll-policy"
SERVERS = {"memcached": None, "sprout --poll-clients 1": ["--poll-clients", "1"], "sprout --poll-clients 4": ["--poll-clients", "4"]}
LAYOUTS = {"1 core": ("0", 1, []), "2 cores": ("0,1", 2, ["--no-pin"])}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(server, cpus, threads, extra):
    port = free_port()
    if SERVERS[server] is None:
        cmd = ["memcached", "-u", "nobody", "-l", "127.0.0.1", "-U", "0", "-m", "1024", "-c", "4096", "-t", str(threads)]
    else:
        cmd = [str(SPROUT), "cache", "serve", "-l", "127.0.0.1", "-m", "1024", "-c", "4096", "-t", str(threads),
               "--cpus", cpus, *extra, *SERVERS[server]]
    proc = subprocess.Popen(["taskset", "-c", cpus, *cmd, "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 10
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc, port
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise SystemExit(f"{server} did not listen on {port}")


def polls_found(port):
    """Sprout's spins that found a request, summed over cores; None from memcached."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"stats cores\r\n")
        out = b""
        while not out.endswith((b"END\r\n", b"ERROR\r\n")):
            out += s.recv(65536)
    found = [int(n) for n in re.findall(rb"STAT core:\d+:polls_spun_found (\d+)", out)]
    return sum(found) if found else None


def memaslap(port, conns, seconds):
    text = subprocess.run(["taskset", "-c", "1", "memcaslap", "-s", f"127.0.0.1:{port}", "-T", "1", "-c", str(conns),
                           "-t", f"{seconds}s", "-X", "64"], capture_output=True, text=True, check=True).stdout
    return float(re.findall(r"TPS: (\d+)", text)[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--connections", default="4,16")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seconds", type=int, default=3)
    args = ap.parse_args()
    runs = []
    for layout, (cpus, threads, extra) in LAYOUTS.items():
        for conns in [int(c) for c in args.connections.split(",")]:
            for r in range(args.rounds):
                for server in SERVERS:
                    proc, port = start(server, cpus, threads, extra)
                    try:
                        before = polls_found(port)
                        ops = memaslap(port, conns, args.seconds)
                        after = polls_found(port)
                    finally:
                        proc.terminate()
                        proc.wait()
                    polled = None if before is None else round((after - before) / (ops * args.seconds), 3)
                    runs.append({"layout": layout, "connections": conns, "round": r, "server": server,
                                 "ops_per_s": ops, "polled_share": polled})
                    print(f"{layout:8} {conns:4} conns round {r}: {server:24} {ops:9.0f} ops/s polled {polled}", flush=True)
    rows = ["| layout | connections | " + " | ".join(SERVERS) + " | --poll-clients 4 ÷ 1 |", "|---|---:|" + "---:|" * (len(SERVERS) + 1)]
    for layout in LAYOUTS:
        for conns in sorted({r["connections"] for r in runs}):
            point = [r for r in runs if (r["layout"], r["connections"]) == (layout, conns)]
            med = {s: statistics.median(r["ops_per_s"] for r in point if r["server"] == s) for s in SERVERS}
            cells = [f"{med[s]:,.0f} ({med[s] / med['memcached']:.2f}×)" for s in SERVERS]
            few_over_lone = med["sprout --poll-clients 4"] / med["sprout --poll-clients 1"]
            rows.append(f"| {layout} | {conns} | " + " | ".join(cells) + f" | {few_over_lone:.2f}× |")
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "poll-clients.json").write_text(json.dumps({"seconds": args.seconds, "rounds": args.rounds, "runs": runs}, indent=1))
    md = "# Polling for a lone client or for up to four: memaslap ops/s (median of rounds; ratio to memcached)\n\n" + "\n".join(rows) + "\n"
    (OUT / "poll-clients.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
