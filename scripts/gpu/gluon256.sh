#!/usr/bin/env bash
# Issue 17 (prepared in session 7, not run yet): head dim 256 on the warp-specialized Gluon program.
#   EACH_TIMEOUT=400 bash scripts/gpu/run_all.sh gluon256
#   1. cuda tests: head dim 256 through the forced Gluon configs (dense and varlen form, both layouts) and the
#      head-dim tests of the Triton program, against the fp64 oracle                                   (<= 120 s)
#   2. tune.py --round 12: 256 on ws 128x64 s2 (+ varlen form, 128x32 s3/s4) vs the Triton default, causal and not,
#      every candidate on the oracle cases first                                                       (<= 200 s)
# If the Gluon program is right and faster, make it the default for 256 in `_config.gluon_preferred`, then re-make
# docs/results/h200-kernel.md with scripts/gpu/envelope13.sh.
set -u
dest="${OUT:-/tmp/out}/gluon256"; mkdir -p "$dest"
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
t0=$(date +%s)
timeout 120 python3 -m pytest -q -m cuda -p no:cacheprovider tests/test_kernel_cuda.py -k "256 or head_dims" \
  > "$dest/cuda-tests.log" 2>&1
echo "cuda tests exit=$? at $(( $(date +%s) - t0 ))s"; grep -E "passed|failed|FAILED|Error" "$dest/cuda-tests.log" | tail -8 | cut -c1-300
timeout 200 python3 kernels/flash-triton/tune.py --round 12 --causal both --budget-s 170 --head-dims 256 \
  --shapes 8x2048,2x8192 --out "$dest" > "$dest/tune12.log" 2>&1
echo "tune12 exit=$? at $(( $(date +%s) - t0 ))s"; tail -30 "$dest/tune12.log"
