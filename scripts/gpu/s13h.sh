#!/usr/bin/env bash
# Session 13, last call: the decode CUDA tests at the one-wave split rule (final main), then production decode at 1k
# keys over batch 1/4/16/64/128 with what time is left.
#   EACH_TIMEOUT=280 bash scripts/gpu/run_all.sh s13h
set -u
dest="${OUT:-/tmp/out}/s13h"; mkdir -p "$dest"
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
t0=$(date +%s)
FLASH_TRITON_CHECK_LAUNCH=1 timeout 100 python3 -m pytest -q -m cuda -p no:cacheprovider tests/test_kernel_serving_cuda.py \
  -k "kvcache or decode or paged" > "$dest/cuda-tests.log" 2>&1
echo "decode cuda tests exit=$? at $(( $(date +%s) - t0 ))s"; grep -E "passed|failed|FAILED|Error" "$dest/cuda-tests.log" | tail -6 | cut -c1-300
eval "${PACK:-:}"
left=$(( 270 - ($(date +%s) - t0) ))
timeout "$left" python3 -m attnprof serve --model llama-1b --dtype bf16 --loop production --mode decode --impls sdpa,kernel \
  --decode-batch 1,4,16,64,128 --decode-context 1024 --new-tokens 32 --no-share --out "$dest" \
  --stem production-decode-1k --json > "$dest/serve-1k.log" 2>&1
echo "serve 1k exit=$? at $(( $(date +%s) - t0 ))s"
grep -E "^\| (sdpa|kernel) " "$dest"/production-decode-1k*.md 2>/dev/null | cut -c1-120; grep -iE "recompile|Error" "$dest/serve-1k.log" | head -5
