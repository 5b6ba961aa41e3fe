#!/usr/bin/env bash
# Regenerates docs/results/audit/ on a GPU: the SDPA envelope grid (backend per cell from what ran, PyTorch's reasons,
# profiler cross-check of every 3rd cell, then of every cell) and the llama-1b model audit (its exit code is data).
#   bash scripts/gpu/run_all.sh audit
set -u
. scripts/gpu/lib.sh
claim audit
timeout 200 python3 -m attnprof audit --device cuda --crosscheck 3 --out /tmp/audit-grid3 --json > "$dest/grid.log" 2>&1
echo "grid exit=$?"; cp /tmp/audit-grid3/audit.md "$dest/h200-dispatch.md"; cp /tmp/audit-grid3/audit.json "$dest/h200-dispatch.json"
timeout 200 python3 -m attnprof audit --device cuda --crosscheck 1 --out /tmp/audit-grid1 --json >> "$dest/grid.log" 2>&1
echo "grid, every cell profiled: exit=$?"
cp /tmp/audit-grid1/audit.md "$dest/h200-dispatch-crosscheck-all.md"; cp /tmp/audit-grid1/audit.json "$dest/h200-dispatch-crosscheck-all.json"
timeout 120 python3 -m attnprof audit --device cuda --model llama-1b --batch 2 --seq 256 --require fused \
  --out /tmp/audit-llama --json > "$dest/llama-1b.log" 2>&1
echo "audit --model llama-1b --require fused: exit=$?"; cp /tmp/audit-llama/audit.md "$dest/h200-audit-llama-1b.md"
