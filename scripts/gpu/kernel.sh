#!/usr/bin/env bash
# GPU evidence for stage four (issue 5): our Triton kernel, loaded through `kernels`, on the H200.
#   1. tests/test_kernel_cuda.py: bf16/fp16, causal/full, GQA, ragged and Sq != Sk against the fp64 oracle
#      (error <= 2x eager's), TMA and pointer paths, heaviest shapes included;
#   2. benchmarks/kernel_bench.py: causal bf16 TFLOP/s, D = 128 and 64, 16 heads, B·S = 16k, S = 512 … 16k,
#      kernel vs SDPA auto, SDPA flash, FlexAttention, each as a ratio to SDPA auto and to the bf16 matmul ceiling.
# Run from the repo root on the H200 machine (image python3, no venv; `kernels` from the carried .whl/).
# Writes $OUT/kernel/{h200-kernel.md, kernel-bench.json, pytest.log}; the lead copies h200-kernel.md to
# docs/results/. Budget: ~2.5 min (flex compiles are capped by --flex-budget-s).
set -u
dest="${OUT:-/tmp/out}/kernel"; mkdir -p "$dest"
t0=$(date +%s)
if ! python3 -c "import kernels" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/kernels-*.whl && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH}

timeout 60 python3 -m pytest -q -m cuda tests/test_kernel_cuda.py > "$dest/pytest.log" 2>&1
echo "pytest exit=$? at $(( $(date +%s) - t0 ))s"; tail -3 "$dest/pytest.log"

timeout 140 python3 benchmarks/kernel_bench.py --out "$dest" --flex-budget-s 70 2> "$dest/bench.log"
echo "bench exit=$? at $(( $(date +%s) - t0 ))s"; tail -4 "$dest/bench.log"
grep -E "^\| [0-9]+ \| [0-9]+ \| kernel " "$dest/h200-kernel.md" || echo "no kernel rows (see $dest/bench.log)"
ls -la "$dest"
