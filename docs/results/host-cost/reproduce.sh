#!/usr/bin/env bash
# Regenerates docs/results/host-cost/ on a GPU: host time per call (wall time to enqueue 300 calls / 300, tiny shapes
# keep the GPU ahead), ours and SDPA interleaved over 7 rounds, prefill and decode, medians and the median ratio.
#   bash scripts/gpu/run_all.sh host-cost
set -u
. scripts/gpu/lib.sh
claim host-cost
timeout 200 python3 kernels/flash-triton/host_cost.py > "$dest/host-cost.log" 2>&1
echo "host_cost exit=$?"; cat "$dest/host-cost.log"
