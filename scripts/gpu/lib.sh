#!/usr/bin/env bash
# Sourced by every docs/results/<claim>/reproduce.sh: one place for what each of them needs.
#   claim NAME       dest=${OUT:-docs/results/NAME} (made), PYTHONPATH with src/, t0 and deadline set
#   left             seconds before DEADLINE (epoch seconds; default: BUDGET_S, 560, from the start)
#   stamp TEXT       "== TEXT at Ns" since the start
#   cuda_tests LOG CAP ARGS...   pytest -m cuda ARGS under FLASH_TRITON_CHECK_LAUNCH=1 (every fast launch asks
#                    Triton's binder which kernel it would run), at most CAP seconds and what is left; writes LOG
# Run from the repository root on the GPU machine with the image's python3 (scripts/gpu/run_all.sh installs the
# carried wheels and sets OUT per claim).
claim() {
  dest="${OUT:-docs/results/$1}"; mkdir -p "$dest"
  export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
  t0=$(date +%s); deadline=${DEADLINE:-$(( t0 + ${BUDGET_S:-560} ))}
}
left() { echo $(( deadline - $(date +%s) )); }
stamp() { echo "== $1 at $(( $(date +%s) - t0 ))s"; }
cuda_tests() {
  local log=$1 cap=$2; shift 2
  local t; t=$(left); [ "$t" -lt "$cap" ] && cap=$t
  [ "$cap" -gt 20 ] || { echo "no time left for the CUDA tests of $log"; return 0; }
  FLASH_TRITON_CHECK_LAUNCH=1 timeout "$cap" python3 -m pytest -q -m cuda -p no:cacheprovider "$@" > "$log" 2>&1
  echo "cuda tests exit=$? ($log)"; grep -E "passed|failed|FAILED|Error" "$log" | tail -6 | cut -c1-300
}
