#!/usr/bin/env bash
# Issue 30 item 1, the production-decode rows session 9 left out (prepared in session 10, not run yet): batch 128 at
# context 8k, batch 16/64/128 at 32k (a row whose KV cache does not fit the GPU is a failed row with serve's reason).
#   EACH_TIMEOUT=580 bash scripts/gpu/run_all.sh decode30f
set -u
dest="${OUT:-/tmp/out}/decode30f"; mkdir -p "$dest"
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
t0=$(date +%s)
timeout 200 python3 -m attnprof serve --model llama-1b --dtype bf16 --loop production --mode decode --impls sdpa,kernel \
  --decode-batch 128 --decode-context 8192 --new-tokens 32 --no-share --out "$dest" \
  --stem production-decode-8k-b128 --json > "$dest/serve-8k.log" 2>&1
echo "serve 8k exit=$? at $(( $(date +%s) - t0 ))s"
grep -E "^\| (sdpa|kernel) " "$dest/production-decode-8k-b128.md" | cut -c1-140; grep -iE "recompile|Error" "$dest/serve-8k.log" | head -5
left=$(( 565 - ($(date +%s) - t0) ))
timeout "$left" python3 -m attnprof serve --model llama-1b --dtype bf16 --loop production --mode decode --impls sdpa,kernel \
  --decode-batch 16,64,128 --decode-context 32768 --new-tokens 32 --no-share --out "$dest" \
  --stem production-decode-32k-b16-128 --json > "$dest/serve-32k.log" 2>&1
echo "serve 32k exit=$? at $(( $(date +%s) - t0 ))s"
grep -E "^\| (sdpa|kernel) " "$dest/production-decode-32k-b16-128.md" | cut -c1-140
grep -iE "recompile|Error|fit" "$dest/serve-32k.log" | head -5
