#!/usr/bin/env bash
# Set up everything, then run all tests: the lint and the layout check, the Rust unit tests and
# the integration tests, which start real workers, sandboxes, runc and Docker containers (as
# root). Integration tests run in parallel, each test module in one of SPROUT_TEST_JOBS
# processes (default: twice the CPUs, as most of their time is spent waiting on sandboxes,
# servers and timers); every worker they start has its own directory, ports and cgroup names.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
echo "==> cargo fmt --check; cargo clippy -D warnings; ruff check; module cycles, layers and file lengths"
cargo fmt --check
cargo clippy --release --quiet --workspace --all-targets -- -D warnings
python3 -m ruff check --quiet .
layout=$(python3 scripts/check_layout.py) || { echo "$layout"; exit 1; }
echo "$layout" | tail -n 1
echo "==> cargo test"
cargo test --release --quiet --workspace
jobs=${SPROUT_TEST_JOBS:-$(($(nproc) * 2))}
echo "==> integration tests ($jobs processes)"
# With arguments (a part such as tests/cache, -k EXPR, ...) pytest runs those; testpaths is tests/.
python3 -m pytest -q -n "$jobs" --dist loadfile "$@"
