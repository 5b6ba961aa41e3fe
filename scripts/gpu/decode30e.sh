#!/usr/bin/env bash
# Issue 30, fifth call: the kernel's batch-1 row at 32k keys failed in decode30d with an inductor AssertionError (the
# split reduction of an argmax over the cache mask; now min/max), and serve refused 64 x 8k as needing 270 GiB
# (logits for every position; now the last one, as generate keeps). Production decode at those points:
#   EACH_TIMEOUT=430 bash scripts/gpu/run_all.sh decode30e
#   1. serve --loop production --mode decode, sdpa and kernel at batch 1, context 32768                      (<= 170 s)
#   2. the same at batch 1/4/16/64, context 8192                                                            (the rest)
set -u
dest="${OUT:-/tmp/out}/decode30e"; mkdir -p "$dest"
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
t0=$(date +%s)
timeout 170 python3 -m attnprof serve --model llama-1b --dtype bf16 --loop production --mode decode --impls sdpa,kernel \
  --decode-batch 1 --decode-context 32768 --new-tokens 32 --no-share --out "$dest" \
  --stem production-decode-32k-b1 --json > "$dest/serve-32k.log" 2>&1
echo "serve 32k exit=$? at $(( $(date +%s) - t0 ))s"
grep -E "^\| (sdpa|kernel) " "$dest/production-decode-32k-b1.md" | cut -c1-120; grep -iE "recompile|Error" "$dest/serve-32k.log" | head -5
left=$(( 415 - ($(date +%s) - t0) ))
timeout "$left" python3 -m attnprof serve --model llama-1b --dtype bf16 --loop production --mode decode --impls sdpa,kernel \
  --decode-batch 1,4,16,64 --decode-context 8192 --new-tokens 32 --no-share --out "$dest" \
  --stem production-decode-8k --json > "$dest/serve-8k.log" 2>&1
echo "serve 8k exit=$? at $(( $(date +%s) - t0 ))s"
grep -E "^\| (sdpa|kernel) " "$dest/production-decode-8k.md" "$dest"/production-decode-8k*.md 2>/dev/null | cut -c1-140
grep -iE "recompile|Error" "$dest/serve-8k.log" | head -5; ls "$dest"
