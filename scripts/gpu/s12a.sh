#!/usr/bin/env bash
# Session 12, call 1: batch-1 decode against cuDNN (issue 30 item 3; TUNING.md step 19): the split count and the
# merge's round trips (DecodeConfig.merge_group = 4: four partials per L2 round trip) at batch 1 1k-32k and batch
# 4/16 8k, SDPA in the same run, and the profiler's kernels per call (the two-launch form shows the merge alone);
# then the CUDA tests under FLASH_TRITON_CHECK_LAUNCH=1 with the cached TMA maps (session 11's s11b, never run).
#   EACH_TIMEOUT=590 bash scripts/gpu/run_all.sh s12a
set -u
dest="${OUT:-/tmp/out}/s12a"; mkdir -p "$dest"
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
t0=$(date +%s)
timeout 260 python3 benchmarks/kernel_serving_bench.py --out "$dest/batch1" --parts tune --tune-set batch1 \
  > "$dest/batch1.log" 2>&1
echo "batch1 tune exit=$? at $(( $(date +%s) - t0 ))s"; grep -E "^(tune|anatomy)" "$dest/batch1.log" | cut -c1-400
left=$(( 570 - ($(date +%s) - t0) ))
FLASH_TRITON_CHECK_LAUNCH=1 timeout "$left" python3 -m pytest -q -m cuda -p no:cacheprovider tests/test_kernel_cuda.py \
  tests/test_kernel_serving_cuda.py > "$dest/cuda-tests.log" 2>&1
echo "cuda tests exit=$? at $(( $(date +%s) - t0 ))s"; grep -E "passed|failed|FAILED|Error" "$dest/cuda-tests.log" | tail -8 | cut -c1-300
