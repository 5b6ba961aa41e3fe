#!/usr/bin/env bash
# Issue 17 (session 8), third call: the benchmark on GPU time and the host cost, on the defaults of TUNING.md step 13.
#   EACH_TIMEOUT=420 bash scripts/gpu/run_all.sh envelope15
#   1. benchmarks/kernel_bench.py: CUDA-graph replays, L2 flushed; causal and not, D 128/64, S 512-16k, ragged 3000
#      vs 3072, D 80/96/256 at 2k/8k; issue 17's targets at the top                                      (<= 300 s)
#   2. host_cost.py: host microseconds per call, ours vs SDPA (the plan cache)                            (<= 40 s)
set -u
dest="${OUT:-/tmp/out}/envelope15"; mkdir -p "$dest"
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
t0=$(date +%s)
timeout 300 python3 benchmarks/kernel_bench.py --out "$dest" --causal both --flex-budget-s 45 > /dev/null 2> "$dest/bench.log"
echo "bench exit=$? at $(( $(date +%s) - t0 ))s"; tail -3 "$dest/bench.log"
sed -n '/## Issue 17/,/spread/p' "$dest/h200-kernel.md"
grep -E "^\| [0-9]+ \| [0-9]+ \| (sdpa|kernel) " "$dest/h200-kernel.md" | cut -c1-120
timeout 40 python3 kernels/flash-triton/host_cost.py > "$dest/host-cost.log" 2>&1
echo "host_cost exit=$? at $(( $(date +%s) - t0 ))s"; cat "$dest/host-cost.log"
