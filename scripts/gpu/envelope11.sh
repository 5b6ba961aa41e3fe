#!/usr/bin/env bash
# Issue 17 (session 7), first call: re-check the kernel at this commit, then the data for the next defaults.
#   EACH_TIMEOUT=560 bash scripts/gpu/run_all.sh envelope11
#   1. tests/test_kernel_cuda.py (every path vs the fp64 oracle; the _program_tile refactor)      (<= 200 s)
#   2. tune.py --round 11: non-causal and S=1k on the Gluon programs, ragged 2x3000 through varlen Gluon (<= 260 s)
#   3. host_cost.py: host microseconds per call, ours vs SDPA, with a profile                        (<= 60 s)
set -u
dest="${OUT:-/tmp/out}/envelope11"; mkdir -p "$dest"
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
t0=$(date +%s)
timeout 200 python3 -m pytest -q -m cuda -p no:cacheprovider tests/test_kernel_cuda.py > "$dest/cuda-tests.log" 2>&1
echo "cuda tests exit=$? at $(( $(date +%s) - t0 ))s"; grep -E "passed|failed|FAILED|Error" "$dest/cuda-tests.log" | tail -8 | cut -c1-300
timeout 260 python3 kernels/flash-triton/tune.py --round 11 --causal both --budget-s 230 --head-dims 128,64 \
  --shapes 16x1024,4x4096,1x16384,2x3000,2x3072 --out "$dest" > "$dest/tune11.log" 2>&1
echo "tune11 exit=$? at $(( $(date +%s) - t0 ))s"; tail -110 "$dest/tune11.log"
timeout 60 python3 kernels/flash-triton/host_cost.py --profile > "$dest/host-cost.log" 2>&1
echo "host_cost exit=$? at $(( $(date +%s) - t0 ))s"; head -60 "$dest/host-cost.log"
