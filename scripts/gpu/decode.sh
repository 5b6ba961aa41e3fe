#!/usr/bin/env bash
# Decode diagnosis (issue 7): why SDPA's own choice (cuDNN) is ~3x slower than eager at decode although its
# attention kernels are fast. The attention column carries GPU / host ms per step; the answer says where a slower
# implementation loses its time (decode is profiled inside generate).
# Writes $OUT/decode/h200-serve-decode.{md,json}. ~1 minute.
set -u
dest="${OUT:-/tmp/out}/decode"; mkdir -p "$dest"
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH}
start=$(date +%s)
timeout 200 python3 -m attnprof serve --loop as-shipped --model llama-1b --dtype bf16 --impls eager,sdpa,sdpa-flash,kernel \
  --mode decode --decode-batch 1,16 --decode-context 1024 --new-tokens 16 \
  --out "$dest" --stem h200-serve-decode --json > "$dest/serve.log" 2>&1
echo "serve decode exit=$? in $(( $(date +%s) - start ))s"
grep -E "^\| (eager|sdpa|kernel)" "$dest/h200-serve-decode.md" | cut -c1-260
grep -o "loses [^;]*;[^:]*:[^.]*\." "$dest/h200-serve-decode.md" | head -3
# The same decode with PyTorch's opt-in `TORCH_CUDNN_SDPA_AVOID_RECOMPILE=1` (pytorch#155958: cuDNN's ragged path
# for BSHD, one graph for every KV length): does it remove the first-pass cost per new KV length?
start=$(date +%s)
TORCH_CUDNN_SDPA_AVOID_RECOMPILE=1 timeout 150 python3 -m attnprof serve --loop as-shipped --model llama-1b --dtype bf16 \
  --impls eager,sdpa --mode decode --decode-batch 1,16 --decode-context 1024 --new-tokens 16 \
  --out "$dest" --stem h200-serve-decode-avoid-recompile --json > "$dest/serve-avoid-recompile.log" 2>&1
echo "serve decode (TORCH_CUDNN_SDPA_AVOID_RECOMPILE=1) exit=$? in $(( $(date +%s) - start ))s"
grep -E "^\| (eager|sdpa)" "$dest/h200-serve-decode-avoid-recompile.md" | cut -c1-260
