#!/usr/bin/env bash
# Issue 17, item 2 on one H200: head dims 80, 96 (padded to 128 columns) and 256 in the Triton programs.
#   EACH_TIMEOUT=480 bash scripts/gpu/run_all.sh kernel_dims
#   1. cuda tests: the new head dims vs the fp64 oracle (dense, GQA, ragged, decode), the default path, and the
#      serving entry points (varlen, kvcache, CUDA graphs) after the BLOCK_D change (<= 200 s)
#   2. benchmarks/kernel_bench.py at head dims 80, 96, 256 and 128 (regression), S 2k and 8k, causal (<= 250 s)
# Writes $OUT/kernel_dims/{cuda-tests.log, h200-kernel-headdims.md, kernel-bench.json, bench.log}.
set -u
dest="${OUT:-/tmp/out}/kernel_dims"; mkdir -p "$dest"
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
t0=$(date +%s)
timeout 200 python3 -m pytest -q -m cuda -p no:cacheprovider tests/test_kernel_cuda.py tests/test_kernel_serving_cuda.py \
  -k "head_dims or (matches_oracle and default) or kvcache or varlen or cuda_graph or host_sync or reduce_overhead" \
  > "$dest/cuda-tests.log" 2>&1
echo "cuda tests exit=$? at $(( $(date +%s) - t0 ))s"; grep -E "passed|failed|FAILED|Error" "$dest/cuda-tests.log" | tail -10 | cut -c1-300
timeout 250 python3 benchmarks/kernel_bench.py --out "$dest" --head-dims 80,96,256,128 --seqs 2048,8192 --reps 20 \
  --flex-budget-s 25 > "$dest/bench.log" 2>&1
echo "bench exit=$? at $(( $(date +%s) - t0 ))s"
[ -f "$dest/h200-kernel.md" ] && mv "$dest/h200-kernel.md" "$dest/h200-kernel-headdims.md"
grep -E "^d=|matmul" "$dest/bench.log" | head -12
