#!/usr/bin/env bash
# Issue 17 (session 8), second call: the new defaults checked, then the main job re-made on them.
#   EACH_TIMEOUT=560 bash scripts/gpu/run_all.sh defaults15
#   1. cuda tests on the paths whose default changed (head dims 80/96/256 on Gluon, head dim 64 causal below 8k
#      keys on the one-warpgroup Gluon program, K/V released apart in every warp-specialized program: ragged, packed,
#      continuous batching), and the test the first call's timeout cut                                  (<= 220 s)
#   2. stages_story.sh: `attnprof stages` story, default (tutorial workload) and long (the README's table)  (<= 210 s)
set -u
dest="${OUT:-/tmp/out}/defaults15"; mkdir -p "$dest"
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
t0=$(date +%s)
timeout 220 python3 -m pytest -q -m cuda -p no:cacheprovider tests/test_kernel_cuda.py tests/test_kernel_serving_cuda.py \
  -k "head_dims or default_dispatch or (default and x64) or ragged or continuous_batching or varlen_matches or replays" > "$dest/cuda-tests.log" 2>&1
echo "cuda tests exit=$? at $(( $(date +%s) - t0 ))s"; grep -E "passed|failed|FAILED|Error" "$dest/cuda-tests.log" | tail -12 | cut -c1-300
OUT="$dest" bash scripts/gpu/stages_story.sh 2>&1 | tail -30
echo "stages at $(( $(date +%s) - t0 ))s"
