#!/usr/bin/env bash
# Issue 16's follow-up on one H200 (after scripts/gpu/serve_production.sh): run with
#   EACH_TIMEOUT=300 bash scripts/gpu/run_all.sh serve_long
#   A. production `generate` batch 1 (static cache + torch.compile reduce-overhead) with eager, sdpa, sdpa-flash and our
#      kernel (now through flash_attn_with_kvcache over the static cache) -> production-decode.{md,json}
#   B. a stream long enough for a steady state (300 requests at 24/s: arrivals over ~12 s) for kernel and sdpa,
#      production loop -> production-cb-long.{md,json}
# Writes $OUT/serve_long/. Budget <= 280 s (A <= 110 s, B the rest); each part under its own timeout.
set -u
dest="${OUT:-/tmp/out}/serve_long"; mkdir -p "$dest"
t0=$(date +%s)
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
timeout 110 python3 -m attnprof serve --model llama-1b --dtype bf16 --loop production --mode decode \
  --impls eager,sdpa,sdpa-flash,kernel --decode-batch 1 --decode-context 1024 --new-tokens 40 --no-share \
  --out "$dest" --stem production-decode --json > "$dest/production-decode.log" 2>&1
echo "A (generate production) exit=$? at $(( $(date +%s) - t0 ))s"
grep -E "^production loop|Error|error" "$dest/production-decode.log" | tail -6 | cut -c1-400
t=$(( 275 - ($(date +%s) - t0) ))
timeout "$t" python3 -m attnprof serve --model llama-1b --dtype bf16 --loop production --mode continuous \
  --impls kernel,sdpa --requests 300 --rate 24 --prompt-median 384 --prompt-sigma 0.6 --max-prompt 1536 \
  --output-median 64 --output-sigma 0.5 --max-output 160 --num-blocks 1024 --max-batch-tokens 2048 \
  --stream-timeout 60 --slo-ttft-ms 2000 --slo-tpot-ms 50 --out "$dest" --stem production-cb-long --json \
  > "$dest/production-cb-long.log" 2>&1
echo "B (long stream, timeout ${t}s) exit=$? at $(( $(date +%s) - t0 ))s"
for f in "$dest"/*.json; do
  python3 - "$f" <<'PY' 2>/dev/null
import json, sys
d = json.load(open(sys.argv[1]))
p = d.get("production") or {}
print(sys.argv[1].rsplit("/", 1)[-1] + (" (PARTIAL)" if d.get("partial") else ""), "|", (p.get("answer") or "")[:500])
for r in (p.get("decode") or []) + ((p.get("continuous") or {}).get("results") or []):
    st = r.get("steady") or {}
    print(f"  {r['impl']}: {r['status']} tok/s={r.get('tokens_per_s') or r.get('output_tokens_per_s')} "
          f"ms/token={r.get('step_ms')} completed={r.get('completed')} steady_note={r.get('steady_note')} "
          f"steady_tput={(st.get('steady_throughput') or {}).get('output_throughput')} {(r.get('reason') or '')[:160]}")
PY
done
