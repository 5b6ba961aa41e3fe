#!/usr/bin/env bash
# s17a.sh's cells for an H200 (140 GiB), should the H100 not come: there 128 x 32k is not refused up front (130 GiB
# of 140) and would be prefilled in 256-token chunks for minutes per row, so the grid is split in two `serve` runs
# that leave it out: 64,128 x 8k (one-shot prefill fits there), then 64 x 32k (chunked, 1,024 tokens). Then s16a.sh.
#   DEADLINE=$(( $(date +%s) + 530 )) EACH_TIMEOUT=550 bash scripts/gpu/run_all.sh s17b
# Session 17 ran it on an H100 (asked for an H200); its 64 x 32k part was cut by the deadline and ran as a call of
# its own (docs/results/session17/).
set -u
dest="${OUT:-/tmp/out}/s17b"; mkdir -p "$dest"
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
t0=$(date +%s); deadline=${DEADLINE:-$(( t0 + 520 ))}
left() { echo $(( deadline - $(date +%s) )); }
serve() {  # stem, batches, contexts
  [ "$(left)" -gt 120 ] && timeout $(( $(left) - 90 )) python3 -m attnprof serve --model llama-1b --dtype bf16 \
    --loop production --mode decode --impls sdpa,kernel --decode-batch "$2" --decode-context "$3" \
    --new-tokens 32 --no-share --out "$dest" --stem "$1" --json > "$dest/$1.log" 2>&1
  echo "$1 exit=$? at $(( $(date +%s) - t0 ))s"
  tr '\r' '\n' < "$dest/$1.log" | grep -E "^ (sdpa|kernel) |Prefilled|gains|recompile" | head -20
  eval "${PACK:-:}"
}
serve production-decode-8k 64,128 8192
serve production-decode-32k 64 32768
[ "$(left)" -gt 90 ] && DEADLINE=$deadline bash scripts/gpu/s16a.sh
