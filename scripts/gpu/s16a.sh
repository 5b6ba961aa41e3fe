#!/usr/bin/env bash
# Ready for the next session, after the production grid's two calls (grid14.sh) or on its own, until DEADLINE
# (epoch seconds; default 400 s from the start):
#   1. benchmarks/kernel_features_bench.py, every case (session 15 ran only --softcap-only, and was cut before the
#      d256 variant rows): the softcap-alone default at d128 (poly/4 + alu-pack) and every other case at HEAD;
#   2. every CUDA test of tests/test_kernel_features.py under FLASH_TRITON_CHECK_LAUNCH=1;
#   3. the kernel CUDA suite (tests/test_kernel_serving_cuda.py, tests/test_kernel_cuda.py) with the time left.
#   DEADLINE=$(( $(date +%s) + 520 )) EACH_TIMEOUT=540 bash scripts/gpu/run_all.sh s16a
set -u
dest="${OUT:-/tmp/out}/s16a"; mkdir -p "$dest"
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
t0=$(date +%s); deadline=${DEADLINE:-$(( t0 + 400 ))}
left() { echo $(( deadline - $(date +%s) )); }
if [ -f /tmp/grid14/pid ] && [ ! -f /tmp/grid14/rc ]; then echo "the grid run is still going: nothing timed here"; exit 3; fi
[ "$(left)" -gt 60 ] && timeout $(( $(left) - 20 )) python3 benchmarks/kernel_features_bench.py > "$dest/features-bench.log" 2>&1
echo "features bench exit=$? at $(( $(date +%s) - t0 ))s"; grep -v -i warn "$dest/features-bench.log"
eval "${PACK:-:}"
[ "$(left)" -gt 40 ] && FLASH_TRITON_CHECK_LAUNCH=1 timeout $(( $(left) - 10 )) python3 -m pytest -q -m cuda \
  -p no:cacheprovider tests/test_kernel_features.py > "$dest/features-tests.log" 2>&1
echo "features cuda tests exit=$? at $(( $(date +%s) - t0 ))s"; grep -E "passed|failed|FAILED|Error" "$dest/features-tests.log" | tail -6 | cut -c1-300
eval "${PACK:-:}"
[ "$(left)" -gt 40 ] && FLASH_TRITON_CHECK_LAUNCH=1 timeout $(( $(left) - 8 )) python3 -m pytest -q -m cuda \
  -p no:cacheprovider tests/test_kernel_serving_cuda.py tests/test_kernel_cuda.py > "$dest/cuda-tests.log" 2>&1
echo "kernel cuda tests exit=$? at $(( $(date +%s) - t0 ))s"; grep -E "passed|failed|FAILED|Error" "$dest/cuda-tests.log" | tail -6 | cut -c1-300
