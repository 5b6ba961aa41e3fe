#!/usr/bin/env bash
# The stale production-serving evidence re-made at the session-9/10 decode defaults and launch path (prepared in
# session 10, not run yet): h200-serve/production-cb.md (short stream, four implementations), production-cb-long.md
# (a 300-request stream, kernel and sdpa) and production-decode.md (generate's production loop at batch 1, 1k).
#   EACH_TIMEOUT=480 bash scripts/gpu/run_all.sh cb30
set -u
dest="${OUT:-/tmp/out}/cb30"; mkdir -p "$dest"
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
t0=$(date +%s)
STREAM=(--prompt-median 384 --prompt-sigma 0.6 --max-prompt 1536 --output-median 64 --output-sigma 0.5 --max-output 160
        --max-batch-tokens 2048 --slo-ttft-ms 2000 --slo-tpot-ms 50)
timeout 100 python3 -m attnprof serve --model llama-1b --dtype bf16 --loop production --mode continuous \
  --impls eager,sdpa,kernel,sdpa-efficient --requests 40 --rate 32 --num-blocks 512 --stream-timeout 30 "${STREAM[@]}" \
  --out "$dest" --stem production-cb --json > "$dest/production-cb.log" 2>&1
echo "serve CB exit=$? at $(( $(date +%s) - t0 ))s"; grep -E "^\| (eager|sdpa|kernel)" "$dest/production-cb.md" | head -4 | cut -c1-200
timeout 110 python3 -m attnprof serve --model llama-1b --dtype bf16 --loop production --mode decode \
  --impls eager,sdpa,sdpa-flash,kernel --decode-batch 1 --decode-context 1024 --new-tokens 40 --no-share \
  --out "$dest" --stem production-decode --json > "$dest/production-decode.log" 2>&1
echo "production decode exit=$? at $(( $(date +%s) - t0 ))s"; grep -E "^\| (eager|sdpa|kernel)" "$dest/production-decode.md" | cut -c1-160
left=$(( 465 - ($(date +%s) - t0) ))
timeout "$left" python3 -m attnprof serve --model llama-1b --dtype bf16 --loop production --mode continuous \
  --impls kernel,sdpa --requests 300 --rate 24 --num-blocks 1024 --stream-timeout 60 "${STREAM[@]}" \
  --out "$dest" --stem production-cb-long --json > "$dest/production-cb-long.log" 2>&1
echo "long stream exit=$? at $(( $(date +%s) - t0 ))s"; grep -E "^\| (sdpa|kernel)" "$dest/production-cb-long.md" | head -3 | cut -c1-200
