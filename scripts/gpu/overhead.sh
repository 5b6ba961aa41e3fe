#!/usr/bin/env bash
# The dispatch watcher's cost on a model forward (issue 3, target < 3 %): llama-1b bf16, watched vs plain forwards
# interleaved, at the shape of the earlier runs (4 x 512) and at one long prompt (1 x 2048).
# Writes $OUT/overhead/watch-overhead-{4x512,1x2048}.json. ~1 minute.
set -u
dest="${OUT:-/tmp/out}/overhead"; mkdir -p "$dest"
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH}
t0=$(date +%s)
for shape in "4 512" "1 2048"; do
  set -- $shape
  timeout 90 python3 benchmarks/watch_overhead.py --model llama-1b --device cuda --batch "$1" --seq "$2" --reps 40 \
    --out "$dest/watch-overhead-${1}x${2}.json" 2>&1 | tail -1 | cut -c1-400
  echo "== ${1}x${2} at $(( $(date +%s) - t0 ))s"
done
