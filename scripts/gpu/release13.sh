#!/usr/bin/env bash
# Issue 17 (session 8), first measuring call: K released after QKᵀ and V after P·V (TUNING.md step 13), and the
# Gluon program as the default for head dims 80, 96 (zero-padded tiles) and 256 (128x64, 2 stages).
#   EACH_TIMEOUT=540 bash scripts/gpu/run_all.sh release13
#   1. tune.py --round 13: split vs joint release per head dim, causal and not, on views; every candidate on the
#      oracle cases                                                                                       (<= 250 s)
#   2. cuda tests: all of tests/test_kernel_cuda.py and tests/test_kernel_serving_cuda.py on the new defaults (<= 280 s)
set -u
dest="${OUT:-/tmp/out}/release13"; mkdir -p "$dest"
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
t0=$(date +%s)
timeout 250 python3 kernels/flash-triton/tune.py --round 13 --causal both --budget-s 190 --head-dims 256,96,128,64 \
  --shapes 16x1024,8x2048,2x8192 --out "$dest" > "$dest/tune13.log" 2>&1
echo "tune13 exit=$? at $(( $(date +%s) - t0 ))s"; sed -n '/^   d /,$p' "$dest/tune13.log" | cut -c1-100
timeout 280 python3 -m pytest -q -m cuda -p no:cacheprovider tests/test_kernel_cuda.py tests/test_kernel_serving_cuda.py \
  > "$dest/cuda-tests.log" 2>&1
echo "cuda tests exit=$? at $(( $(date +%s) - t0 ))s"; grep -E "passed|failed|FAILED|Error" "$dest/cuda-tests.log" | tail -12 | cut -c1-300
