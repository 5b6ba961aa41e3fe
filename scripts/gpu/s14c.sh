#!/usr/bin/env bash
# Session 14, when the device time left cannot hold the whole grid (grid14.sh): production decode at 1k keys over
# batch 1/4/16/64/128 (1k x 128 was last measured in session 9), then every kernel CUDA test under
# FLASH_TRITON_CHECK_LAUNCH=1 with what time is left before DEADLINE (epoch seconds).
#   DEADLINE=$(( $(date +%s) + 500 )) EACH_TIMEOUT=590 bash scripts/gpu/run_all.sh s14a s14c
set -u
dest="${OUT:-/tmp/out}/s14c"; mkdir -p "$dest"
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
t0=$(date +%s); deadline=${DEADLINE:-$(( t0 + 400 ))}
left() { echo $(( deadline - $(date +%s) )); }
[ "$(left)" -gt 60 ] && timeout $(( $(left) - 10 )) python3 -m attnprof serve --model llama-1b --dtype bf16 --loop production \
  --mode decode --impls sdpa,kernel --decode-batch 1,4,16,64,128 --decode-context 1024 --new-tokens 32 --no-share \
  --out "$dest" --stem production-decode-1k --json > "$dest/serve-1k.log" 2>&1
echo "serve 1k exit=$? at $(( $(date +%s) - t0 ))s"
grep -E "^\| (sdpa|kernel) " "$dest"/production-decode-1k*.md 2>/dev/null | cut -c1-90
for part in "$dest"/.production*.part "$dest"/.s14c*.part; do [ -d "$part" ] && ls "$part"; done
grep -iE "recompile|gains" "$dest/serve-1k.log" | head -3 | cut -c1-600
eval "${PACK:-:}"
[ "$(left)" -gt 40 ] && FLASH_TRITON_CHECK_LAUNCH=1 timeout $(( $(left) - 8 )) python3 -m pytest -q -m cuda \
  -p no:cacheprovider tests/test_kernel_serving_cuda.py tests/test_kernel_cuda.py tests/test_kernel_features.py \
  > "$dest/cuda-tests.log" 2>&1
echo "cuda tests exit=$? at $(( $(date +%s) - t0 ))s"; grep -E "passed|failed|FAILED|Error" "$dest/cuda-tests.log" | tail -8 | cut -c1-300
