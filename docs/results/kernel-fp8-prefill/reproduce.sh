#!/usr/bin/env bash
# Regenerates docs/results/kernel-fp8-prefill/ on a GPU: the kernel's FP8 prefill (e4m3 q, k, v with descales) beside
# its bf16 prefill, SDPA's cuDNN (bf16) and, where the installed torch has it, FlashAttention-3's quantized SDPA;
# causal, head dim 128, B·S = 16k, S 1k-16k (`benchmarks/kernel_fp8_prefill_bench.py`); then the FP8 prefill's
# compile and CPU-oracle tests as a GPU sees them (`tests/test_kernel_fp8_prefill.py`, the sm_90 compile).
#   bash scripts/gpu/run_all.sh kernel-fp8-prefill      (or alone: OUT=/some/dir bash docs/results/kernel-fp8-prefill/reproduce.sh)
#   PARTS=tests,bench,attnprof (default: all); EXPLORE= (empty) times only the default configs, not the tile grid
set -u
. scripts/gpu/lib.sh
claim kernel-fp8-prefill
part() { [[ ",${PARTS:-tests,bench,attnprof}," == *",$1,"* ]]; }
# the FP8 prefill programs' oracle tests (the Triton program, the Gluon one, against each other and fp64)
part tests && cuda_tests "$dest/tests.log" 150 tests/test_kernel_fp8_gluon_cuda.py tests/test_kernel_fp8_prefill.py
if part bench; then
timeout $(( $(left) > 240 ? 240 : $(left) )) python3 benchmarks/kernel_fp8_prefill_bench.py --rounds 3 ${EXPLORE---explore} \
  --out "$dest/fp8-prefill.jsonl" > "$dest/fp8-prefill.log" 2>&1
echo "fp8 prefill bench exit=$?"; tail -20 "$dest/fp8-prefill.log" | cut -c1-200; stamp "fp8 prefill"
fi
part attnprof || exit 0
# attnprof itself with --dtype fp8 (FP8 attention: the quantize steps inside the kernel's call): the numerics gate
# on the default CUDA cases, a bench against the measured fp8 matmul ceiling beside bf16, and the stage profile
# (quantize kernels and the FP8 program by name)
timeout $(( $(left) > 60 ? 60 : $(left) )) python3 -m attnprof ceilings > "$dest/ceilings.log" 2>&1
echo "ceilings exit=$?"; tail -8 "$dest/ceilings.log"
timeout $(( $(left) > 90 ? 90 : $(left) )) python3 -m attnprof verify --device cuda --dtype fp8 --variants kernel,sdpa \
  --seed 0 --out /tmp/fp8-attn-verify > "$dest/verify.log" 2>&1
echo "verify --dtype fp8 exit=$?"; cp /tmp/fp8-attn-verify/verify.md "$dest/verify.md"; stamp "verify fp8"
timeout $(( $(left) > 120 ? 120 : $(left) )) python3 -m attnprof bench --device cuda --dtype bf16,fp8 --variants kernel,sdpa \
  --batch 1 --heads 16 --seq 4096,16384 --head-dim 128 --causal --wide --out /tmp/fp8-attn-bench > "$dest/bench.log" 2>&1
echo "bench --dtype bf16,fp8 exit=$?"; cp /tmp/fp8-attn-bench/results.jsonl "$dest/bench.jsonl"; tail -14 "$dest/bench.log" | cut -c1-200
timeout $(( $(left) > 60 ? 60 : $(left) )) python3 -m attnprof stages --device cuda --dtype fp8 --batch 1 --heads 32 \
  --seq 8192 --head-dim 128 --wide --out /tmp/fp8-attn-stages > "$dest/stages.log" 2>&1
echo "stages --dtype fp8 exit=$?"; cp /tmp/fp8-attn-stages/results.json "$dest/stages.json"; tail -16 "$dest/stages.log" | cut -c1-200
stamp "attnprof --dtype fp8"
