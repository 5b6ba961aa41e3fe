#!/usr/bin/env bash
# Ready for the next session (TUNING.md step 21), ~150 s: does the P conversion share the special-function unit's
# rate, and does packing P on the integer pipe lift softcap at head dim 128?
#   1. scripts/gpu/mufu14.py: results per clock per SM of tanh, ex2, the F2FP pack and the integer-pipe pack;
#   2. the varlen Gluon program's oracle tests, with and without Config.p_pack_alu, under the launch check;
#   3. kernel_features_bench.py --softcap-only: plain and softcap 30, each program, with the alu-pack and poly/4 rows.
#   EACH_TIMEOUT=300 bash scripts/gpu/run_all.sh s15a
set -u
dest="${OUT:-/tmp/out}/s15a"; mkdir -p "$dest"
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
t0=$(date +%s)
timeout 60 python3 scripts/gpu/mufu14.py > "$dest/mufu.log" 2>&1
echo "mufu exit=$? at $(( $(date +%s) - t0 ))s"; grep -v -i warn "$dest/mufu.log"
FLASH_TRITON_CHECK_LAUNCH=1 timeout 180 python3 -m pytest -q -m cuda -p no:cacheprovider tests/test_kernel_features.py \
  -k "gluon_varlen_program or saturating" > "$dest/cuda-tests.log" 2>&1
echo "cuda tests exit=$? at $(( $(date +%s) - t0 ))s"; grep -E "passed|failed|FAILED|Error" "$dest/cuda-tests.log" | tail -6 | cut -c1-300
eval "${PACK:-:}"
timeout 150 python3 benchmarks/kernel_features_bench.py --softcap-only > "$dest/features-bench.log" 2>&1
echo "features bench exit=$? at $(( $(date +%s) - t0 ))s"; cat "$dest/features-bench.log" | grep -v -i warn
