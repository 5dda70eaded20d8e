#!/usr/bin/env bash
# The whole Cloudstone comparison, as the README reports it: both searches back to back on
# this host (the same start, cap and step, each run on a fresh deployment, the ends of each
# final bracket run twice), the comparison, then the day and flash-crowd profiles, into
# bench/results/cloudstone/. About 3-4 hours on 2 cores; keep the host otherwise idle.
# usage: bash bench/cloudstone.sh [--resume]   (--resume keeps the runs an interrupted one finished)
set -euo pipefail
cd "$(dirname "$0")/.."
sprout=target/release/sprout
results=bench/results/cloudstone
search=(--start "${START:-1000}" --max "${MAX:-1600}" --min-step 25 --repeats 2 --cpus 0 --agent-cpus 1)
resume=()
if [ "${1:-}" = --resume ]; then
    resume=(--resume)
else
    rm -rf "$results/sprout" "$results/conventional" "$results/profiles"
fi
for stack in sprout conventional; do
    if [ ${#resume[@]} -gt 0 ] && [ -f "$results/$stack/search.json" ]; then
        echo "==> $stack: search done ($results/$stack/search.json)"
        continue
    fi
    echo "==> $stack: sprout cloudstone search --stack $stack ${search[*]} ${resume[*]}"
    "$sprout" cloudstone search --stack "$stack" "${search[@]}" "${resume[@]}" --out "$results/$stack"
done
"$sprout" cloudstone compare "$results/sprout/search.json" "$results/conventional/search.json"
python3 bench/cloudstone_profiles.py
