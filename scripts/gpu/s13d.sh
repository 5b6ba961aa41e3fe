#!/usr/bin/env bash
# Session 13, call 3 (TUNING.md step 20):
#   1. scripts/gpu/mufu13.py: special-function-unit results per clock per SM (tanh, ex2, tanh f16x2; FFMA beside)
#   2. the split rule that fills one wave (16 splits at batch 1 over 32k, was 14): --tune-set batch1
#   3. the decode grid at that rule (batch 1/4/16/64 x 1k/8k/32k, with ours-heads)
#   EACH_TIMEOUT=400 bash scripts/gpu/run_all.sh s13d
set -u
dest="${OUT:-/tmp/out}/s13d"; mkdir -p "$dest"
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
t0=$(date +%s)
timeout 60 python3 scripts/gpu/mufu13.py > "$dest/mufu.log" 2>&1
echo "mufu exit=$? at $(( $(date +%s) - t0 ))s"; grep -v -i warn "$dest/mufu.log"
timeout 110 python3 benchmarks/kernel_serving_bench.py --out "$dest/batch1" --parts tune --tune-set batch1 \
  > "$dest/batch1.log" 2>&1
echo "batch1 tune exit=$? at $(( $(date +%s) - t0 ))s"; grep -E "^(tune|anatomy)" "$dest/batch1.log" | cut -c1-700
eval "${PACK:-:}"
left=$(( 390 - ($(date +%s) - t0) ))
timeout "$left" python3 benchmarks/kernel_serving_bench.py --out "$dest/decode" --parts decode --batches 1,2,4,16,64 \
  --kv-lens 1024,8192,32768 --flex-budget-s -1 > "$dest/decode.log" 2>&1
echo "decode table exit=$? at $(( $(date +%s) - t0 ))s"; grep -E "^- B=" "$dest"/decode/*.md | cut -c1-300
