#!/usr/bin/env bash
# Set up everything, then run all tests: the Rust unit tests and the integration tests, which
# start real workers, sandboxes, runc and Docker containers (as root).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
echo "==> cargo fmt --check; cargo clippy -D warnings"
cargo fmt --check
cargo clippy --release --quiet --workspace --all-targets -- -D warnings
echo "==> cargo test"
cargo test --release --quiet --workspace
echo "==> integration tests"
python3 -m pytest -q tests "$@"
