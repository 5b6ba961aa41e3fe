#!/usr/bin/env bash
# The numerics gate on the H200: every backend at bf16 and fp16 (kernel level), then llama-1b (model level),
# one report: $OUT/verify/h200-verify.md + h200-verify.json. Run from the repo root; ~2-3 minutes.
# Exit status of each run is printed, not fatal: a failing backend is a finding, and the report says which.
set -u
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT/verify"
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD/src:$PWD"
if [ -d /tmp/site ]; then export PYTHONPATH="/tmp/site:$PYTHONPATH"; fi
start=$(date +%s)

# Kernel + model level in one report (seed fixed so the report can be reproduced exactly).
timeout 420 python3 -m attnprof verify --device cuda --dtype bf16,fp16 --level both --model llama-1b \
    --model-batch 4 --model-seq 64 --decode-tokens 8 --seed 20261202 \
    --out "$OUT/verify/full" --json > "$OUT/verify/verify.log" 2>&1
echo "verify (kernel bf16,fp16 + llama-1b): exit $?"
cp "$OUT/verify/full/verify.md" "$OUT/verify/h200-verify.md" 2>/dev/null
cp "$OUT/verify/full/verify.json" "$OUT/verify/h200-verify.json" 2>/dev/null
rm -rf "$OUT/verify/full"

# The gate must fail known-broken functions on the GPU too (short: three mutants, three cases, bf16).
timeout 120 python3 -m attnprof verify --device cuda --dtype bf16 --cases odd-causal,gqa,pad-left \
    --variants sdpa,tests.broken:scale_off_1pct,tests.broken:causal_off_by_one,tests.broken:gqa_tiled \
    --seed 7 --out "$OUT/verify/mutants" --json >> "$OUT/verify/verify.log" 2>&1
echo "verify (mutants, expected exit 1): exit $?"
mv "$OUT/verify/mutants/verify.md" "$OUT/verify/h200-verify-mutants.md" 2>/dev/null
rm -rf "$OUT/verify/mutants"

echo "--- summary ($(( $(date +%s) - start )) s) ---"
grep -E '^\{"schema"' "$OUT/verify/verify.log" | cut -c1-1500
grep -E "^(#|- |  - )" "$OUT/verify/h200-verify.md" | head -40
