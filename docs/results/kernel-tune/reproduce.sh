#!/usr/bin/env bash
# Regenerates docs/results/kernel-tune/ on a GPU: the tuning rounds TUNING.md's steps cite.
#   ROUNDS="3 4 5 6 7 10 11 12 13 14" (default: all): kernels/flash-triton/tune.py --round N, every candidate checked
#     against the fp64 oracle and timed beside SDPA (cuDNN) -> roundN.json + roundN.log
#   STEPS=1: the experiments of steps 17-22 at HEAD: the batch-1 decode tune (step17/, step19/, step20/), the softcap
#     bench (step18/ to step22/: kernel_features_bench.py --softcap-only) and the special-function-unit rates
#     (scripts/gpu/mufu.py, step20/ and step22/). Switches since removed (poly_exp, ping-pong) have no row at HEAD.
#   ROUNDS="13 14" EACH_TIMEOUT=590 bash scripts/gpu/run_all.sh kernel-tune
set -u
. scripts/gpu/lib.sh
claim kernel-tune
for n in ${ROUNDS:-3 4 5 6 7 10 11 12 13 14}; do
  [ "$(left)" -gt 60 ] || { echo "no time left for round $n"; break; }
  timeout $(( $(left) > 280 ? 280 : $(left) )) python3 kernels/flash-triton/tune.py --round "$n" \
    --budget-s "${TUNE_BUDGET:-220}" --out "/tmp/tune-$n" > "$dest/round$n.log" 2>&1
  echo "round $n exit=$?"; cp "/tmp/tune-$n/tune.json" "$dest/round$n.json"; stamp "round $n"
done
[ "${STEPS:-0}" = 1 ] || exit 0
mkdir -p "$dest/step22/s15a" "$dest/step19"
timeout 60 python3 scripts/gpu/mufu.py > "$dest/step22/s15a/mufu.log" 2>&1; echo "mufu exit=$?"
timeout 120 python3 benchmarks/kernel_serving_bench.py --out "$dest/step19/batch1" --parts tune --tune-set batch1 \
  > "$dest/step19/batch1.log" 2>&1; echo "batch-1 tune exit=$?"
timeout 200 python3 benchmarks/kernel_features_bench.py --softcap-only > "$dest/step22/s15a/features-bench.log" 2>&1
echo "softcap bench exit=$?"
