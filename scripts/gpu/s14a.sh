#!/usr/bin/env bash
# Session 14, after the production-decode grid (grid14.sh) on the same machine, in priority order until DEADLINE
# (epoch seconds; default: 560 s from the start of this script):
#   1. the decode CUDA oracle tests at the one-wave split rule, under FLASH_TRITON_CHECK_LAUNCH=1;
#   2. the kernel-alone decode grid, batch 1/4/16/64 x 1k/8k/32k against cuDNN, and the batch-1 tune (item 3);
#   3. host time per call, ours and SDPA interleaved (item 2);
#   DEADLINE=$(( $(date +%s) + 585 )) EACH_TIMEOUT=590 bash scripts/gpu/run_all.sh grid14 s14a
set -u
dest="${OUT:-/tmp/out}/s14a"; mkdir -p "$dest"
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
t0=$(date +%s); deadline=${DEADLINE:-$(( t0 + 560 ))}
left() { echo $(( deadline - $(date +%s) )); }
if [ -f /tmp/grid14/pid ] && [ ! -f /tmp/grid14/rc ]; then echo "the grid run is still going: nothing timed here"; exit 3; fi
[ "$(left)" -gt 40 ] && FLASH_TRITON_CHECK_LAUNCH=1 timeout $(( $(left) - 20 )) python3 -m pytest -q -m cuda \
  -p no:cacheprovider tests/test_kernel_serving_cuda.py -k "kvcache or decode or paged" > "$dest/decode-tests.log" 2>&1
echo "decode cuda tests exit=$? at $(( $(date +%s) - t0 ))s"; grep -E "passed|failed|FAILED|Error" "$dest/decode-tests.log" | tail -6 | cut -c1-300
eval "${PACK:-:}"
[ "$(left)" -gt 60 ] && timeout $(( $(left) - 20 )) python3 benchmarks/kernel_serving_bench.py --out "$dest/decode" \
  --parts decode --batches 1,4,16,64 --kv-lens 1024,8192,32768 --flex-budget-s -1 > "$dest/decode.log" 2>&1
echo "decode table exit=$? at $(( $(date +%s) - t0 ))s"; grep -E "^- B=" "$dest"/decode/*.md | cut -c1-300
eval "${PACK:-:}"
[ "$(left)" -gt 50 ] && timeout $(( $(left) - 20 )) python3 benchmarks/kernel_serving_bench.py --out "$dest/batch1" \
  --parts tune --tune-set batch1 > "$dest/batch1.log" 2>&1
echo "batch1 tune exit=$? at $(( $(date +%s) - t0 ))s"; grep -E "^(tune|anatomy)" "$dest/batch1.log" | cut -c1-700
eval "${PACK:-:}"
[ "$(left)" -gt 60 ] && timeout $(( $(left) - 15 )) python3 kernels/flash-triton/host_cost.py > "$dest/host-cost.log" 2>&1
echo "host cost exit=$? at $(( $(date +%s) - t0 ))s"; grep -v -i warn "$dest/host-cost.log" | tail -14
eval "${PACK:-:}"
