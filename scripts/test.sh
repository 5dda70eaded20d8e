#!/usr/bin/env bash
# Set up everything, then run all tests: the Rust unit tests and the integration tests, which
# start real workers, sandboxes, runc and Docker containers (as root).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
echo "==> cargo fmt --check; cargo clippy -D warnings; ruff check"
cargo fmt --check
cargo clippy --release --quiet --workspace --all-targets -- -D warnings
python3 -m ruff check --quiet .
echo "==> cargo test"
cargo test --release --quiet --workspace
echo "==> integration tests"
# With arguments (a part such as tests/cache, -k EXPR, ...) pytest runs those; testpaths is tests/.
python3 -m pytest -q "$@"
