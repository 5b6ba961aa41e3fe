#!/usr/bin/env bash
# Issue 17 (prepared in session 7, not run yet): head dims 80, 96, 256 on the warp-specialized Gluon program.
#   EACH_TIMEOUT=480 bash scripts/gpu/run_all.sh gluon_dims   (about 450 s + the machine's start)
#   1. cuda tests: 80/96/256 through the forced Gluon configs (dense and varlen form, both layouts; 96 packed in
#      transformers' layout), the head-dim tests of the Triton program, and the default paths changed last
#      (ragged dense calls, varlen, continuous batching's prefill), against the fp64 oracle               (<= 200 s)
#   2. tune.py --round 12: each head dim on the Gluon candidates vs the Triton default, causal and not, on
#      [B, S, H, D] views of [B, H, S, D] tensors; every candidate on the oracle cases first             (<= 280 s)
# If the Gluon program is right and faster, make it the default for those head dims in `_config.gluon_preferred`
# (80/96: heads layout only), then re-make docs/results/h200-kernel.md with scripts/gpu/envelope13.sh.
set -u
dest="${OUT:-/tmp/out}/gluon_dims"; mkdir -p "$dest"
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
t0=$(date +%s)
timeout 200 python3 -m pytest -q -m cuda -p no:cacheprovider tests/test_kernel_cuda.py tests/test_kernel_serving_cuda.py \
  -k "head_dims or 96 or ragged or default_dispatch or varlen_matches or continuous_batching" > "$dest/cuda-tests.log" 2>&1
echo "cuda tests exit=$? at $(( $(date +%s) - t0 ))s"; grep -E "passed|failed|FAILED|Error" "$dest/cuda-tests.log" | tail -8 | cut -c1-300
timeout 250 python3 kernels/flash-triton/tune.py --round 12 --causal both --budget-s 220 --head-dims 256,96,80 \
  --shapes 8x2048,2x8192 --out "$dest" > "$dest/tune12.log" 2>&1
echo "tune12 exit=$? at $(( $(date +%s) - t0 ))s"; tail -30 "$dest/tune12.log"
