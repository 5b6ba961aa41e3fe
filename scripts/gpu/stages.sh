#!/usr/bin/env bash
# GPU evidence for `attnprof stages` (issue 2): make test-gpu, then the tutorial's workload and a long one.
# Run from the repo root on the H200 machine (image python3, no venv). Writes under $OUT/stages/.
set -u
dest="${OUT:-/tmp/out}/stages"; mkdir -p "$dest"
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH}
( time python3 -m attnprof stages --out "$dest/tutorial" --json ) > "$dest/tutorial.log" 2>&1
echo "stages tutorial exit=$?"; tail -40 "$dest/tutorial.log"
python3 -m attnprof stages --batch 1 --heads 32 --seq 8192 --head-dim 128 --dtype bf16 \
  --variants naive,inplace,sdpa,sdpa-flash,sdpa-efficient,sdpa-cudnn,flex,kernel --out "$dest/long" > "$dest/long.log" 2>&1
echo "stages long exit=$?"; grep -E "^│|^┃" "$dest/long.log" | head -20
