#!/usr/bin/env bash
# Regenerates docs/results/kernel-fp8-decode/ on a GPU: the kernel's decode over an FP8 (e4m3) KV cache beside the
# same kernel over the bf16 cache and SDPA (cuDNN), graph-timed with caches cycled past L2 (GB/s counts the bytes
# each one reads: half for FP8), batch 1/16/64 x 8k/32k keys, dense and paged (256-key pages); the FP8 decode
# oracle tests (and the bf16 ones beside them) under the launch check; and the numerics gate over an FP8 cache
# (`verify --kv-dtype fp8`: what e4m3 costs against a bf16 cache, per case; `--model llama-1b`: what it costs the
# model, KL / top-1 / greedy against the bf16 cache, the kernel reading the FP8 bytes).
# Then the decode configs over the FP8 cache (`--parts tune --tune-set fp8`: tile, warps, stages) and what the FP8
# cache is worth end to end: `attnprof serve` production decode of llama-1b over a bf16 and an FP8 static cache.
#   bash scripts/gpu/run_all.sh kernel-fp8-decode      (or alone: OUT=/some/dir bash docs/results/kernel-fp8-decode/reproduce.sh)
#   PARTS=grid,model-shapes,tests,verify,tune,serve (default: all, ~7 min on an H100; a subset for a call with less time)
set -u
. scripts/gpu/lib.sh
claim kernel-fp8-decode
part() { [[ ",${PARTS:-grid,model-shapes,tests,verify,tune,serve}," == *",$1,"* ]]; }
if part grid; then
timeout $(( $(left) > 200 ? 200 : $(left) )) python3 benchmarks/kernel_serving_bench.py --out "$dest/grid" --parts decode \
  --decode-impls ours,ours-fp8,ours-fp8-vkeys,ours-paged256,ours-fp8-paged256,sdpa --batches 1,16,64 --kv-lens 8192,32768 \
  --flex-budget-s -1 > "$dest/grid.log" 2>&1
echo "fp8 decode grid exit=$?"; stamp "fp8 decode grid"
fi
if part model-shapes; then  # the kernel at llama-1b's attention shapes, over the cache layout serve hands it
timeout $(( $(left) > 120 ? 120 : $(left) )) python3 benchmarks/kernel_serving_bench.py --out "$dest/model-shapes" \
  --parts decode --decode-impls ours-heads,ours-fp8-heads,ours-fp8-vkeys --batches 16,64 --kv-lens 8192 --heads 32 \
  --kv-heads 8 --head-dim 64 --flex-budget-s -1 > "$dest/model-shapes.log" 2>&1
echo "model-shape decode exit=$?"; grep "^decode" "$dest/model-shapes.log" | cut -c1-250; stamp "model shapes"
fi
part tests && cuda_tests "$dest/tests.log" 150 tests/test_kernel_serving_cuda.py -k "kvcache or fp8_cache"
if part verify; then
timeout $(( $(left) > 120 ? 120 : $(left) )) python3 -m attnprof verify --device cuda --dtype bf16 --kv-dtype fp8 \
  --variants kernel,sdpa --seed 0 --out /tmp/fp8-verify > "$dest/verify.log" 2>&1
echo "verify --kv-dtype fp8 exit=$?"
cp /tmp/fp8-verify/verify.md "$dest/verify.md"; cp /tmp/fp8-verify/verify.json "$dest/verify.json"; stamp verify
timeout $(( $(left) > 150 ? 150 : $(left) )) python3 -m attnprof verify --device cuda --model llama-1b --dtype bf16 \
  --kv-dtype fp8 --impls eager,sdpa,kernel --seed 0 --out /tmp/fp8-verify-model > "$dest/verify-model.log" 2>&1
echo "verify --model llama-1b --kv-dtype fp8 exit=$?"
cp /tmp/fp8-verify-model/verify.md "$dest/verify-model.md"; cp /tmp/fp8-verify-model/verify.json "$dest/verify-model.json"
stamp "verify model"
fi
if part tune; then
timeout $(( $(left) > 150 ? 150 : $(left) )) python3 benchmarks/kernel_serving_bench.py --out "$dest/tune" --parts tune \
  --tune-set fp8 > "$dest/tune.log" 2>&1
echo "fp8 decode tune exit=$?"; grep "^tune" "$dest/tune.log" | cut -c1-250; stamp "fp8 tune"
fi
if part serve; then
timeout $(( $(left) > 360 ? 360 : $(left) )) python3 -m attnprof serve --model llama-1b --dtype bf16 --loop production \
  --mode decode --impls kernel --kv-dtype fp8 --decode-batch 16,64 --decode-context 8192 --new-tokens 32 \
  --json --out "$dest" --stem serve-kv-fp8 > "$dest/serve-kv-fp8.log" 2>&1
echo "serve --kv-dtype fp8 exit=$?"; grep -E "^ kernel" "$dest/serve-kv-fp8.log" | cut -c1-160; stamp "serve kv fp8"
fi
