#!/usr/bin/env bash
# GPU evidence for `attnprof serve` (issue 7): the ~1B Llama-3-like preset (llama-1b), bf16, random weights.
# Prefill at 1k/4k/8k, decode at batch 1/16/64 (prompt 1024, 32 new tokens), and a Poisson stream through
# transformers' continuous batching, each with eager vs sdpa vs the stage-four kernel (a row with its reason when it
# cannot load), with the attention share per step and $/1M tokens. Run from the repo root on the H200 machine
# (image python3, no venv). Writes $OUT/serve/h200-serve.{md,json} and two PNGs. Budget: well under 5 minutes.
set -u
dest="${OUT:-/tmp/out}/serve"; mkdir -p "$dest"
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH}
start=$(date +%s)
# The stream: 40 requests arriving at 32/s (about 1.2 s of arrivals, far more work than that, so the server is
# saturated and tokens/s measures capacity), prompts log-normal around 384 tokens, outputs around 64.
# The paged cache is fixed at 512 blocks of 256 tokens (131k tokens, ~4 GiB of KV for this model) and batches at
# 2048 tokens for every implementation, so eager's materialised scores have room and the comparison is like for like.
python3 -m attnprof serve --loop as-shipped --model llama-1b --dtype bf16 --impls eager,sdpa,sdpa-flash,kernel \
  --mode prefill,decode,continuous \
  --batch 1 --context 1024,4096,8192 --reps 5 \
  --decode-batch 1,16,64 --decode-context 1024 --new-tokens 32 \
  --requests 40 --rate 32 --prompt-median 384 --prompt-sigma 0.6 --max-prompt 1536 \
  --output-median 64 --output-sigma 0.5 --max-output 160 \
  --num-blocks 512 --max-batch-tokens 2048 --stream-timeout 75 \
  --out "$dest" --stem h200-serve --json > "$dest/serve.log" 2>&1
rc=$?
echo "serve exit=$rc in $(( $(date +%s) - start ))s"
grep -vE "^\s*$" "$dest/serve.log" | grep -vE "━|USDT" | tail -45
