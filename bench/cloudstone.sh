#!/usr/bin/env bash
# The whole Cloudstone comparison, as the README reports it: both searches back to back on
# this host (the same start, cap and step, each run on a fresh deployment, the ends of each
# final bracket run twice), the comparison, the CPU breakdown at the common user counts, the day
# and flash-crowd profiles, and the equal-load rounds (Sprout with and without a network
# namespace per lambda against the conventional stack), into bench/results/cloudstone/. About
# 4-5 hours on 2 cores; keep the host otherwise idle.
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
    rm -rf "$results/sprout" "$results/conventional" "$results/profiles" "$results/equal-load"
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
python3 bench/cloudstone_breakdown.py
python3 bench/cloudstone_profiles.py
python3 bench/cloudstone_equal_load.py
