"""Run memcached's own protocol tests against Sprout's cache and against memcached (issue 53).

memcached's repository ships its tests as Perl files (`t/*.t` with `t/lib/MemcachedTest.pm`);
with `T_MEMD_USE_DAEMON=HOST:PORT` each runs against a server already listening instead of
starting its own. For every file but those of features Sprout's cache does not offer
(extstore, the proxy, SASL and auth files, TLS), this starts a fresh server per file and per
server -- `sprout cache serve -m 64 -t 1` and each `--memcached BIN` (`-m 64 -t 1`) -- runs
`perl t/FILE.t` from the checkout with a time limit, and records per file: pass, fail (the
failing checks), died (stopped before its plan), hung (past the limit) or crashed (the server
was gone after it). A file that starts a server with flags of its own runs against the default
one here, on every server alike: the comparison is what memcached itself passes this way.

The tests' library asks `memcached-debug -h` what the server supports; in the checkout (left
unbuilt: build memcached in a copy of it) this writes a `memcached-debug` that answers `-h` and
`-V` from `--help-from` and refuses to serve, so a file that starts a server itself fails on
every server alike rather than testing memcached in Sprout's place. No code of memcached's is
kept in this repository; fetch it at a release tag. Results go to `--out` as JSON and a
markdown table.

    python3 scripts/memcached_suite.py --checkout /var/tmp/memcached-1.6.45 \\
        --memcached 1.6.45=/var/tmp/memcached-build/memcached --memcached 1.6.18=/usr/bin/memcached
"""

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SKIPPED = re.compile(r"extstore|proxy|sasl|auth|ssl|tls")


HELP_ONLY = """#!/bin/sh
# Written by Sprout's scripts/memcached_suite.py: memcached's help, for the tests' capability
# checks; never a server (the server under test is the one T_MEMD_USE_DAEMON names).
case "$*" in -h|-V) exec {binary} "$@";; esac
echo "memcached-debug here only answers -h: the server under test is at T_MEMD_USE_DAEMON" >&2
exit 1
"""


def help_only(checkout, binary):
    """Put the help-only `memcached-debug` in `checkout` (refusing a real one there)."""
    exe = checkout / "memcached-debug"
    if exe.exists() and "memcached_suite.py" not in exe.read_bytes()[:200].decode(errors="replace"):
        sys.exit(f"{checkout} is built: its files would run its own memcached-debug. Use an unbuilt checkout.")
    exe.write_text(HELP_ONLY.format(binary=binary))
    exe.chmod(0o755)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_listening(port, proc, seconds=10):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return True
        except OSError:
            time.sleep(0.05)
    return False


def server_command(server, port):
    name, binary = server
    if name == "sprout":
        return [binary, "cache", "serve", "-m", "64", "-t", "1", "-p", str(port), "-l", "127.0.0.1"]
    command = [binary, "-m", "64", "-t", "1", "-p", str(port), "-l", "127.0.0.1", "-U", "0"]
    return command + (["-u", "root"] if os.geteuid() == 0 else [])


def outcome(returncode, out, hung):
    """pass / fail / died / hung from a TAP run, with the failing checks' numbers and names."""
    failed = re.findall(r"^not ok (\d+)(?: - (.*))?$", out, re.M)
    failed = [(int(n), name) for n, name in failed if "# TODO" not in name]
    plan = re.search(r"^1\.\.(\d+)", out, re.M)
    ran = len(re.findall(r"^(?:not )?ok \d+", out, re.M))
    if hung:
        status = "hung"
    elif failed:
        status = "fail"
    elif returncode != 0 or (plan and ran < int(plan.group(1))):
        status = "died"
    else:
        status = "pass"
    return {"status": status, "ran": ran, "planned": int(plan.group(1)) if plan else None,
            "failed": [n for n, _ in failed][:50], "first_failure": failed[0][1] if failed else None}


def run_file(checkout, test, server, limit):
    port = free_port()
    proc = subprocess.Popen(server_command(server, port), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        if not wait_listening(port, proc):
            return {"status": "no server", "error": proc.stderr.read(2000).decode(errors="replace") if proc.poll() is not None else ""}
        env = {**os.environ, "T_MEMD_USE_DAEMON": f"127.0.0.1:{port}"}
        began = time.monotonic()
        try:
            done = subprocess.run(["perl", f"t/{test}"], cwd=checkout, env=env, capture_output=True, text=True, errors="replace",
                                  timeout=limit)
            result = outcome(done.returncode, done.stdout, False)
            result["tail"] = (done.stdout + done.stderr)[-600:]
        except subprocess.TimeoutExpired as e:
            out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
            result = outcome(None, out, True)
            result["tail"] = out[-600:]
        result["seconds"] = round(time.monotonic() - began, 2)
        if proc.poll() is not None:
            result["status"] = "crashed"
        return result
    finally:
        proc.kill()
        proc.wait()


def markdown(results, servers, tag):
    names = [name for name, _ in servers]
    lines = [f"memcached's own tests (`t/*.t` at {tag}) in external mode (`T_MEMD_USE_DAEMON`), a fresh server per file "
             f"(`-m 64 -t 1`): `python3 scripts/memcached_suite.py`.", "",
             "| file | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for test in sorted(results):
        cells = []
        for name in names:
            r = results[test][name]
            cell = r["status"]
            if r["status"] == "fail":
                cell += f" ({len(r['failed'])} of {r['ran']}: #{r['failed'][0]})"
            elif r["status"] in ("died", "hung"):
                cell += f" after {r.get('ran', 0)}"
            cells.append(cell)
        lines.append(f"| {test} | " + " | ".join(cells) + " |")
    lines.append("")
    for name in names:
        passed = sum(results[t][name]["status"] == "pass" for t in results)
        lines.append(f"- {name}: {passed} of {len(results)} files pass")
    reference = names[1] if len(names) > 1 else None
    if reference:
        missing = [t for t in sorted(results) if results[t][reference]["status"] == "pass" and results[t]["sprout"]["status"] != "pass"]
        lines.append(f"- passed by {reference} and not by sprout ({len(missing)}): " + (", ".join(missing) or "none"))
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkout", required=True, type=Path, help="memcached's repository at a release tag, unbuilt")
    parser.add_argument("--sprout", default=str(REPO / "target/release/sprout"))
    parser.add_argument("--memcached", action="append", default=[], help="NAME=BINARY of a memcached to run the files against")
    parser.add_argument("--only", nargs="*", help="these files only (names as in t/)")
    parser.add_argument("--help-from", help="a memcached binary of the checkout's version, for its -h (default: the first --memcached)")
    parser.add_argument("--limit", type=float, default=60, help="seconds a file may take before it counts as hung")
    parser.add_argument("--jobs", type=int, default=4)
    parser.add_argument("--out", help="path without suffix for the JSON and markdown (default: "
                        "bench/results/memcached-suite for a whole run; a run with --only only prints)")
    args = parser.parse_args()
    servers = [("sprout", args.sprout)] + [tuple(m.split("=", 1)) for m in args.memcached]
    tests = sorted(p.name for p in (args.checkout / "t").glob("*.t") if not SKIPPED.search(p.name))
    if args.only:
        tests = [t for t in tests if t in args.only or t.removesuffix(".t") in args.only]
    helper = args.help_from or (servers[1][1] if len(servers) > 1 else None)
    if not helper:
        sys.exit("give --help-from BIN (or a --memcached): the tests ask memcached-debug -h what the server supports")
    help_only(args.checkout, str(Path(helper).resolve()))
    version = subprocess.run(["git", "describe", "--tags"], cwd=args.checkout, capture_output=True, text=True).stdout.strip()
    tag = version or args.checkout.name
    jobs = [(t, s) for t in tests for s in servers]
    results = {t: {} for t in tests}
    with ThreadPoolExecutor(args.jobs) as pool:
        futures = {pool.submit(run_file, args.checkout, t, s, args.limit): (t, s[0]) for t, s in jobs}
        for i, future in enumerate(futures, 1):
            test, name = futures[future]
            results[test][name] = future.result()
            print(f"[{i}/{len(jobs)}] {test} on {name}: {results[test][name]['status']}", file=sys.stderr, flush=True)
    if args.out is None and args.only:
        print(markdown(results, servers, tag))
        return
    out = Path(args.out or REPO / "bench/results/memcached-suite")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps({"tag": tag, "servers": [n for n, _ in servers], "files": results}, indent=1))
    out.with_suffix(".md").write_text(markdown(results, servers, tag))
    print(out.with_suffix(".md").read_text())


if __name__ == "__main__":
    main()
