#!/usr/bin/env bash
# Session 13, call 2: every kernel CUDA test at the session-12/13 defaults (merge-4 decode, bounded softcap, cap_poly
# rows) under FLASH_TRITON_CHECK_LAUNCH=1 (repeat launches rebuild their TMA descriptors to ask Triton's binder),
# then production decode at the merge-4 default: serve --loop production --mode decode, sdpa and kernel, batch 1 and
# 16 over 8k (re-makes the 8k rows of h200-decode/production-decode-8k.md that predate merge 4).
#   EACH_TIMEOUT=595 bash scripts/gpu/run_all.sh s13b
set -u
dest="${OUT:-/tmp/out}/s13b"; mkdir -p "$dest"
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
t0=$(date +%s)
FLASH_TRITON_CHECK_LAUNCH=1 timeout 360 python3 -m pytest -q -m cuda -p no:cacheprovider tests/test_kernel_cuda.py \
  tests/test_kernel_serving_cuda.py tests/test_kernel_features.py > "$dest/cuda-tests.log" 2>&1
echo "cuda tests exit=$? at $(( $(date +%s) - t0 ))s"; grep -E "passed|failed|FAILED|Error" "$dest/cuda-tests.log" | tail -10 | cut -c1-300
eval "${PACK:-:}"
left=$(( 585 - ($(date +%s) - t0) ))
timeout "$left" python3 -m attnprof serve --model llama-1b --dtype bf16 --loop production --mode decode --impls sdpa,kernel \
  --decode-batch 1,16 --decode-context 8192 --new-tokens 32 --no-share --out "$dest" \
  --stem production-decode-8k --json > "$dest/serve-8k.log" 2>&1
echo "serve 8k exit=$? at $(( $(date +%s) - t0 ))s"
grep -E "^\| (sdpa|kernel) " "$dest"/production-decode-8k*.md 2>/dev/null | cut -c1-160
grep -iE "recompile|Error" "$dest/serve-8k.log" | head -5
