#!/usr/bin/env bash
# Issue 17 (session 8), fourth call: serving re-made on step 13's kernel, then short sequences at head dim 128.
#   EACH_TIMEOUT=300 bash scripts/gpu/run_all.sh short14
#   1. attnprof serve --loop production --mode continuous (llama-1b, head dim 64: packed prefill on the varlen Gluon
#      program with K and V released apart), the 40-request stream of envelope14.sh -> production-cb     (<= 95 s)
#   2. tune.py --round 14: head dim 128 at 16x1024 and 8x2048, causal and not: the one-warpgroup Gluon program
#      (64-row tiles, two CTAs per SM) against the warp-specialized default; every candidate on the oracle (<= 150 s)
set -u
dest="${OUT:-/tmp/out}/short14"; mkdir -p "$dest"
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
t0=$(date +%s)
STREAM=(--requests 40 --rate 32 --prompt-median 384 --prompt-sigma 0.6 --max-prompt 1536 --output-median 64
        --output-sigma 0.5 --max-output 160 --num-blocks 512 --max-batch-tokens 2048 --stream-timeout 30
        --slo-ttft-ms 2000 --slo-tpot-ms 50)
timeout 95 python3 -m attnprof serve --model llama-1b --dtype bf16 --loop production --mode continuous \
  --impls eager,sdpa,kernel,sdpa-efficient "${STREAM[@]}" --out "$dest" --stem production-cb --json \
  > "$dest/production-cb.log" 2>&1
echo "serve CB exit=$? at $(( $(date +%s) - t0 ))s"; grep -E "^\| (eager|sdpa|kernel)" "$dest/production-cb.md" | head -4 | cut -c1-200
timeout 150 python3 kernels/flash-triton/tune.py --round 14 --causal both --budget-s 110 --head-dims 128 \
  --shapes 16x1024,8x2048 --out "$dest" > "$dest/tune14.log" 2>&1
echo "tune14 exit=$? at $(( $(date +%s) - t0 ))s"; sed -n '/^   d /,$p' "$dest/tune14.log" | cut -c1-100
