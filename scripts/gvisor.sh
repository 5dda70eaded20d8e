#!/usr/bin/env bash
# gVisor's runsc for the gvisor back-end: built once per machine from the Go module proxy at
# the commit of gVisor's go branch pinned in crates/sandbox/src/gvisor/runsc.version (plain
# `go install`, CGO off; the go command fetches the Go release gVisor asks for if the
# machine's is older), into /var/lib/sprout/gvisor/<version>/runsc, where the worker looks.
# Prints that path. Safe to run again: a finished build is reused.
set -euo pipefail
cd "$(dirname "$0")/.."
version=$(tr -d '[:space:]' < crates/sandbox/src/gvisor/runsc.version)
dir=${SPROUT_GVISOR_DIR:-/var/lib/sprout/gvisor}/$version
if [ -x "$dir/runsc" ]; then
    echo "$dir/runsc"
    exit 0
fi
echo "==> building gVisor's runsc $version (Go module proxy, a minute or two, once per machine)" >&2
staging=$dir.building
rm -rf "$staging"
mkdir -p "$staging"
GOBIN=$staging CGO_ENABLED=0 GOFLAGS=-mod=mod go install "gvisor.dev/gvisor/runsc@$version"
"$staging/runsc" --version >&2
rm -rf "$dir"
mv "$staging" "$dir"
echo "$dir/runsc"
