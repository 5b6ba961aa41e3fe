#!/usr/bin/env bash
# Issue 16 groundwork: what transformers' production loops give on the H200 (scripts/gpu/serve_probe.py says how).
# llama-1b preset, bf16, random weights, the image's torch 2.11 / transformers 5.17; imports nothing from attnprof.
#   generate, batch 1, 1024-token prompt: decode ms/token, plain generate (eager, sdpa-flash) vs static cache
#     (sdpa, sdpa-flash) vs the production recipe, static cache + torch.compile(mode="reduce-overhead") (eager, sdpa,
#     sdpa-efficient), and what the first (compiling, capturing) call costs;
#   continuous batching, serve.sh's 40-request stream (512 blocks of 256, 2048 batch tokens): paged eager / sdpa /
#     sdpa-efficient with use_cuda_graph off and on: output tok/s, TTFT/TPOT/ITL p50/p90/p99, failures, resolved config;
#   which attn_implementation names continuous batching accepts (and what they ran as); which SDPA kernel runs for a
#   static-cache decode step and a paged varlen step (auto and each backend pinned).
# Run from the repo root on the H200 (image python3, no venv, no .whl needed). Writes $OUT/serve_probe/serve_probe.json
# (rewritten after every row), serve_probe.log (stdout: a line per row, then the table) and stderr.log.
# Budget: ~4 minutes; no part starts after 225 s of work (skipped rows say so); hard stop at 290 s.
set -u
dest="${OUT:-/tmp/out}/serve_probe"; mkdir -p "$dest"
export PYTHONUNBUFFERED=1
start=$(date +%s)
timeout 290 python3 scripts/gpu/serve_probe.py --out "$dest" --budget-s "${PROBE_BUDGET_S:-225}" \
  2> "$dest/stderr.log" | tee "$dest/serve_probe.log"
echo "serve_probe exit=${PIPESTATUS[0]} in $(( $(date +%s) - start ))s"
grep -E "Error|error" "$dest/stderr.log" | grep -v "^\s" | sort | uniq -c | sort -rn | head -8
