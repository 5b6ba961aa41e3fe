#!/usr/bin/env bash
# Session 10: the serving cuda tests under FLASH_TRITON_CHECK_LAUNCH=1 (host30.sh's 300 s ran out before them), then
# host_cost.py once more on this machine (the direct launch; ours against SDPA).
#   EACH_TIMEOUT=260 bash scripts/gpu/run_all.sh serving10 features31
set -u
dest="${OUT:-/tmp/out}/serving10"; mkdir -p "$dest"
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
t0=$(date +%s)
FLASH_TRITON_CHECK_LAUNCH=1 timeout 200 python3 -m pytest -q -m cuda -p no:cacheprovider tests/test_kernel_serving_cuda.py \
  > "$dest/cuda-tests.log" 2>&1
echo "serving cuda tests exit=$? at $(( $(date +%s) - t0 ))s"; grep -E "passed|failed|FAILED|Error" "$dest/cuda-tests.log" | tail -8 | cut -c1-300
timeout 45 python3 kernels/flash-triton/host_cost.py > "$dest/host-cost-direct.log" 2>&1
echo "host_cost exit=$? at $(( $(date +%s) - t0 ))s"; cat "$dest/host-cost-direct.log"
