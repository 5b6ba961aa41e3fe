#!/usr/bin/env bash
# Regenerates docs/results/kernel-decode/ on a GPU: the kernel alone in decode over a dense cache, graph-timed against
# SDPA (cuDNN): the grid batch 1/4/16/64 x 1k/8k/32k keys, the batch-1 tune (split counts around the rule's), the
# decode config sweep, and the decode CUDA oracle tests, all under the launch check where they are tests.
#   DEADLINE=$(( $(date +%s) + 560 )) EACH_TIMEOUT=580 bash scripts/gpu/run_all.sh kernel-decode
set -u
. scripts/gpu/lib.sh
claim kernel-decode
cuda_tests "$dest/decode-tests.log" 120 tests/test_kernel_serving_cuda.py -k "kvcache or decode or paged"
timeout $(( $(left) > 200 ? 200 : $(left) )) python3 benchmarks/kernel_serving_bench.py --out "$dest/decode-grid" --parts decode \
  --batches 1,4,16,64 --kv-lens 1024,8192,32768 --flex-budget-s -1 > "$dest/decode-grid.log" 2>&1
echo "decode grid exit=$?"; stamp "decode grid"
timeout $(( $(left) > 120 ? 120 : $(left) )) python3 benchmarks/kernel_serving_bench.py --out "$dest/batch1" --parts tune \
  --tune-set batch1 > "$dest/batch1.log" 2>&1
echo "batch-1 tune exit=$?"; stamp "batch-1 tune"
timeout $(( $(left) > 150 ? 150 : $(left) )) python3 benchmarks/kernel_serving_bench.py --out /tmp/decode-tune --parts tune \
  > "$dest/decode-tune.log" 2>&1
echo "decode tune exit=$?"
cp /tmp/decode-tune/*kernel-serving.md "$dest/decode-tune.md"; cp /tmp/decode-tune/kernel-serving-bench.json "$dest/decode-tune.json"
