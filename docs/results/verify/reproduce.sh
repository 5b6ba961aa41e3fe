#!/usr/bin/env bash
# Regenerates docs/results/verify/ on a GPU: the numerics gate, every backend against fp64 at bf16 and fp16 (kernel
# level) and llama-1b's logits per implementation (model level); three broken functions that must fail; the fp32 gate
# with its relative rule. Each run's exit status is printed, not fatal: a failing backend is a finding.
#   bash scripts/gpu/run_all.sh verify
set -u
. scripts/gpu/lib.sh
claim verify
export PYTHONPATH=$PYTHONPATH:$PWD  # tests.broken: the planted mutants
one() {  # one STEM CAP ARGS...: attnprof verify ARGS -> STEM.md + STEM.json
  local stem=$1 cap=$2; shift 2
  timeout "$cap" python3 -m attnprof verify --device cuda "$@" --out "/tmp/verify-$stem" --json > "$dest/$stem.log" 2>&1
  echo "$stem exit=$?"; cp "/tmp/verify-$stem/verify.md" "$dest/$stem.md"; cp "/tmp/verify-$stem/verify.json" "$dest/$stem.json"
}
one h200-verify 420 --dtype bf16,fp16 --level both --model llama-1b --model-batch 4 --model-seq 64 --decode-tokens 8 \
  --seed 20261202
one h200-verify-mutants 120 --dtype bf16 --cases odd-causal,gqa,pad-left \
  --variants sdpa,tests.broken:scale_off_1pct,tests.broken:causal_off_by_one,tests.broken:gqa_tiled --seed 7
rm -f "$dest/h200-verify-mutants.json" "$dest/h200-verify.log" "$dest/h200-verify-mutants.log"
one h200-verify-fp32 120 --dtype fp32 --seed 14 \
  --variants sdpa,sdpa-efficient,sdpa-math,flex,tests.broken:correct,tests.broken:off_by_1e6
