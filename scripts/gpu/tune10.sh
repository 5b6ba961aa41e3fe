#!/usr/bin/env bash
# Issue 17: tuning round 10 on one H200 (head dims 256, 96, 80): kernels/flash-triton/tune.py --round 10.
#   EACH_TIMEOUT=280 bash scripts/gpu/run_all.sh tune10      -> $OUT/tune10/{tune.json, tune.log}
set -u
dest="${OUT:-/tmp/out}/tune10"; mkdir -p "$dest"
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
timeout 270 python3 kernels/flash-triton/tune.py --out "$dest" --round 10 --head-dims 256,96,80 \
  --shapes 4x4096,2x8192 --budget-s 200 > "$dest/tune.log" 2>&1
echo "tune exit=$?"; tail -45 "$dest/tune.log"
