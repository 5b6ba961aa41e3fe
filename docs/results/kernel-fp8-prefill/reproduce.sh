#!/usr/bin/env bash
# Regenerates docs/results/kernel-fp8-prefill/ on a GPU: the kernel's FP8 prefill (e4m3 q, k, v with descales) beside
# its bf16 prefill, SDPA's cuDNN (bf16) and, where the installed torch has it, FlashAttention-3's quantized SDPA;
# causal, head dim 128, B·S = 16k, S 1k-16k (`benchmarks/kernel_fp8_prefill_bench.py`); then the FP8 prefill's
# compile and CPU-oracle tests as a GPU sees them (`tests/test_kernel_fp8_prefill.py`, the sm_90 compile).
#   bash scripts/gpu/run_all.sh kernel-fp8-prefill      (or alone: OUT=/some/dir bash docs/results/kernel-fp8-prefill/reproduce.sh)
set -u
. scripts/gpu/lib.sh
claim kernel-fp8-prefill
timeout $(( $(left) > 240 ? 240 : $(left) )) python3 benchmarks/kernel_fp8_prefill_bench.py --rounds 3 \
  --out "$dest/fp8-prefill.jsonl" > "$dest/fp8-prefill.log" 2>&1
echo "fp8 prefill bench exit=$?"; tail -20 "$dest/fp8-prefill.log" | cut -c1-200; stamp "fp8 prefill"
