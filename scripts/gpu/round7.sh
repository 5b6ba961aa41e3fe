#!/usr/bin/env bash
# Session 3's last device call: tune round 7 (the persistent Gluon program), its GPU tests, and the README's
# stages table at 1x32x8192x128 bf16 with the new default kernel (only with STAGES=1). ~1.5 / 3.5 minutes.
set -u
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH}
ROUND=7 TUNE_BUDGET=100 TUNE_TIMEOUT=150 bash scripts/gpu/tune.sh | tail -22
timeout 90 python3 -m pytest -q -m cuda tests/test_kernel_cuda.py -k "wsp or default_dispatch" 2>&1 | tail -3
[ "${STAGES:-0}" = 1 ] || exit 0
dest="${OUT:-/tmp/out}/stages"; mkdir -p "$dest"
timeout 150 python3 -m attnprof stages --batch 1 --heads 32 --seq 8192 --head-dim 128 --dtype bf16 \
  --variants naive,inplace,sdpa,sdpa-flash,sdpa-efficient,sdpa-cudnn,flex,kernel --out "$dest/long" > "$dest/long.log" 2>&1
echo "stages long exit=$?"; grep -E "^│|^┃" "$dest/long.log" | head -14
