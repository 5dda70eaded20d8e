#!/usr/bin/env bash
# gVisor's runsc for the gvisor back-end: built once per machine from the Go module proxy at
# the commit of gVisor's go branch pinned in crates/sandbox/src/gvisor/runsc.version (plain
# `go build`, CGO off; the go command fetches the Go release gVisor asks for if the
# machine's is older), into /var/lib/sprout/gvisor/<version>/runsc, where the worker looks.
# Its seccomp programs come precompiled (scripts/gvisor/generated/*_precompiled.go, made by
# scripts/gvisor/sproutseccomp.go: `scripts/gvisor.sh --regenerate` after changing the pin),
# as gVisor's own Bazel build makes them; otherwise every sandbox compiles them as it starts
# (16 ms of each pod's start here). Prints the binary's path. Safe to run again: a finished
# build is reused.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
version=$(tr -d '[:space:]' < crates/sandbox/src/gvisor/runsc.version)
dir=${SPROUT_GVISOR_DIR:-/var/lib/sprout/gvisor}/$version
regenerate=false
[ "${1:-}" = "--regenerate" ] && regenerate=true
if [ -x "$dir/runsc" ] && [ -e "$dir/seccomp-precompiled" ] && ! $regenerate; then
    echo "$dir/runsc"
    exit 0
fi
echo "==> building gVisor's runsc $version (Go module proxy, a minute or two, once per machine)" >&2
staging=$dir.building
rm -rf "$staging"
mkdir -p "$staging"
module=$(GOFLAGS=-mod=mod go mod download -json "gvisor.dev/gvisor@$version" | python3 -c 'import json, sys; print(json.load(sys.stdin)["Dir"])')
src=$staging/src
cp -r "$module" "$src"
chmod -R u+w "$src"
mkdir -p "$src/runsc/sproutseccomp"
cp scripts/gvisor/sproutseccomp.go "$src/runsc/sproutseccomp/main.go"
cd "$src"
if $regenerate; then
    echo "==> precompiling runsc's seccomp programs (about two minutes)" >&2
    CGO_ENABLED=0 go run ./runsc/sproutseccomp boot > "$repo/scripts/gvisor/generated/boot_precompiled.go"
    CGO_ENABLED=0 go run ./runsc/sproutseccomp gofer > "$repo/scripts/gvisor/generated/gofer_precompiled.go"
fi
for part in boot fsgofer; do
    file=${part#fs}
    cp "$repo/scripts/gvisor/generated/${file}_precompiled.go" "runsc/$part/filter/sprout_precompiled.go"
    # registerPrograms, empty in the go branch, registers ours.
    sed -i 's/^\tprecompiledPrograms = programs$/\tregisterSprout(programs)\n\tprecompiledPrograms = programs/' "runsc/$part/filter/filter_precompiled.go"
    grep -q registerSprout "runsc/$part/filter/filter_precompiled.go" || { echo "runsc/$part/filter/filter_precompiled.go changed shape: update scripts/gvisor.sh" >&2; exit 1; }
done
CGO_ENABLED=0 go build -o "$staging/runsc" ./runsc
cd "$repo"
rm -rf "$src"
"$staging/runsc" --version >&2
touch "$staging/seccomp-precompiled"
rm -rf "$dir"
mv "$staging" "$dir"
echo "$dir/runsc"
