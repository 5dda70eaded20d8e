#!/usr/bin/env bash
# Set up everything, then run all tests: the lint and the layout check, the integration tests,
# which start real workers, sandboxes, runc and Docker containers (as root), and the Rust unit
# tests. Integration tests run in parallel, each test module in one of SPROUT_TEST_JOBS
# processes (default: twice the CPUs: most of their time is spent waiting on sandboxes,
# servers and timers); every worker they start has its own directory, ports and cgroup names.
# Meanwhile clippy and the unit tests' build take, at the lowest priority, the CPU they leave.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
echo "==> cargo fmt --check; ruff check; module cycles, layers and file lengths"
cargo fmt --check
python3 -m ruff check --quiet .
layout=$(python3 scripts/check_layout.py) || { echo "$layout"; exit 1; }
echo "$layout" | tail -n 1
mkdir -p /tmp/sprout-test
rust_log=/tmp/sprout-test/clippy-and-build.log
(
    nice -n 19 cargo clippy --release --quiet --workspace --all-targets -- -D warnings
    nice -n 19 cargo test --release --quiet --workspace --no-run
) >"$rust_log" 2>&1 &
rust=$!
jobs=${SPROUT_TEST_JOBS:-$(($(nproc) * 2))}
echo "==> integration tests ($jobs processes; cargo clippy -D warnings and the unit tests' build beside them)"
status=0
# With arguments (a part such as tests/cache, -k EXPR, ...) pytest runs those; testpaths is tests/.
python3 -m pytest -q -n "$jobs" --dist loadfile --durations=15 "$@" || status=$?
echo "==> cargo clippy -D warnings"
if ! wait "$rust"; then
    cat "$rust_log"
    exit 1
fi
echo "==> cargo test"
cargo test --release --quiet --workspace
exit "$status"
