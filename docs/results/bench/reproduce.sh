#!/usr/bin/env bash
# Regenerates docs/results/bench/ on a GPU (bash scripts/gpu/run_all.sh bench): `attnprof ceilings / bench / report`.
#   fused (SDPA auto = cuDNN on an H200, SDPA pinned to FlashAttention-2, FlexAttention) vs naive and in-place,
#   bf16 causal, 16 heads, D = 128, B·S = 16k tokens (the FlashAttention benchmark convention), S = 512 … 16k;
#   latency, TFLOP/s and GB/s against the measured ceilings, speedups, peak-memory ratio; pictures + HTML page.
# Run from the repo root on the GPU machine (image python3, no venv). Writes 7 files under ${OUT:-docs/results/bench}:
#   results.jsonl, tflops.png, speedup.png, memory.png, roofline.png, report.html, report.md. Budget: ~3-4 min.
set -u
. scripts/gpu/lib.sh
claim bench
export ATTNPROF_CACHE_DIR=/tmp/attnprof-cache   # ceilings cache; the rows carry the ceilings they were placed against
t0=$(date +%s)
GRID=(--seq 512,1024,2048,4096,8192,16384 --tokens 16384 --heads 16 --head-dim 128 --dtype bf16 --causal)

# 1. this GPU's own ceilings (bf16/fp16/fp32 8192³ matmul, 1 GiB copy; rotated buffers, median of 30)
python3 -m attnprof ceilings --device cuda --out /tmp/attnprof-ceilings
echo "ceilings exit=$? at $(( $(date +%s) - t0 ))s"

# 2. eager and SDPA cells first (seconds), all sequence lengths
timeout 100 python3 -m attnprof bench --device cuda "${GRID[@]}" --variants naive,inplace,sdpa,sdpa-flash \
  --out "$dest" --json > /tmp/bench-eager.log 2>&1
echo "bench eager exit=$? at $(( $(date +%s) - t0 ))s"; tail -1 /tmp/bench-eager.log

# 3. FlexAttention appended to the same file with --resume (one compile per shape; a timeout keeps finished rows)
timeout 110 python3 -m attnprof bench --device cuda "${GRID[@]}" --variants naive,sdpa,flex --resume \
  --out "$dest" --json > /tmp/bench-flex.log 2>&1
echo "bench flex exit=$? at $(( $(date +%s) - t0 ))s"; tail -1 /tmp/bench-flex.log

# 4. pictures, the self-contained HTML page and the markdown page, from the JSONL alone
python3 -m attnprof report "$dest" --json | tail -1
echo "report exit=$? at $(( $(date +%s) - t0 ))s"
grep -E "^(naive|inplace|sdpa|flex)|ceilings" /tmp/bench-flex.log | cut -c1-200 | tail -14
grep -E "│ (naive|sdpa|flex|inplace|sdpa-flash) " /tmp/bench-flex.log | cut -c1-170 | head -30
ls -la "$dest"
