#!/usr/bin/env bash
# Issue 30, third call: the shipped decode defaults (128-key tiles up to head dim 128, 1 CTA slot per SM, prefetching
# merge; decode30b.sh's sweep) checked and measured, then production decode at context 1024.
#   EACH_TIMEOUT=570 bash scripts/gpu/run_all.sh decode30c
#   1. decode cuda tests with FLASH_TRITON_CHECK_LAUNCH=1                                                   (<= 90 s)
#   2. host_cost.py (prefill and decode, ours vs SDPA; fast launch on)                                      (<= 40 s)
#   3. kernel_serving_bench.py decode, B 1/4/16/64 x Skv 1k/8k/32k, graph-timed vs SDPA                      (<= 130 s)
#   4. serve --loop production --mode decode, sdpa and kernel, batch 1/4/16/64/128 at context 1024          (the rest)
set -u
dest="${OUT:-/tmp/out}/decode30c"; mkdir -p "$dest"
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
t0=$(date +%s)
FLASH_TRITON_CHECK_LAUNCH=1 timeout 90 python3 -m pytest -q -m cuda -p no:cacheprovider tests/test_kernel_serving_cuda.py \
  -k "kvcache or decode or no_host_sync" > "$dest/cuda-tests.log" 2>&1
echo "cuda tests exit=$? at $(( $(date +%s) - t0 ))s"; grep -E "passed|failed|FAILED|Error" "$dest/cuda-tests.log" | tail -8 | cut -c1-300
timeout 40 python3 kernels/flash-triton/host_cost.py > "$dest/host-cost.log" 2>&1
echo "host_cost exit=$? at $(( $(date +%s) - t0 ))s"; cat "$dest/host-cost.log"
timeout 130 python3 benchmarks/kernel_serving_bench.py --out "$dest" --parts decode --batches 1,4,16,64 \
  --kv-lens 1024,8192,32768 --flex-budget-s -1 > /dev/null 2> "$dest/serving-bench.log"
echo "serving bench exit=$? at $(( $(date +%s) - t0 ))s"; tail -2 "$dest/serving-bench.log"
sed -n '/### Targets/,/^| B |/p' "$dest/h200-kernel-serving.md" | head -20
left=$(( 555 - ($(date +%s) - t0) ))
timeout "$left" python3 -m attnprof serve --model llama-1b --dtype bf16 --loop production --mode decode --impls sdpa,kernel \
  --decode-batch 1,4,16,64,128 --decode-context 1024 --new-tokens 32 --no-share --out "$dest" \
  --stem production-decode-1k --json > "$dest/serve-1k.log" 2>&1
echo "serve 1k exit=$? at $(( $(date +%s) - t0 ))s"
grep -E "^\| (sdpa|kernel) " "$dest/production-decode-1k.md" | cut -c1-120; grep -iE "recompile|Error" "$dest/serve-1k.log" | head -5
