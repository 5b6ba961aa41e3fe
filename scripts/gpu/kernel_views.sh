#!/usr/bin/env bash
# Issue 17, item 1 on one H200: the kernel reads [B,S,H,D] views of [B,H,S,D] tensors (TMA [B*H*S, D], the Gluon
# programs with HEADS_IN_ROWS), so the `kernel` stage has no layout copies. Run with
#   EACH_TIMEOUT=560 bash scripts/gpu/run_all.sh kernel_views
#   1. cuda tests: views vs the fp64 oracle on every Gluon/Triton path (+ the variant, TMA neighbour) (<= 230 s)
#   2. scripts/gpu/stages_story.sh: story, default, long-8192 stages re-made with the shipped default (<= 300 s)
# Writes $OUT/kernel_views/cuda-tests.log and $OUT/stages_story/...
set -u
dest="${OUT:-/tmp/out}/kernel_views"; mkdir -p "$dest"
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
t0=$(date +%s)
timeout 230 python3 -m pytest -q -m cuda -p no:cacheprovider tests/test_kernel_cuda.py \
  -k "views or variant_and_registry or next_batch or default_dispatch" > "$dest/cuda-tests.log" 2>&1
echo "cuda tests exit=$? at $(( $(date +%s) - t0 ))s"; grep -E "passed|failed|FAILED|Error" "$dest/cuda-tests.log" | tail -8 | cut -c1-300
timeout 300 bash scripts/gpu/stages_story.sh
echo "stages_story exit=$? at $(( $(date +%s) - t0 ))s"
