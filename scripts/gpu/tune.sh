#!/usr/bin/env bash
# Kernel tuning round (kernels/flash-triton/tune.py --round $ROUND, default 3): every candidate checked against the
# fp64 oracle (winners on the full case list), timed beside SDPA auto and the matmul ceiling at S = 1k/4k/16k.
# Writes $OUT/tune/tune.json and the printed table in tune.log. ~2.5 minutes.
set -u
dest="${OUT:-/tmp/out}/tune"; mkdir -p "$dest"
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH}
timeout "${TUNE_TIMEOUT:-200}" python3 kernels/flash-triton/tune.py --round "${ROUND:-3}" --budget-s "${TUNE_BUDGET:-150}" --out "$dest" \
  > "$dest/tune.log" 2>&1
echo "tune exit=$?"
grep -vE "^\s*$" "$dest/tune.log" | tail -50
