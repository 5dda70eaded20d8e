#!/usr/bin/env bash
# Give this host the same CPython build as the sandbox base image: Debian's python3.11
# packages at the version debootstrap put into the base (usually newer than the host's; the
# security suite the host may follow is not in the base). The conventional Olio deployment
# runs this interpreter in a virtual environment, so both Cloudstone stacks run one build.
# usage: scripts/align-python.sh [BASE]   (default /var/lib/sprout/base-bookworm)
set -euo pipefail
base=${1:-/var/lib/sprout/base-bookworm}
status="$base/var/lib/dpkg/status"
[ -f "$status" ] || { echo "align-python: no sandbox base at $base (sprout worker init builds it)" >&2; exit 1; }
want=$(awk '/^Package: /{p=$2} /^Version: /{if (p=="python3.11-minimal") print $2}' "$status")
[ -n "$want" ] || { echo "align-python: the base at $base has no python3.11-minimal" >&2; exit 1; }
# Every python3.11 package installed here, at the base's version (their dependencies are exact).
mapfile -t installed < <(dpkg-query -W -f '${db:Status-Abbrev} ${Package} ${Version}\n' 'python3.11*' 'libpython3.11*' 2>/dev/null \
    | awk '$1=="ii" {print $2, $3}')
pins=(python3.11-venv="$want")
for line in "${installed[@]}"; do
    read -r pkg version <<<"$line"
    [ "$version" = "$want" ] || [ "$pkg" = python3.11-venv ] && continue
    pins+=("$pkg=$want")
done
if dpkg-query -W -f '${Version}' python3.11-venv 2>/dev/null | grep -qx "$want" && [ ${#pins[@]} -eq 1 ]; then
    echo "==> host python3.11 is the base's build ($want)"
    exit 0
fi
echo "==> host python3.11 to the sandbox base's version $want: ${pins[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get install -y -q --no-install-recommends --allow-downgrades "${pins[@]}" python3-venv >/dev/null \
    || { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends --allow-downgrades "${pins[@]}" python3-venv >/dev/null; }
