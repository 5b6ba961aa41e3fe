#!/usr/bin/env bash
# GPU evidence for issue 14 (one run(variant, inputs) path, the backend table, the fp32 gate, the model registry).
# Run from the repo root on the H200 (image python3, no venv; `kernels` from the carried .whl/), e.g.
#   EACH_TIMEOUT=480 bash scripts/gpu/run_all.sh refactor
# Budget: ~6 minutes. Writes $OUT/refactor/:
#   pytest.log        the cuda tests whose code paths changed: test_stages_gpu (run() under stages; watcher and
#                     classifier agree), test_bench_sweep (CUDA peak through bench.memory, a real OOM row),
#                     test_kernel_cuda (kernel_variant(spec) instead of configure()), test_serve_gpu (points through
#                     run.attempt, peak through bench.memory.cuda_peak, the kernel inside llama through the one
#                     AttentionInterface adapter with transformers 5.17's sdpa_mask)
#   stages.json       `attnprof stages` on 1x16x4096x128 bf16 with the kernel: its trace must classify the Gluon
#                     program (attention_fwd_sm90_ws/_wsp) as fused_attention[kernel] (the old regex missed _wsp)
#   verify-half.json  `attnprof verify` kernel level, bf16+fp16: every correct backend must still pass with the
#                     plain_attention (repeat_kv) baseline
#   verify-fp32.json  the same in fp32: the new relative fp32 rule (floors 2e-6/1e-7) on the GPU's fp32 backends
#                     (efficient, math, flex; cuDNN/flash/kernel are rejected in fp32); off_by_1e6 must fail
#   kernel-bench.json benchmarks/kernel_bench.py through run() (D=128, S=1024,4096): kernel vs SDPA as before
set -u
dest="${OUT:-/tmp/out}/refactor"; mkdir -p "$dest"
t0=$(date +%s)
if ! python3 -c "import kernels" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/kernels-*.whl && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD/src:$PWD${PYTHONPATH:+:$PYTHONPATH}

timeout 200 python3 -m pytest -q -m cuda -p no:cacheprovider tests/test_stages_gpu.py tests/test_bench_sweep.py \
  tests/test_kernel_cuda.py tests/test_serve_gpu.py > "$dest/pytest.log" 2>&1
echo "pytest exit=$? at $(( $(date +%s) - t0 ))s"; grep -E "passed|failed|Error" "$dest/pytest.log" | tail -8

timeout 90 python3 -m attnprof stages --batch 1 --heads 16 --seq 4096 --head-dim 128 --dtype bf16 \
  --variants naive,sdpa,flex,kernel --steps 3 --out "$dest/stages" --json > "$dest/stages.log" 2>&1
echo "stages exit=$? at $(( $(date +%s) - t0 ))s"
cp "$dest/stages/results.json" "$dest/stages.json" 2>/dev/null && rm -rf "$dest/stages"
python3 - "$dest/stages.json" <<'EOF'
import json, sys
try:
    data = json.load(open(sys.argv[1]))
except OSError as e:
    sys.exit(f"no stages.json: {e}")
for s in data["stages"]:
    fused = [(k["name"], k["role"], k.get("backend")) for k in s["kernels"] if "attention" in k["name"] or k["role"] == "fused_attention"]
    print(s["variant"], s["status"], s["backend"], s["max_rel_err"], fused[:3])
EOF

timeout 150 python3 -m attnprof verify --device cuda --dtype bf16,fp16 --seed 14 --out "$dest/vh" --json \
  > "$dest/verify-half.log" 2>&1
echo "verify bf16,fp16 exit=$? (1 expected: the known cuDNN pad-left and mem-efficient fully-masked bugs) at $(( $(date +%s) - t0 ))s"; tail -1 "$dest/verify-half.log" | cut -c1-600
cp "$dest/vh/verify.json" "$dest/verify-half.json" 2>/dev/null; cp "$dest/vh/verify.md" "$dest/verify-half.md" 2>/dev/null
rm -rf "$dest/vh"

timeout 120 python3 -m attnprof verify --device cuda --dtype fp32 --seed 14 \
  --variants sdpa,sdpa-efficient,sdpa-math,flex,tests.broken:correct,tests.broken:off_by_1e6 \
  --out "$dest/vf" --json > "$dest/verify-fp32.log" 2>&1
echo "verify fp32 exit=$? (1 expected: off_by_1e6 only) at $(( $(date +%s) - t0 ))s"
tail -1 "$dest/verify-fp32.log" | cut -c1-800
cp "$dest/vf/verify.json" "$dest/verify-fp32.json" 2>/dev/null; cp "$dest/vf/verify.md" "$dest/verify-fp32.md" 2>/dev/null
rm -rf "$dest/vf"

timeout 120 python3 benchmarks/kernel_bench.py --out "$dest/kb" --head-dims 128 --seqs 1024,4096 --reps 20 \
  --flex-budget-s 40 2> "$dest/bench.log" > /dev/null
echo "kernel_bench exit=$? at $(( $(date +%s) - t0 ))s"; tail -3 "$dest/bench.log"
cp "$dest/kb/kernel-bench.json" "$dest/kernel-bench.json" 2>/dev/null; rm -rf "$dest/kb"
ls -la "$dest"
