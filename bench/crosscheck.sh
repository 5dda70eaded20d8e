#!/usr/bin/env bash
# Cross-check our generator's latency for one operation against an independent tool (wrk):
# Olio's home page under gunicorn (SQLite, 1,000 loaded users) on CPU 0, each client alone on
# CPU 1 with one connection and no think time. Prints both tools' p50/p90/p99 and their ratio.
#   usage: bash bench/crosscheck.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_PER_TOOL=${1:-20}
command -v wrk >/dev/null || { apt-get install -y -q --no-install-recommends wrk >/dev/null; }
WORK=$(mktemp -d /tmp/sprout-crosscheck.XXXX)
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
export PYTHONPATH=python:apps/olio OLIO_DB=sqlite:///$WORK/olio.db OLIO_FILES=$WORK/files OLIO_SECRET=crosscheck
python3 -m olio.loader --users 1000 --seed 1 --db "$OLIO_DB" --files "$OLIO_FILES" --quiet
taskset -c 0 gunicorn --no-control-socket -w 3 -b 127.0.0.1:$PORT olio.wsgi:app >"$WORK/gunicorn.log" 2>&1 &
GUNICORN=$!
trap 'kill $GUNICORN 2>/dev/null; wait $GUNICORN 2>/dev/null; rm -rf "$WORK"' EXIT
for _ in $(seq 50); do curl -sf -o /dev/null "http://127.0.0.1:$PORT/" && break; sleep 0.2; done
echo "==> wrk: 1 connection, ${SECONDS_PER_TOOL} s, CPU 1"
taskset -c 1 wrk -t1 -c1 -d"${SECONDS_PER_TOOL}s" --latency "http://127.0.0.1:$PORT/" | tee "$WORK/wrk.txt"
echo "==> sprout load: 1 user, no think time, ${SECONDS_PER_TOOL} s, CPU 1"
target/release/sprout load run --url "http://127.0.0.1:$PORT" --users 1 --registered-users 1000 \
    --workload bench/workloads/crosscheck-home.toml --ramp-up 2 --steady "$SECONDS_PER_TOOL" --ramp-down 0 \
    --agent-cpus 1 --stack gunicorn --out "$WORK/run" >/dev/null
python3 - "$WORK/wrk.txt" "$WORK/run/run.json" <<'PY'
import json, re, sys
text = open(sys.argv[1]).read()
def ms(v, unit):
    return float(v) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]
wrk = {p: ms(*re.search(rf"^\s+{p}%\s+([\d.]+)(us|ms|s)\s*$", text, re.M).groups()) for p in ("50", "90", "99")}
op = json.load(open(sys.argv[2]))["operations"]["HomePage"]
ours = {"50": op["p50_ms"], "90": op["p90_ms"], "99": op["p99_ms"]}
print(f"{'percentile':>10} {'wrk ms':>9} {'sprout load ms':>15} {'ratio':>7}")
for p in ("50", "90", "99"):
    print(f"{'p' + p:>10} {wrk[p]:>9.2f} {ours[p]:>15.2f} {ours[p] / wrk[p]:>6.2f}x")
PY
