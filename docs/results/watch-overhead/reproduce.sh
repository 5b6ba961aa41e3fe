#!/usr/bin/env bash
# Regenerates docs/results/watch-overhead/ on a GPU: what attnprof.audit.watch() adds to a llama-1b bf16 forward,
# watched and plain forwards interleaved, at a launch-bound 4x512, one long prompt 1x2048 and a GPU-bound 8x2048
# (with ablation arms), and per decode step (1x512, 16 steps). CPU=1 instead re-makes cpu/ on this machine's CPU.
#   bash scripts/gpu/run_all.sh watch-overhead          CPU=1 bash docs/results/watch-overhead/reproduce.sh
set -u
. scripts/gpu/lib.sh
claim watch-overhead
if [ "${CPU:-0}" = 1 ]; then
  mkdir -p "$dest/cpu"
  python3 benchmarks/watch_overhead.py --model tiny-llama --batch 1 --seq 256 --reps 60 --ablate \
    --out "$dest/cpu/cpu-watch-overhead-tiny-llama-1x256.json"
  python3 benchmarks/watch_overhead.py --model llama-1b --batch 1 --seq 256 --reps 8 \
    --out "$dest/cpu/cpu-watch-overhead-llama-1b-1x256.json"
  exit 0
fi
for shape in "4 512" "1 2048" "8 2048"; do
  set -- $shape
  timeout 120 python3 benchmarks/watch_overhead.py --model llama-1b --device cuda --batch "$1" --seq "$2" --reps 40 \
    --ablate --out "$dest/forward-${1}x${2}.json" 2>&1 | tail -1 | cut -c1-300
  stamp "${1}x${2}"
done
timeout 60 python3 benchmarks/watch_overhead.py --model llama-1b --device cuda --decode --batch 1 --seq 512 \
  --steps 16 --reps 4 --out "$dest/decode-1x512.json" 2>&1 | tail -1 | cut -c1-300
