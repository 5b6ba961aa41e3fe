#!/usr/bin/env bash
# Issue 16's last target on one H200: production `generate` at batch 1 (static cache + torch.compile reduce-overhead)
# with our kernel as the custom op attnprof::kvcache_attention (one op of the compiled graph), beside eager, sdpa and
# sdpa-flash. Run with  EACH_TIMEOUT=240 bash scripts/gpu/run_all.sh serve_decode
# Writes $OUT/serve_decode/production-decode.{md,json,log}. Budget <= 230 s.
set -u
dest="${OUT:-/tmp/out}/serve_decode"; mkdir -p "$dest"
t0=$(date +%s)
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
timeout 90 python3 -m pytest -q -m cuda -p no:cacheprovider tests/test_kernel_serving_cuda.py \
  -k "reduce_overhead or cuda_graph or host_sync" > "$dest/cuda-tests.log" 2>&1
echo "cuda tests exit=$? at $(( $(date +%s) - t0 ))s"; tail -3 "$dest/cuda-tests.log"
timeout 140 python3 -m attnprof serve --model llama-1b --dtype bf16 --loop production --mode decode \
  --impls eager,sdpa,sdpa-flash,kernel --decode-batch 1 --decode-context 1024 --new-tokens 40 --no-share \
  --out "$dest" --stem production-decode --json > "$dest/production-decode.log" 2>&1
echo "generate production exit=$? at $(( $(date +%s) - t0 ))s"
grep -E "^production loop|Error|error|graph" "$dest/production-decode.log" | tail -8 | cut -c1-400
python3 - "$dest/production-decode.json" <<'PY' 2>/dev/null
import json, sys
d = json.load(open(sys.argv[1]))
p = d.get("production") or {}
print((p.get("answer") or "")[:600])
for r in p.get("decode") or []:
    print(f"  {r['impl']}: {r['status']} tok/s={r.get('tokens_per_s')} ms/token={r.get('step_ms')} {(r.get('reason') or '')[:200]}")
PY
