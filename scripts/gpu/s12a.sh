#!/usr/bin/env bash
# Session 12, call 1 (TUNING.md step 19):
#   1. batch-1 decode against cuDNN (issue 30 item 3): the split count and the merge's round trips
#      (DecodeConfig.merge_group = 4) at batch 1 1k-32k and batch 4 8k, SDPA in the same run, and the profiler's
#      kernels per call (the two-launch form shows the merge alone)                                   (<= 120 s)
#   2. softcap without a running max (issue 31, Config.cap_bound): the softcap CUDA tests on the varlen Gluon program
#      with the saturating-logit oracle test, under FLASH_TRITON_CHECK_LAUNCH=1                     (<= 110 s)
#   3. benchmarks/kernel_features_bench.py --softcap-only: bound vs online-max vs plain               (to 320 s)
#   EACH_TIMEOUT=590 bash scripts/gpu/run_all.sh s12a
set -u
dest="${OUT:-/tmp/out}/s12a"; mkdir -p "$dest"
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
t0=$(date +%s)
timeout 120 python3 benchmarks/kernel_serving_bench.py --out "$dest/batch1" --parts tune --tune-set batch1 \
  > "$dest/batch1.log" 2>&1
echo "batch1 tune exit=$? at $(( $(date +%s) - t0 ))s"; grep -E "^(tune|anatomy)" "$dest/batch1.log" | cut -c1-600
eval "${PACK:-:}"
FLASH_TRITON_CHECK_LAUNCH=1 timeout 110 python3 -m pytest -q -m cuda -p no:cacheprovider tests/test_kernel_features.py \
  -k "saturating or (gluon_varlen and (softcap or all))" > "$dest/features-cuda-tests.log" 2>&1
echo "features cuda tests exit=$? at $(( $(date +%s) - t0 ))s"
grep -E "passed|failed|FAILED|Error|assert" "$dest/features-cuda-tests.log" | tail -12 | cut -c1-400
eval "${PACK:-:}"
left=$(( 320 - ($(date +%s) - t0) ))
timeout "$left" python3 benchmarks/kernel_features_bench.py --softcap-only > "$dest/features-bench.log" 2>&1
echo "bench exit=$? at $(( $(date +%s) - t0 ))s"; cat "$dest/features-bench.log"
