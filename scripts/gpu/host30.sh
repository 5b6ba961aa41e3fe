#!/usr/bin/env bash
# Issue 30 item 2 on the GPU (prepared in session 10, not run yet): the direct C launch, one decode workspace, ring
# offsets and serial keys (TUNING.md step 16), checked and measured. Ran at git 1916d73; `--tune-set merge` and
# `merge_stages` were taken out after it (TUNING.md step 17), so step 3 no longer runs as written.
#   EACH_TIMEOUT=560 bash scripts/gpu/run_all.sh host30
#   1. cuda tests under FLASH_TRITON_CHECK_LAUNCH=1: prefill (every program, both layouts), decode/kvcache/continuous
#      batching (the base launches rebuild their descriptors to ask Triton's binder; the features: features31)  (<= 300 s)
#   2. host_cost.py with the direct launch, then with FLASH_TRITON_FAST_LAUNCH=0 (Triton's binder every call) (<= 90 s)
#   3. kernel_serving_bench.py decode B 1/16 at 8k: the decode kernel's GPU time after the workspace change, and
#      --tune-set merge: the default merge against DecodeConfig(merge_stages=2/3/4) at batch 1 and 4     (the rest)
set -u
dest="${OUT:-/tmp/out}/host30"; mkdir -p "$dest"
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
t0=$(date +%s)
FLASH_TRITON_CHECK_LAUNCH=1 timeout 300 python3 -m pytest -q -m cuda -p no:cacheprovider tests/test_kernel_cuda.py \
  tests/test_kernel_serving_cuda.py > "$dest/cuda-tests.log" 2>&1
echo "cuda tests exit=$? at $(( $(date +%s) - t0 ))s"; grep -E "passed|failed|FAILED|Error" "$dest/cuda-tests.log" | tail -8 | cut -c1-300
timeout 45 python3 kernels/flash-triton/host_cost.py > "$dest/host-cost-direct.log" 2>&1
echo "host_cost exit=$? at $(( $(date +%s) - t0 ))s"; cat "$dest/host-cost-direct.log"
FLASH_TRITON_FAST_LAUNCH=0 timeout 45 python3 kernels/flash-triton/host_cost.py > "$dest/host-cost-slow.log" 2>&1
echo "host_cost (binder every call) exit=$? at $(( $(date +%s) - t0 ))s"; cat "$dest/host-cost-slow.log"
left=$(( 545 - ($(date +%s) - t0) ))
timeout "$left" python3 benchmarks/kernel_serving_bench.py --out "$dest" --parts decode,tune --tune-set merge \
  --batches 1,16 --kv-lens 8192 --flex-budget-s -1 > /dev/null 2> "$dest/serving-bench.log"
echo "serving bench exit=$? at $(( $(date +%s) - t0 ))s"; tail -2 "$dest/serving-bench.log"
grep -E "^\| +(1|16) " "$dest/h200-kernel-serving.md" | head -12 | cut -c1-160
grep -E "merge-pipe|1/SM prefetch" "$dest/h200-kernel-serving.md" | head -24 | cut -c1-160
