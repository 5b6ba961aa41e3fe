#!/usr/bin/env bash
# Regenerates docs/results/continuous-batching/ on a GPU: `attnprof serve --loop production --mode continuous`
# (transformers' paged continuous batching with CUDA graphs, 512 blocks of 256, 2048 batch tokens), llama-1b bf16:
# a 40-request Poisson stream (32/s) over eager, sdpa, sdpa-efficient and the kernel; a 300-request stream (24/s)
# long enough for a steady state, kernel and sdpa; sdpa with TORCH_CUDNN_SDPA_AVOID_RECOMPILE=1 in both loops.
#   EACH_TIMEOUT=590 bash scripts/gpu/run_all.sh continuous-batching
set -u
. scripts/gpu/lib.sh
claim continuous-batching
STREAM=(--prompt-median 384 --prompt-sigma 0.6 --max-prompt 1536 --output-median 64 --output-sigma 0.5 --max-output 160
        --max-batch-tokens 2048 --slo-ttft-ms 2000 --slo-tpot-ms 50)
serve=(python3 -m attnprof serve --model llama-1b --dtype bf16 --mode continuous --json)
timeout 110 "${serve[@]}" --loop production --impls eager,sdpa,kernel,sdpa-efficient --requests 40 --rate 32 \
  --num-blocks 512 --stream-timeout 30 "${STREAM[@]}" --out "$dest" --stem production-cb > "$dest/production-cb.log" 2>&1
echo "short stream exit=$?"; stamp "short stream"
timeout $(( $(left) > 300 ? 300 : $(left) )) "${serve[@]}" --loop production --impls kernel,sdpa --requests 300 --rate 24 \
  --num-blocks 1024 --stream-timeout 60 "${STREAM[@]}" --out "$dest" --stem production-cb-long > "$dest/production-cb-long.log" 2>&1
echo "long stream exit=$?"; stamp "long stream"
TORCH_CUDNN_SDPA_AVOID_RECOMPILE=1 timeout $(( $(left) > 120 ? 120 : $(left) )) "${serve[@]}" --loop as-shipped,production \
  --impls sdpa --requests 40 --rate 32 --num-blocks 512 --stream-timeout 30 "${STREAM[@]}" --out "$dest" \
  --stem production-cb-avoid-recompile > "$dest/production-cb-avoid-recompile.log" 2>&1
echo "AVOID_RECOMPILE exit=$?"
