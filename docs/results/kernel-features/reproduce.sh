#!/usr/bin/env bash
# Regenerates docs/results/kernel-features/ on a GPU: softcap, sinks and sliding windows against the plain call
# (benchmarks/kernel_features_bench.py, every case), their CUDA oracle tests under the launch check, the kernel CUDA
# suites with the time left, and `attnprof verify` on a Gemma 2 config (softcap + windows) on both programs.
#   DEADLINE=$(( $(date +%s) + 560 )) EACH_TIMEOUT=580 bash scripts/gpu/run_all.sh kernel-features
set -u
. scripts/gpu/lib.sh
claim kernel-features
timeout $(( $(left) > 240 ? 240 : $(left) )) python3 benchmarks/kernel_features_bench.py > "$dest/features-bench.log" 2>&1
echo "features bench exit=$?"; stamp bench
cuda_tests "$dest/features-tests.log" 150 tests/test_kernel_features.py
for program in gluon-default triton; do
  gluon=1; [ $program = triton ] && gluon=0
  FLASH_TRITON_GLUON_FEATURES=$gluon timeout $(( $(left) > 90 ? 90 : $(left) )) python3 -m attnprof verify --device cuda \
    --model docs/results/kernel-features/gemma2.json --impls eager,kernel --dtype bf16 --model-seq 1024 --out /tmp/verify-gemma2-$program --json > /dev/null 2>&1
  echo "verify gemma2 ($program) exit=$?"
  cp /tmp/verify-gemma2-$program/verify.md "$dest/verify-gemma2-$program.md"
  cp /tmp/verify-gemma2-$program/verify.json "$dest/verify-gemma2-$program.json"
done
cuda_tests "$dest/kernel-cuda-tests.log" 300 tests/test_kernel_serving_cuda.py tests/test_kernel_cuda.py
