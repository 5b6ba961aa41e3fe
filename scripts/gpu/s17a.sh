#!/usr/bin/env bash
# Ready for session 17 (issue 30's leftovers, serve's chunked prefill): the production decode cells that ran out of
# memory in the one-shot prefill on an 80 GB H100 in session 16 (128 x 8k, 64 x 32k), now prefilled in chunks
# (validate.prefill_chunk: 2,048 and 1,024 tokens there), beside 64 x 8k (one-shot, as it ran then) for a baseline.
# 6 rows (128 x 32k is refused up front), ~25 s of compile each; then, until DEADLINE, scripts/gpu/s16a.sh's work.
#   DEADLINE=$(( $(date +%s) + 520 )) EACH_TIMEOUT=540 bash scripts/gpu/run_all.sh s17a
# Not run: in session 17 the machine lent was busy, and s17b.sh plus one `serve` call measured these cells
# (docs/results/session17/).
set -u
dest="${OUT:-/tmp/out}/s17a"; mkdir -p "$dest"
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
t0=$(date +%s); deadline=${DEADLINE:-$(( t0 + 520 ))}
left() { echo $(( deadline - $(date +%s) )); }
[ "$(left)" -gt 120 ] && timeout $(( $(left) - 100 )) python3 -m attnprof serve --model llama-1b --dtype bf16 \
  --loop production --mode decode --impls sdpa,kernel --decode-batch 64,128 --decode-context 8192,32768 \
  --new-tokens 32 --no-share --out "$dest" --stem production-decode-chunked --json > "$dest/serve.log" 2>&1
echo "chunked cells exit=$? at $(( $(date +%s) - t0 ))s"
tr '\r' '\n' < "$dest/serve.log" | grep -E "^ (sdpa|kernel) |Prefilled|gains" | head -20
eval "${PACK:-:}"
[ "$(left)" -gt 90 ] && DEADLINE=$deadline bash scripts/gpu/s16a.sh
