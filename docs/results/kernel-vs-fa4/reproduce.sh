#!/usr/bin/env bash
# Regenerates docs/results/kernel-vs-fa4/ on a GPU: our kernel beside FlashAttention-4 and SDPA (cuDNN), one run,
# every number made by attnprof: the kernel-level comparison on every shape of the FA4 issue, model features and
# decode included (`benchmarks/kernel_vs_fa4_bench.py --explore`: CUDA-graph replays, L2 flushed, the median of 3
# rounds, with the configs our defaults were chosen from; `--anatomy`: each implementation's key-loop rate and fixed
# cost; `--timeline`: our schedule tile by tile), the main job's tutorial workload and a long causal prefill
# (`stages`), a B·S = 16k causal sweep at head dim 128 (`bench`, against the measured ceilings), and FA4 through the
# numerics gate (`verify`). Needs flash-attn-4 with its CuTe DSL runtime and `kernels` importable
# (carried as wheels: scripts/gpu/run_all.sh installs .whl/; README.md here names them).
#   bash scripts/gpu/run_all.sh kernel-vs-fa4      (or alone: OUT=/some/dir bash docs/results/kernel-vs-fa4/reproduce.sh)
# The whole folder takes ~15 minutes, more than one 10-minute device call: PARTS picks the steps (default all five,
# "tests kernel stages bench verify"); calls back to back on one machine make it in parts, e.g.
# PARTS=tests (up to ~8 minutes), then PARTS="kernel stages", then PARTS="bench verify".
set -u
. scripts/gpu/lib.sh
claim kernel-vs-fa4
V=sdpa,kernel,flash-attn-4
stages() {  # stages NAME ARGS...: one `attnprof stages` run -> NAME.md + NAME.json
  local name=$1; shift
  timeout 150 python3 -m attnprof stages --device cuda --variants $V "$@" --out "/tmp/fa4-$name" > "$dest/$name.log" 2>&1
  echo "$name exit=$?"; tail -3 "$dest/$name.log" | cut -c1-200
  cp "/tmp/fa4-$name/report.md" "$dest/$name.md"; cp "/tmp/fa4-$name/results.json" "$dest/$name.json"; stamp "$name"
}
bench() {  # bench NAME ARGS...: one `attnprof bench` sweep at B·S = 16k, 16 heads, bf16 -> NAME.md + NAME.jsonl
  local name=$1; shift
  timeout 240 python3 -m attnprof bench --device cuda --variants $V --tokens 16384 --heads 16 --dtype bf16 "$@" \
    --out "/tmp/fa4-$name" > "$dest/$name.log" 2>&1
  echo "$name exit=$?"; tail -3 "$dest/$name.log" | cut -c1-200
  timeout 60 python3 -m attnprof report "/tmp/fa4-$name" > /dev/null 2>&1  # report.md: the table beside the ceilings
  cp "/tmp/fa4-$name/results.jsonl" "$dest/$name.jsonl"; cp "/tmp/fa4-$name/report.md" "$dest/$name.md"
  stamp "$name"
}
PARTS=" ${PARTS:-tests kernel stages bench verify} "
part() { [[ "$PARTS" == *" $1 "* ]]; }
# first the oracle tests of the configs the explore rows time beside the default (LPT order, the persistent program
# on its tile plan, the consumers' products in turns, the values waited for early): a row is only worth reading if
# its config computes the right answer on this machine (~320 tests, most of it compiling: a part of its own, alone
# in a device call). Two pytest processes at once, so two compilers run: the configs and paths no GPU has checked
# since they changed (`Config.v_wait_early`, TUNING.md step 31; the persistent program's window at head dim 128) and
# the others.
# (the default, one-warpgroup and varlen paths too: step 31 changed their code, the one-warpgroup refill and the varlen
# program's registers at head dim 64)
NEW="waited_for_early or v-wait-early or (persistent_program and 128) or -default] or -gluon] or -gluon-ws-varlen]"
NEW="$NEW or one_warpgroup_program or small_windows"
if part tests; then
# beside them, the machine-code checks of every Gluon program as this machine's Triton and ptxas compile them (sm_90
# SASS, no GPU needed; CI runs them with Triton 3.9 and 3.6, `make test-sass-gpu-triton`: this is the image's own,
# whatever version it has)
(timeout 300 python3 -m pytest -q -p no:cacheprovider tests/test_kernel_gluon.py tests/test_kernel_gluon_fp8.py \
  > "$dest/sass-tests.log" 2>&1; echo "sass tests exit=$?"; grep -E "passed|failed" "$dest/sass-tests.log" | tail -8) &
cuda_tests "$dest/explore-tests-new.log" 420 tests/test_kernel_cuda.py tests/test_kernel_features.py -k "$NEW" &
cuda_tests "$dest/explore-tests.log" 420 tests/test_kernel_cuda.py tests/test_kernel_features.py \
  -k "(wsp or persistent or lpt or pingpong) and not ($NEW)" &
wait
fi
if part kernel; then
# (~50 more explore configs since step 31, most of it compiling: the part takes what the call has left). ONLY=a,b
# times only the cases whose names contain one of them (the bench's --only), into kernel-vs-fa4-<ONLY>.jsonl/.log:
# the part split over calls, e.g. ONLY=anatomy, then ONLY=causal,full,GQA, then ONLY=window,decode,softcap
only=${ONLY:-}; suffix=${only:+-${only//[^A-Za-z0-9]/_}}
timeout $(( $(left) > 540 ? 540 : $(left) )) python3 benchmarks/kernel_vs_fa4_bench.py --explore --anatomy --timeline \
  --rounds 3 ${only:+--only "$only"} --out "$dest/kernel-vs-fa4$suffix.jsonl" > "$dest/kernel-vs-fa4$suffix.log" 2>&1
echo "kernel_vs_fa4_bench exit=$?"; stamp "kernel-vs-fa4$suffix"
fi
if part stages; then
stages tutorial
stages long-16k --batch 1 --heads 16 --seq 16384 --head-dim 128 --dtype bf16
fi
part bench && bench bench-hd128-causal --head-dim 128 --causal --seq 1024,2048,4096,8192,16384 --measure-ceilings
part verify || exit 0
timeout 200 python3 -m attnprof verify --device cuda --variants $V --dtype bf16 --out /tmp/fa4-verify > "$dest/verify.log" 2>&1
echo "verify exit=$? (a failing backend is a finding, in verify.md)"
cp /tmp/fa4-verify/verify.md "$dest/verify.md"; cp /tmp/fa4-verify/verify.json "$dest/verify.json"; stamp verify
