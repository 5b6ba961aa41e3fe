#!/usr/bin/env bash
# Follow-up evidence after the first full run: the watcher's overhead with the patch hook, the dispatch grid with
# PyTorch's reasons read from fd 2, and a decode diagnosis (is cuDNN slow at Sq = 1 with a growing KV cache?).
set -u
dest="${OUT:-/tmp/out}/final"; mkdir -p "$dest"
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH}
t0=$(date +%s)
timeout 60 python3 benchmarks/watch_overhead.py --model llama-1b --device cuda --batch 4 --seq 512 --reps 20 \
  --out "$dest/watch-overhead-4x512.json" 2>&1 | tail -1 | cut -c1-300
echo "== overhead at $(( $(date +%s) - t0 ))s"
timeout 100 python3 -m attnprof audit --device cuda --crosscheck 3 --out "$dest/grid" --json > "$dest/grid.log" 2>&1
echo "audit grid exit=$? at $(( $(date +%s) - t0 ))s"; grep -E "320 bf16|fp32 causal \|" "$dest/grid/audit.md" | head -3 | cut -c1-400
timeout 120 python3 -m attnprof serve --loop as-shipped --model llama-1b --dtype bf16 --impls eager,sdpa,sdpa-flash,sdpa-efficient,kernel \
  --mode decode --decode-batch 1 --decode-context 1024 --new-tokens 12 --out "$dest/serve" --stem h200-serve-decode --json > "$dest/serve.log" 2>&1
echo "serve exit=$? at $(( $(date +%s) - t0 ))s"
grep -E "^\| (eager|sdpa|kernel)" "$dest/serve/h200-serve-decode.md" | cut -c1-160
