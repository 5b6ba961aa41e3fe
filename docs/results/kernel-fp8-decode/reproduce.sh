#!/usr/bin/env bash
# Regenerates docs/results/kernel-fp8-decode/ on a GPU: the kernel's decode over an FP8 (e4m3) KV cache beside the
# same kernel over the bf16 cache and SDPA (cuDNN), graph-timed with caches cycled past L2 (GB/s counts the bytes
# each one reads: half for FP8), batch 1/16/64 x 8k/32k keys, dense and paged (256-key pages); the FP8 decode
# oracle tests (and the bf16 ones beside them) under the launch check; and the numerics gate over an FP8 cache
# (`verify --kv-dtype fp8`: what e4m3 costs against a bf16 cache, per case; `--model llama-1b`: what it costs the
# model, KL / top-1 / greedy against the bf16 cache, the kernel reading the FP8 bytes).
#   bash scripts/gpu/run_all.sh kernel-fp8-decode      (or alone: OUT=/some/dir bash docs/results/kernel-fp8-decode/reproduce.sh)
set -u
. scripts/gpu/lib.sh
claim kernel-fp8-decode
timeout $(( $(left) > 200 ? 200 : $(left) )) python3 benchmarks/kernel_serving_bench.py --out "$dest/grid" --parts decode \
  --decode-impls ours,ours-fp8,ours-paged256,ours-fp8-paged256,sdpa --batches 1,16,64 --kv-lens 8192,32768 \
  --flex-budget-s -1 > "$dest/grid.log" 2>&1
echo "fp8 decode grid exit=$?"; stamp "fp8 decode grid"
cuda_tests "$dest/tests.log" 150 tests/test_kernel_serving_cuda.py -k "kvcache"
timeout $(( $(left) > 120 ? 120 : $(left) )) python3 -m attnprof verify --device cuda --dtype bf16 --kv-dtype fp8 \
  --variants kernel,sdpa --seed 0 --out /tmp/fp8-verify > "$dest/verify.log" 2>&1
echo "verify --kv-dtype fp8 exit=$?"
cp /tmp/fp8-verify/verify.md "$dest/verify.md"; cp /tmp/fp8-verify/verify.json "$dest/verify.json"; stamp verify
timeout $(( $(left) > 150 ? 150 : $(left) )) python3 -m attnprof verify --device cuda --model llama-1b --dtype bf16 \
  --kv-dtype fp8 --impls eager,sdpa,kernel --seed 0 --out /tmp/fp8-verify-model > "$dest/verify-model.log" 2>&1
echo "verify --model llama-1b --kv-dtype fp8 exit=$?"
cp /tmp/fp8-verify-model/verify.md "$dest/verify-model.md"; cp /tmp/fp8-verify-model/verify.json "$dest/verify-model.json"
stamp "verify model"
