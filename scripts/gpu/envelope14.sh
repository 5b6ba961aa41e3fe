#!/usr/bin/env bash
# Issue 17 (session 7), fourth call: packed prefill in transformers' layout on the varlen Gluon program.
#   EACH_TIMEOUT=420 bash scripts/gpu/run_all.sh envelope14
#   1. cuda tests: varlen (every program, strided views), continuous batching on our kernel (its prefill must take
#      the Gluon program), the dense ragged/dispatch tests                                               (<= 150 s)
#   2. benchmarks/kernel_serving_bench.py --parts varlen: 8 causal sequences 512-8k, 32/8 heads, D 128 and 64 (<= 70 s)
#   3. attnprof serve --loop production --mode continuous: part 1 of serve_production.sh (production-cb)   (<= 95 s)
set -u
dest="${OUT:-/tmp/out}/envelope14"; mkdir -p "$dest"
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
t0=$(date +%s)
timeout 150 python3 -m pytest -q -m cuda -p no:cacheprovider tests/test_kernel_serving_cuda.py tests/test_kernel_cuda.py \
  -k "varlen or continuous_batching or ragged or default_dispatch" > "$dest/cuda-tests.log" 2>&1
echo "cuda tests exit=$? at $(( $(date +%s) - t0 ))s"; grep -E "passed|failed|FAILED|Error|assert" "$dest/cuda-tests.log" | tail -12 | cut -c1-300
for d in 128 64; do
  timeout 35 python3 benchmarks/kernel_serving_bench.py --out "$dest/varlen-d$d" --parts varlen --head-dim $d \
    --flex-budget-s -1 > "$dest/varlen-d$d.log" 2>&1
  echo "varlen d=$d exit=$? at $(( $(date +%s) - t0 ))s"; grep -E "ours|sdpa" "$dest/varlen-d$d/h200-kernel-serving.md" | cut -c1-150
done
STREAM=(--requests 40 --rate 32 --prompt-median 384 --prompt-sigma 0.6 --max-prompt 1536 --output-median 64
        --output-sigma 0.5 --max-output 160 --num-blocks 512 --max-batch-tokens 2048 --stream-timeout 30
        --slo-ttft-ms 2000 --slo-tpot-ms 50)
timeout 95 python3 -m attnprof serve --model llama-1b --dtype bf16 --loop production --mode continuous \
  --impls eager,sdpa,kernel,sdpa-efficient "${STREAM[@]}" --out "$dest" --stem production-cb --json \
  > "$dest/production-cb.log" 2>&1
echo "serve CB exit=$? at $(( $(date +%s) - t0 ))s"; grep -E "^\| (eager|sdpa|kernel)" "$dest/production-cb.md" | head -4 | cut -c1-200
