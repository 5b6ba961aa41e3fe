#!/usr/bin/env bash
# GPU evidence for the SDPA dispatch audit (issue 3), on the H200. Run from the repo root (image python3, no venv).
#   1. the envelope grid written by `attnprof audit` itself, every cell cross-checked against torch.profiler's
#      kernel names in the same run → $OUT/audit/h200-dispatch.md (+ .json), for docs/results/;
#   2. two real H200 Kineto traces recorded with torch.profiler (schedule → ProfilerStep#N, as users record them),
#      naive and SDPA pinned to math, 1x16x1024x64 bf16 causal, gzipped → $OUT/audit/h200-*.trace.json.gz, for
#      tests/data/; then `attnprof trace` on both;
#   3. watch() overhead on llama-1b forwards (bf16, 1x2048 and 4x512) → $OUT/audit/watch-overhead.json;
#   4. `attnprof audit --model llama-1b --require fused` (its exit code is data, not a failure of this script)
#      → $OUT/audit/llama-1b-audit.md (+ .json);
#   5. compiled FlexAttention and a boolean-mask SDPA under watch(), to show the Triton launch tap on a real GPU.
# 8 files at most under $OUT/audit/. Budget: ~2-3 min.
set -u
dest="${OUT:-/tmp/out}/audit"; mkdir -p "$dest"
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH}
t0=$(date +%s)
stamp() { echo "== $1 at $(( $(date +%s) - t0 ))s"; }

# 1. envelope grid, cross-checked cell by cell with the profiler
timeout 200 python3 -m attnprof audit --device cuda --crosscheck 1 --out /tmp/audit-grid --json > /tmp/audit-grid.log 2>&1
echo "grid exit=$?"; tail -1 /tmp/audit-grid.log
cp /tmp/audit-grid/audit.md "$dest/h200-dispatch.md"; cp /tmp/audit-grid/audit.json "$dest/h200-dispatch.json"
python3 - <<'PY'
import json
d = json.load(open("/tmp/audit-grid/audit.json"))
rows = d["rows"]
checked = [r for r in rows if r["profiler_backend"] is not None]
print(f"preferred={d['preferred']} cells={len(rows)} profiler-checked={len(checked)} "
      f"agree={sum(bool(r['profiler_agrees']) for r in checked)}")
for r in rows:
    flag = "" if r["profiler_agrees"] in (True, None) else "  <-- DISAGREES"
    print(f"  {r['envelope'][:48]:48} {str(r['backend']):10} prof={str(r['profiler_backend']):10} "
          f"{(r['error'] or '')[:60]}{flag}")
PY
stamp "grid"

# 2. two real Kineto traces, the way a user records them
python3 - "$dest" <<'PY'
import gzip, shutil, sys, torch
from torch.profiler import ProfilerActivity, profile, schedule
from attnprof.variants import VARIANTS
from attnprof.workload import Workload
dest = sys.argv[1]
w = Workload(batch=1, heads=16, seq=1024, head_dim=64, dtype="bf16", causal=True, device="cuda")
inputs = w.make_inputs(0)
for name in ("naive", "sdpa-math"):
    fn = VARIANTS[name]
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
                 schedule=schedule(wait=1, warmup=1, active=3)) as prof:
        for _ in range(5):
            fn(inputs)
            torch.cuda.synchronize()
            prof.step()
    raw = f"/tmp/h200-{name}.trace.json"
    prof.export_chrome_trace(raw)
    with open(raw, "rb") as src, gzip.open(f"{dest}/h200-{name}.trace.json.gz", "wb", compresslevel=9) as dst:
        shutil.copyfileobj(src, dst)
PY
echo "traces exit=$?"; ls -la "$dest"/*.trace.json.gz
for t in "$dest"/h200-naive.trace.json.gz "$dest"/h200-sdpa-math.trace.json.gz; do
  python3 -m attnprof trace "$t" --json 2>&1 | tail -12 | cut -c1-220; echo "trace exit=$?"
done
stamp "traces"

# 3. watcher overhead on a real model forward (GPU-bound at 1x2048; more launch-bound at 4x512)
timeout 120 python3 benchmarks/watch_overhead.py --model llama-1b --device cuda --batch 1 --seq 2048 --reps 20 \
  --out "$dest/watch-overhead.json" 2>&1 | tail -2
timeout 90 python3 benchmarks/watch_overhead.py --model llama-1b --device cuda --batch 4 --seq 512 --reps 20 2>&1 | tail -2
stamp "overhead"

# 4. the model audit as a check; exit 1 means a layer did not run fused (expected data either way)
timeout 120 python3 -m attnprof audit --device cuda --model llama-1b --batch 2 --seq 256 --require fused \
  --out /tmp/audit-llama --json > /tmp/audit-llama.log 2>&1
code=$?
echo "audit --model llama-1b --require fused: exit=$code"; tail -4 /tmp/audit-llama.log | cut -c1-300
cp /tmp/audit-llama/audit.md "$dest/llama-1b-audit.md" 2>/dev/null; cp /tmp/audit-llama/audit.json "$dest/llama-1b-audit.json" 2>/dev/null
stamp "model audit"

# 5. compiled FlexAttention (Triton launch tap) and a boolean mask under watch()
timeout 120 python3 - <<'PY'
import torch, torch.nn.functional as F
from torch.nn.attention.flex_attention import flex_attention, create_block_mask
from attnprof.audit import watch, explain
q, k, v = (torch.randn(1, 16, 1024, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
bm = create_block_mask(lambda b, h, qi, ki: qi >= ki, None, None, 1024, 1024, device="cuda")
flex = torch.compile(flex_attention)
flex(q, k, v, block_mask=bm); torch.cuda.synchronize()
mask = torch.ones(1024, 1024, dtype=torch.bool, device="cuda").tril()
with watch() as calls:
    flex(q, k, v, block_mask=bm)
    F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True)
    F.scaled_dot_product_attention(q[..., :1, :], k, v)  # decode, Sq = 1
torch.cuda.synchronize()
for c in calls:
    print(f"{c.kind:6} {c.backend:10} {str(c.fused_op)[:70]:70} {c.envelope()}")
    if c.fell_back:
        print("   " + explain(c).text().replace("\n", "\n   ")[:600])
PY
echo "flex/tap exit=$?"
stamp "done"
ls -la "$dest"
