#!/usr/bin/env bash
# Regenerates docs/results/serve/ on a GPU: `attnprof serve --loop as-shipped` (transformers as it ships), llama-1b
# bf16: prefill at 1k/4k/8k, decode at batch 1/16/64, a 40-request Poisson stream, eager vs sdpa vs sdpa-flash vs the
# kernel; decode timed twice and profiled cold and warm (cuDNN's plan per new KV length), then the same with
# TORCH_CUDNN_SDPA_AVOID_RECOMPILE=1.
#   bash scripts/gpu/run_all.sh serve
set -u
. scripts/gpu/lib.sh
claim serve
serve=(python3 -m attnprof serve --loop as-shipped --model llama-1b --dtype bf16 --json)
timeout 240 "${serve[@]}" --impls eager,sdpa,sdpa-flash,kernel --mode prefill,decode,continuous \
  --batch 1 --context 1024,4096,8192 --reps 5 --decode-batch 1,16,64 --decode-context 1024 --new-tokens 32 \
  --requests 40 --rate 32 --prompt-median 384 --prompt-sigma 0.6 --max-prompt 1536 \
  --output-median 64 --output-sigma 0.5 --max-output 160 --num-blocks 512 --max-batch-tokens 2048 --stream-timeout 75 \
  --out "$dest" --stem h200-serve > "$dest/serve.log" 2>&1
echo "serve exit=$?"; stamp serve
timeout 150 "${serve[@]}" --impls eager,sdpa,sdpa-flash,kernel --mode decode --decode-batch 1,16 --decode-context 1024 \
  --new-tokens 16 --out "$dest" --stem h200-serve-decode > "$dest/serve-decode.log" 2>&1
echo "decode exit=$?"; stamp decode
TORCH_CUDNN_SDPA_AVOID_RECOMPILE=1 timeout 150 "${serve[@]}" --impls eager,sdpa --mode decode --decode-batch 1,16 \
  --decode-context 1024 --new-tokens 16 --out "$dest" --stem h200-serve-decode-avoid-recompile \
  > "$dest/serve-decode-avoid-recompile.log" 2>&1
echo "decode AVOID_RECOMPILE exit=$?"
