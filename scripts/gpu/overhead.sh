#!/usr/bin/env bash
# The dispatch watcher's cost on a model forward (issue 3, target < 3 %): llama-1b bf16, watched vs plain forwards
# interleaved, at the shape of the earlier runs (4 x 512, launch-bound on this host), one long prompt (1 x 2048) and a
# GPU-bound prefill (8 x 2048), with ablation arms (no call-site walk; a bare passthrough patch).
# Writes $OUT/overhead/watch-overhead-<B>x<S>.json. ~2 minutes.
set -u
dest="${OUT:-/tmp/out}/overhead"; mkdir -p "$dest"
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH}
t0=$(date +%s)
for shape in "4 512" "1 2048" "8 2048"; do
  set -- $shape
  timeout 90 python3 benchmarks/watch_overhead.py --model llama-1b --device cuda --batch "$1" --seq "$2" --reps 40 --ablate \
    --out "$dest/watch-overhead-${1}x${2}.json" 2>&1 | tail -1 | cut -c1-700
  echo "== ${1}x${2} at $(( $(date +%s) - t0 ))s"
done
# Where one watched SDPA call's host time goes on this machine (cProfile over 2000 calls, one envelope).
timeout 60 python3 - <<'PY' 2>&1 | head -40
import cProfile, pstats, time, torch, torch.nn.functional as F
from attnprof.audit import watch
q = torch.randn(1, 2, 8, 16, device="cuda")
def loop(n=2000):
    for _ in range(n):
        F.scaled_dot_product_attention(q, q, q)
loop(50); torch.cuda.synchronize()
t0 = time.perf_counter(); loop(); torch.cuda.synchronize(); bare = (time.perf_counter() - t0) / 2
with watch() as calls:
    loop(50); torch.cuda.synchronize()
    t0 = time.perf_counter(); loop(); torch.cuda.synchronize(); watched = (time.perf_counter() - t0) / 2
    print(f"per call: bare {bare * 1e3:.1f} us, watched {watched * 1e3:.1f} us; observed {sum(c.observed for c in calls)} of {len(calls)}")
    prof = cProfile.Profile(); prof.enable(); loop(); prof.disable()
pstats.Stats(prof).sort_stats("tottime").print_stats(15)
PY
echo "== per-call profile at $(( $(date +%s) - t0 ))s"
