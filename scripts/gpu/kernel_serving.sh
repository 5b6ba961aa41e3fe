#!/usr/bin/env bash
# GPU evidence for issue 13: flash-triton's flash_attn_varlen_func and flash_attn_with_kvcache on the H200.
#   1. tests/test_kernel_serving_cuda.py: varlen and kvcache (dense, paged 16/64/256, appends, long contexts) against
#      the fp64 oracle in bf16/fp16, a decode step captured in a CUDA graph and replayed with new lengths, no host
#      sync inside a call, transformers' continuous batching taking its decode fast path on our kernel;
#   2. benchmarks/kernel_serving_bench.py: decode grid B 1/16/64 x Skv 1k/4k/8k/32k (32/8 heads, d128, bf16; dense
#      cache, paged 64 and 256) beside SDPA auto / flash / efficient and flex, eager and CUDA-graph timings, K/V GB/s
#      against the copy ceiling; varlen prefill of 8 causal sequences 512..8k vs our dense kernel per sequence;
#   3. the decode config sweep (TUNING.md's data);
#   4. the dense prefill re-checked (kernel_bench at 1k/4k/16k, head dim 128) against docs/results/h200-kernel.md.
# Each part has its own time limit; a part that fails or runs out of time does not stop the next one.
# Writes $OUT/kernel-serving/{pytest.log, h200-kernel-serving.md, kernel-serving-bench.json, bench.log,
# tune/{h200-kernel-serving.md, kernel-serving-bench.json}, dense/{h200-kernel.md, kernel-bench.json}}.
# Budget: ~4 minutes (caps 120 + 110 + 30 + 30 s = 290 s, inside run_all.sh's default 300 s per script).
set -u
dest="${OUT:-/tmp/out}/kernel-serving"; mkdir -p "$dest/tune" "$dest/dense"
t0=$(date +%s)
if ! python3 -c "import kernels" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/kernels-*.whl && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH}

timeout 120 python3 -m pytest -q -m cuda -rfE tests/test_kernel_serving_cuda.py > "$dest/pytest.log" 2>&1
echo "pytest exit=$? at $(( $(date +%s) - t0 ))s"; tail -15 "$dest/pytest.log"

timeout 110 python3 benchmarks/kernel_serving_bench.py --out "$dest" --parts decode,varlen --flex-budget-s 20 \
  2> "$dest/bench.log" > /dev/null
echo "bench exit=$? at $(( $(date +%s) - t0 ))s"; tail -3 "$dest/bench.log"
sed -n '/^### Targets/,/^| B /p' "$dest/h200-kernel-serving.md" 2>/dev/null | head -16
grep -E "^\| ours-varlen|^\| ours-dense-per-seq" "$dest/h200-kernel-serving.md" 2>/dev/null

timeout 30 python3 benchmarks/kernel_serving_bench.py --out "$dest/tune" --parts tune 2> "$dest/tune/bench.log" > /dev/null
echo "tune exit=$? at $(( $(date +%s) - t0 ))s"; grep -E "^\| decode" "$dest/tune/h200-kernel-serving.md" 2>/dev/null | head -30

timeout 30 python3 benchmarks/kernel_bench.py --out "$dest/dense" --head-dims 128 --seqs 1024,4096,16384 \
  --flex-budget-s -1 --reps 20 2> "$dest/dense/bench.log" > /dev/null
echo "dense recheck exit=$? at $(( $(date +%s) - t0 ))s"; grep -E "^\| [0-9]+ \| [0-9]+ \| (kernel|sdpa) " "$dest/dense/h200-kernel.md" 2>/dev/null
ls -la "$dest"
