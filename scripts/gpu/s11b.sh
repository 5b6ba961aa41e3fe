#!/usr/bin/env bash
# Session 11, call 3: the CUDA tests under FLASH_TRITON_CHECK_LAUNCH=1 with the cached CUtensorMaps of the direct
# launch (every repeat launch reuses a map by base address: the oracle tests check the results), then the features
# bench at the final defaults (softcap on the varlen Gluon program without poly_exp, sinks on the dense one).
#   EACH_TIMEOUT=480 bash scripts/gpu/run_all.sh s11b
set -u
dest="${OUT:-/tmp/out}/s11b"; mkdir -p "$dest"
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
t0=$(date +%s)
FLASH_TRITON_CHECK_LAUNCH=1 timeout 290 python3 -m pytest -q -m cuda -p no:cacheprovider tests/test_kernel_cuda.py \
  tests/test_kernel_serving_cuda.py > "$dest/cuda-tests.log" 2>&1
echo "cuda tests exit=$? at $(( $(date +%s) - t0 ))s"; grep -E "passed|failed|FAILED|Error" "$dest/cuda-tests.log" | tail -8 | cut -c1-300
left=$(( 460 - ($(date +%s) - t0) ))
timeout "$left" python3 benchmarks/kernel_features_bench.py > "$dest/features-bench.log" 2>&1
echo "bench exit=$? at $(( $(date +%s) - t0 ))s"; cat "$dest/features-bench.log"
