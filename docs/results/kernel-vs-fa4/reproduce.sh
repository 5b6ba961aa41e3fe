#!/usr/bin/env bash
# Our kernel beside FlashAttention-4 and SDPA (cuDNN) on one GPU, in one run, every number made by attnprof:
# the main job's tutorial workload and a long causal prefill (`stages`), a B·S = 16k sweep at head dims 128 and 64,
# causal and not (`bench`, CUDA events, L2 flushed, against the measured ceilings), and FA4 through the numerics gate
# (`verify`). Needs, on the GPU machine: flash-attn-4 with its CuTe DSL runtime and `kernels` importable (README.md
# here says how they were carried). Writes into $OUT (default: this folder).
set -euo pipefail
cd "$(dirname "$0")/../../.."
OUT=${OUT:-docs/results/kernel-vs-fa4}
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}
ap() { python3 -m attnprof "$@"; }
V=sdpa,kernel,flash-attn-4
ap stages --device cuda --variants $V --out "$OUT/stages-tutorial"
ap stages --device cuda --batch 1 --heads 16 --seq 16384 --head-dim 128 --dtype bf16 --variants $V \
  --out "$OUT/stages-16k"
ap bench --device cuda --variants $V --tokens 16384 --heads 16 --dtype bf16 --measure-ceilings \
  --head-dim 128 --causal --seq 1024,2048,4096,8192,16384 --out "$OUT/bench-hd128-causal"
ap bench --device cuda --variants $V --tokens 16384 --heads 16 --dtype bf16 \
  --head-dim 64 --causal --seq 4096,16384 --out "$OUT/bench-hd64-causal"
ap bench --device cuda --variants $V --tokens 16384 --heads 16 --dtype bf16 \
  --head-dim 128 --no-causal --seq 4096,16384 --out "$OUT/bench-hd128-full"
ap verify --device cuda --variants $V --dtype bf16 --out "$OUT/verify" || echo "verify exit $? (failures are in its report)"
