#!/usr/bin/env bash
# Regenerates docs/results/audit-measured/ on a GPU: `attnprof audit --measure` on llama-1b prefill + decode.
#   run1: as shipped, expected exit 1 (SDPA picks cuDNN, which builds a plan per new KV length in decode);
#   run2: the same with the fix run1 names (its JSON's fix_flag), expected exit 0, sharing run1's regret cache.
#   bash scripts/gpu/run_all.sh audit-measured
set -u
. scripts/gpu/lib.sh
claim audit-measured
export ATTNPROF_CACHE_DIR=/tmp/audit-measured-cache; rm -rf "$ATTNPROF_CACHE_DIR"
common=(--device cuda --model llama-1b --phase prefill,decode --batch 1 --seq 512 --new-tokens 16 --measure
        --require measured --json)
{
  timeout 60 python3 -m attnprof audit "${common[@]}" --out /tmp/am-run1; echo "run1 exit=$? (expected 1)"
  fix=$(python3 -c "import json; print(json.load(open('/tmp/am-run1/audit.json')).get('fix_flag') or '')")
  # shellcheck disable=SC2086  # $fix is two words: --pin VALUE
  timeout 40 python3 -m attnprof audit "${common[@]}" ${fix:---pin decode=flash} --out /tmp/am-run2; echo "run2 exit=$? (expected 0)"
} > "$dest/run.log" 2>&1
tail -4 "$dest/run.log"
for run in run1 run2; do
  cp /tmp/am-$run/audit.md "$dest/$run-report.md"; cp /tmp/am-$run/audit.json "$dest/$run-audit.json"
done
