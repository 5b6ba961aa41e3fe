#!/usr/bin/env bash
# Session 15, TUNING.md step 22: the default softcap program at head dims 80-128 now takes cap_poly=4 and, in bf16,
# p_pack_alu (`_features.softcap_switches`). One call, until DEADLINE (epoch seconds; default 200 s from the start):
#   1. the softcap CUDA tests of tests/test_kernel_features.py under FLASH_TRITON_CHECK_LAUNCH=1 (the default
#      softcap and "all" cases now run the polynomial and the integer-pipe pack against the fp64 oracle);
#   2. benchmarks/kernel_features_bench.py --softcap-only (plain, softcap 30, all three): the new
#      default beside the old one (`gluon varlen`, named).
#   DEADLINE=$(( $(date +%s) + 200 )) EACH_TIMEOUT=220 bash scripts/gpu/run_all.sh s15b
set -u
dest="${OUT:-/tmp/out}/s15b"; mkdir -p "$dest"
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
t0=$(date +%s); deadline=${DEADLINE:-$(( t0 + 200 ))}
left() { echo $(( deadline - $(date +%s) )); }
[ "$(left)" -gt 40 ] && FLASH_TRITON_CHECK_LAUNCH=1 timeout $(( $(left) - 70 )) python3 -m pytest -q -m cuda \
  -p no:cacheprovider tests/test_kernel_features.py -k "softcap or all or saturating or gluon_varlen_program" \
  > "$dest/cuda-tests.log" 2>&1
echo "cuda tests exit=$? at $(( $(date +%s) - t0 ))s"; grep -E "passed|failed|FAILED|Error" "$dest/cuda-tests.log" | tail -6 | cut -c1-300
eval "${PACK:-:}"
[ "$(left)" -gt 30 ] && timeout $(( $(left) - 5 )) python3 benchmarks/kernel_features_bench.py --softcap-only > "$dest/features-bench.log" 2>&1
echo "features bench exit=$? at $(( $(date +%s) - t0 ))s"; grep -v -i warn "$dest/features-bench.log"
