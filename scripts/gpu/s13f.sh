#!/usr/bin/env bash
# Session 13, call 4 (TUNING.md step 20): Config.pingpong, the varlen Gluon program's two consumers issuing their
# matmuls in turn (FlashAttention-3's ping-pong), against softcap's 0.79x at head dim 128:
#   1. its CUDA oracle tests (a deadlock would show as the timeout) under FLASH_TRITON_CHECK_LAUNCH=1   (<= 150 s)
#   2. benchmarks/kernel_features_bench.py --softcap-only with the pingpong rows                       (to 300 s)
#   EACH_TIMEOUT=310 bash scripts/gpu/run_all.sh s13f
set -u
dest="${OUT:-/tmp/out}/s13f"; mkdir -p "$dest"
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
t0=$(date +%s)
FLASH_TRITON_CHECK_LAUNCH=1 timeout 150 python3 -m pytest -q -m cuda -p no:cacheprovider tests/test_kernel_features.py \
  -k "pingpong or poly or saturating" > "$dest/cuda-tests.log" 2>&1
echo "cuda tests exit=$? at $(( $(date +%s) - t0 ))s"
grep -E "passed|failed|FAILED|Error|assert" "$dest/cuda-tests.log" | tail -12 | cut -c1-400
eval "${PACK:-:}"
left=$(( 300 - ($(date +%s) - t0) ))
timeout "$left" python3 benchmarks/kernel_features_bench.py --softcap-only > "$dest/features-bench.log" 2>&1
echo "features bench exit=$? at $(( $(date +%s) - t0 ))s"; cat "$dest/features-bench.log"
