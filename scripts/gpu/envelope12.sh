#!/usr/bin/env bash
# Issue 17 (session 7), second call: the new defaults checked and measured in one go.
#   EACH_TIMEOUT=590 bash scripts/gpu/run_all.sh envelope12
#   1. cuda tests: tests/test_kernel_cuda.py (every path, both layouts, the ragged Gluon path and its isolation from
#      the next sequence) + the varlen tests of tests/test_kernel_serving_cuda.py (packed prefill now on Gluon) (<= 230 s)
#   2. benchmarks/kernel_bench.py: causal and not, D 128/64, S 512-16k, ragged 3000 vs 3072, D 80/96/256 (<= 300 s)
#   3. host_cost.py: host microseconds per call, ours vs SDPA                                          (<= 40 s)
# Writes $OUT/envelope12/{cuda-tests.log, h200-kernel.md, kernel-bench.json, bench.log, host-cost.log}.
set -u
dest="${OUT:-/tmp/out}/envelope12"; mkdir -p "$dest"
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
t0=$(date +%s)
timeout 230 python3 -m pytest -q -m cuda -p no:cacheprovider tests/test_kernel_cuda.py tests/test_kernel_serving_cuda.py \
  -k "not serving_cuda or varlen" > "$dest/cuda-tests.log" 2>&1
echo "cuda tests exit=$? at $(( $(date +%s) - t0 ))s"; grep -E "passed|failed|FAILED|Error" "$dest/cuda-tests.log" | tail -12 | cut -c1-300
timeout 300 python3 benchmarks/kernel_bench.py --out "$dest" --causal both --flex-budget-s 45 > /dev/null 2> "$dest/bench.log"
echo "bench exit=$? at $(( $(date +%s) - t0 ))s"; tail -3 "$dest/bench.log"
sed -n '/## Issue 17/,/spread/p' "$dest/h200-kernel.md"
grep -E "^\| [0-9]+ \| [0-9]+ \| (sdpa|kernel) " "$dest/h200-kernel.md" | cut -c1-110
timeout 40 python3 kernels/flash-triton/host_cost.py > "$dest/host-cost.log" 2>&1
echo "host_cost exit=$? at $(( $(date +%s) - t0 ))s"; cat "$dest/host-cost.log"
