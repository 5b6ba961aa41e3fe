#!/usr/bin/env bash
# Two real Kineto traces for tests/data/, recorded with torch.profiler the way users record them (schedule ->
# ProfilerStep#N): naive attention and SDPA pinned to math, 1x16x1024x64 bf16 causal, gzipped to
# ${OUT:-/tmp/out}/traces/h200-{naive,sdpa-math}.trace.json.gz; then `attnprof trace` on both.
#   bash scripts/gpu/run_all.sh traces
set -u
dest="${OUT:-/tmp/out}/traces"; mkdir -p "$dest"
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH}
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
echo "traces exit=$?"
for t in "$dest"/h200-naive.trace.json.gz "$dest"/h200-sdpa-math.trace.json.gz; do
  python3 -m attnprof trace "$t" --json 2>&1 | tail -12 | cut -c1-220
done
