#!/usr/bin/env bash
# Session 11, call 1: poly_exp on the varlen Gluon program (issue 31, softcap's speed) and the CUtensorMap cache of the
# direct launch (issue 30, host cost).
#   EACH_TIMEOUT=590 bash scripts/gpu/run_all.sh s11a
#   1. the varlen Gluon program's feature tests (and sinks on the dense warp-specialized one) against the fp64 oracle, poly_exp cases included, with the launch
#      check on (every direct launch, cached maps included, asks Triton's binder)                        (<= 200 s)
#   2. benchmarks/kernel_features_bench.py: default (softcap takes poly_exp), gluon varlen named, and px   (<= 220 s)
#   3. host_cost.py: ours and SDPA interleaved over 7 rounds, medians and the median ratio               (the rest)
set -u
dest="${OUT:-/tmp/out}/s11a"; mkdir -p "$dest"
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
t0=$(date +%s)
FLASH_TRITON_CHECK_LAUNCH=1 timeout 200 python3 -m pytest -q -m cuda -p no:cacheprovider tests/test_kernel_features.py \
  -k "gluon_varlen or dense_warp" > "$dest/features-cuda-tests.log" 2>&1
echo "cuda tests exit=$? at $(( $(date +%s) - t0 ))s"; grep -E "passed|failed|FAILED|Error" "$dest/features-cuda-tests.log" | tail -8 | cut -c1-300
timeout 220 python3 benchmarks/kernel_features_bench.py > "$dest/features-bench.log" 2>&1
echo "bench exit=$? at $(( $(date +%s) - t0 ))s"; cat "$dest/features-bench.log"
left=$(( 575 - ($(date +%s) - t0) ))
timeout "$left" python3 kernels/flash-triton/host_cost.py > "$dest/host-cost.log" 2>&1
echo "host_cost exit=$? at $(( $(date +%s) - t0 ))s"; cat "$dest/host-cost.log"
