#!/usr/bin/env bash
# Regenerates docs/results/kernel-prefill/ on a GPU: the kernel's prefill against SDPA (cuDNN), FlashAttention-2 and
# FlexAttention (CUDA-graph replays, L2 flushed; causal and not, head dims 64/128 at S 512-16k, ragged 3000, head dims
# 80/96/256 at 2k/8k), packed varlen prefill at head dims 128 and 64, and the kernel's CUDA oracle tests.
#   EACH_TIMEOUT=590 bash scripts/gpu/run_all.sh kernel-prefill
set -u
. scripts/gpu/lib.sh
claim kernel-prefill
timeout 260 python3 benchmarks/kernel_bench.py --out "$dest" --causal both --flex-budget-s 45 > /dev/null 2> "$dest/bench.log"
echo "bench exit=$?"; mv "$dest/kernel-bench.json" "$dest/h200-kernel.json" 2>/dev/null; stamp bench
for d in 128 64; do
  timeout 60 python3 benchmarks/kernel_serving_bench.py --out "/tmp/varlen-d$d" --parts varlen --head-dim $d \
    --flex-budget-s -1 > "$dest/varlen-d$d.log" 2>&1
  echo "varlen d=$d exit=$?"
  cp /tmp/varlen-d$d/*kernel-serving.md "$dest/h200-kernel-varlen-d$d.md"
  cp /tmp/varlen-d$d/kernel-serving-bench.json "$dest/h200-kernel-varlen-d$d.json"
done
cuda_tests "$dest/kernel-views-cuda-tests.log" 120 tests/test_kernel_cuda.py \
  -k "views or variant_and_registry or next_batch or default_dispatch"
cuda_tests "$dest/kernel-cuda-tests.log" 300 tests/test_kernel_cuda.py tests/test_kernel_serving_cuda.py
