#!/usr/bin/env bash
# Session 13, call 1 (TUNING.md step 20):
#   1. the softcap CUDA tests with Config.cap_poly (one exp2 in 2 or 4 on the FMA pipes) and the decode CUDA tests
#      at the merge-4 default, under FLASH_TRITON_CHECK_LAUNCH=1                                     (<= 150 s)
#   2. benchmarks/kernel_features_bench.py --softcap-only: plain, bound, online-max, poly/2, poly/4   (<= 140 s)
#   3. batch-1 decode against cuDNN: split counts around the heuristic's and 8 warps (--tune-set batch1) (<= 110 s)
#   4. the decode table at the merge-4 default (re-makes h200-decode/kernel-decode.md's grid)          (to 590 s)
#   EACH_TIMEOUT=595 bash scripts/gpu/run_all.sh s13a
set -u
dest="${OUT:-/tmp/out}/s13a"; mkdir -p "$dest"
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
t0=$(date +%s)
FLASH_TRITON_CHECK_LAUNCH=1 timeout 150 python3 -m pytest -q -m cuda -p no:cacheprovider tests/test_kernel_features.py \
  tests/test_kernel_serving_cuda.py -k "saturating or (gluon_varlen and (softcap or all)) or kvcache or decode or paged" \
  > "$dest/cuda-tests.log" 2>&1
echo "cuda tests exit=$? at $(( $(date +%s) - t0 ))s"
grep -E "passed|failed|FAILED|Error|assert" "$dest/cuda-tests.log" | tail -12 | cut -c1-400
eval "${PACK:-:}"
timeout 140 python3 benchmarks/kernel_features_bench.py --softcap-only > "$dest/features-bench.log" 2>&1
echo "features bench exit=$? at $(( $(date +%s) - t0 ))s"; cat "$dest/features-bench.log"
eval "${PACK:-:}"
timeout 110 python3 benchmarks/kernel_serving_bench.py --out "$dest/batch1" --parts tune --tune-set batch1 \
  > "$dest/batch1.log" 2>&1
echo "batch1 tune exit=$? at $(( $(date +%s) - t0 ))s"; grep -E "^(tune|anatomy)" "$dest/batch1.log" | cut -c1-700
eval "${PACK:-:}"
left=$(( 585 - ($(date +%s) - t0) ))
timeout "$left" python3 benchmarks/kernel_serving_bench.py --out "$dest/decode" --parts decode --batches 1,4,16,64 \
  --kv-lens 1024,8192,32768 --flex-budget-s -1 > "$dest/decode.log" 2>&1
echo "decode table exit=$? at $(( $(date +%s) - t0 ))s"; grep -E "^- B=" "$dest"/decode/*.md | cut -c1-300
