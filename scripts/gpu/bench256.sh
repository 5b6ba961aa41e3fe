#!/usr/bin/env bash
# Issue 17: the benchmark at head dim 256 with the default tuned in round 10 (128x64 w8 s2 tma).
#   EACH_TIMEOUT=120 bash scripts/gpu/run_all.sh bench256   -> $OUT/bench256/{h200-kernel-hd256.md, kernel-bench.json}
set -u
dest="${OUT:-/tmp/out}/bench256"; mkdir -p "$dest"
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
timeout 110 python3 benchmarks/kernel_bench.py --out "$dest" --head-dims 256 --seqs 2048,8192 --reps 20 \
  --flex-budget-s 0 > "$dest/bench.log" 2>&1
echo "bench exit=$?"; [ -f "$dest/h200-kernel.md" ] && mv "$dest/h200-kernel.md" "$dest/h200-kernel-hd256.md"
grep -E "^d=|matmul" "$dest/bench.log"
