#!/usr/bin/env bash
# Regenerates docs/results/production-decode/ on a GPU: llama-1b bf16 `generate` with a static cache under
# torch.compile(mode="reduce-overhead"), SDPA (its cuDNN choice) against the kernel, 32 new tokens.
#   PART=grid (default): batch 1/4/16/64/128 x context 1k/8k/32k in ONE `serve` run (~13 min on an H100: longer than
#     one device call, so scripts/gpu/background.sh runs it and every call re-attaches; call again until it says done):
#       WAIT_S=500 EACH_TIMEOUT=530 bash scripts/gpu/run_all.sh production-decode
#   PART=chunked: the cells a one-shot prefill cannot hold on 80 GB, prefilled in chunks (64,128 x 8k; then 64 x 32k
#     if ~300 s are left, else PART=chunked32 alone in the next call)
#   PART=b1: batch 1 at 1k with eager, sdpa, sdpa-flash and the kernel, and the CUDA-graph tests behind it
set -u
. scripts/gpu/lib.sh
claim production-decode
serve=(python3 -m attnprof serve --model llama-1b --dtype bf16 --loop production --mode decode --new-tokens 32 --no-share --json)
case "${PART:-grid}" in
grid)
  bash scripts/gpu/background.sh production-decode-grid "$dest" "${serve[*]} --impls sdpa,kernel \
    --decode-batch 1,4,16,64,128 --decode-context 1024,8192,32768 --out \$BG_OUT --stem production-decode-grid" ;;
chunked)
  timeout $(( $(left) - 5 )) "${serve[@]}" --impls sdpa,kernel --decode-batch 64,128 --decode-context 8192 \
    --out "$dest" --stem production-decode-8k > "$dest/production-decode-8k.log" 2>&1; echo "8k exit=$?"
  [ "$(left)" -gt 320 ] || { echo "the 64 x 32k cell needs ~300 s: run PART=chunked32 in a call of its own"; exit 0; }
  timeout $(( $(left) - 5 )) "${serve[@]}" --impls sdpa,kernel --decode-batch 64 --decode-context 32768 \
    --out "$dest" --stem production-decode-32k > "$dest/production-decode-32k.log" 2>&1; echo "32k exit=$?" ;;
chunked32)
  timeout $(( $(left) - 5 )) "${serve[@]}" --impls sdpa,kernel --decode-batch 64 --decode-context 32768 \
    --out "$dest" --stem production-decode-32k > "$dest/production-decode-32k.log" 2>&1; echo "32k exit=$?" ;;
b1)
  timeout 90 python3 -m pytest -q -m cuda -p no:cacheprovider tests/test_kernel_serving_cuda.py \
    -k "reduce_overhead or cuda_graph or host_sync" > "$dest/production-decode-b1-cuda-tests.log" 2>&1
  echo "cuda tests exit=$?"
  timeout 140 python3 -m attnprof serve --model llama-1b --dtype bf16 --loop production --mode decode \
    --impls eager,sdpa,sdpa-flash,kernel --decode-batch 1 --decode-context 1024 --new-tokens 40 --no-share \
    --out "$dest" --stem production-decode-b1 --json > "$dest/production-decode-b1.log" 2>&1; echo "b1 exit=$?" ;;
*) echo "PART must be grid, chunked, chunked32 or b1"; exit 2 ;;
esac
