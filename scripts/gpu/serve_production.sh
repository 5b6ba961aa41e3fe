#!/usr/bin/env bash
# GPU evidence for issue 16: `attnprof serve --loop production` on one H200 (llama-1b preset, bf16, random weights).
#   1. continuous batching, production loop (ContinuousBatchingConfig(use_cuda_graph=True), paged cache 512 x 256,
#      2048 batch tokens): eager, sdpa, sdpa-efficient (pinned; flash cannot take CB's mask), our kernel (registered by
#      serving/hub_kernel.py) on serve.sh's 40-request Poisson stream (32/s, prompts ~384, outputs ~64) -- the same
#      stream as the as-shipped evidence docs/results/h200-serve/h200-serve.md;
#   2. generate at batch 1, prompt 1024, production loop (static cache + torch.compile(mode="reduce-overhead")):
#      ms/token = (t(40) - t(10)) / 30 per implementation; the first (compiling, capturing) call reported apart;
#   3. if time is left: sdpa alone in both loops with TORCH_CUDNN_SDPA_AVOID_RECOMPILE=1 (continuous batching).
# Each part has its own timeout; a part cut short leaves its rows so far in STEM.partial.json (the complete report is
# STEM.md/STEM.json). Budget: 180 s in all (parts capped at 80 s, then what is left of 170 s, then of 178 s).
# Writes $OUT/serve_production/{production-cb,production-decode,production-cb-avoid-recompile}.{md,json} (+ PNGs)
# and one log per part.
set -u
dest="${OUT:-/tmp/out}/serve_production"; mkdir -p "$dest"
t0=$(date +%s)
if ! python3 -c "import kernels" 2>/dev/null && ls .whl/kernels-*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/kernels-*.whl && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1
python3 -c "import torch, transformers, dataclasses as d; from transformers import ContinuousBatchingConfig as C; \
print('torch', torch.__version__, 'transformers', transformers.__version__, 'use_cuda_graph' in {f.name for f in d.fields(C)})" \
  2>&1 | tee "$dest/versions.log"
left() { echo $(( $1 - ($(date +%s) - t0) )); }

STREAM=(--requests 40 --rate 32 --prompt-median 384 --prompt-sigma 0.6 --max-prompt 1536 --output-median 64
        --output-sigma 0.5 --max-output 160 --num-blocks 512 --max-batch-tokens 2048 --stream-timeout 30
        --slo-ttft-ms 2000 --slo-tpot-ms 50)

timeout 80 python3 -m attnprof serve --model llama-1b --dtype bf16 --loop production --mode continuous \
  --impls eager,sdpa,kernel,sdpa-efficient "${STREAM[@]}" --out "$dest" --stem production-cb --json \
  > "$dest/production-cb.log" 2>&1
echo "part 1 (CB production) exit=$? at $(( $(date +%s) - t0 ))s"
grep -vE "^\s*$|━" "$dest/production-cb.log" | grep -E "^production loop|exit|Error|error" | tail -6

t=$(left 170); [ "$t" -gt 75 ] && t=75
if [ "$t" -ge 25 ]; then
  timeout "$t" python3 -m attnprof serve --model llama-1b --dtype bf16 --loop production --mode decode \
    --impls eager,sdpa,kernel,sdpa-efficient --decode-batch 1 --decode-context 1024 --new-tokens 40 --no-share \
    --out "$dest" --stem production-decode --json > "$dest/production-decode.log" 2>&1
  echo "part 2 (generate production, timeout ${t}s) exit=$? at $(( $(date +%s) - t0 ))s"
  grep -E "^production loop|Error|error" "$dest/production-decode.log" | tail -6
else
  echo "part 2 skipped: ${t}s left"
fi

t=$(left 178)
if [ "$t" -ge 30 ]; then
  TORCH_CUDNN_SDPA_AVOID_RECOMPILE=1 timeout "$t" python3 -m attnprof serve --model llama-1b --dtype bf16 \
    --loop as-shipped,production --mode continuous --impls sdpa "${STREAM[@]}" --out "$dest" \
    --stem production-cb-avoid-recompile --json > "$dest/production-cb-avoid-recompile.log" 2>&1
  echo "part 3 (AVOID_RECOMPILE, timeout ${t}s) exit=$? at $(( $(date +%s) - t0 ))s"
else
  echo "part 3 (TORCH_CUDNN_SDPA_AVOID_RECOMPILE=1) skipped: ${t}s left"
fi
for f in "$dest"/*.json; do
  python3 - "$f" <<'PY' 2>/dev/null
import json, sys
d = json.load(open(sys.argv[1]))
p = d.get("production") or {}
print(sys.argv[1].rsplit("/", 1)[-1] + (" (PARTIAL)" if d.get("partial") else ""))
for r in (p.get("decode") or []) + ((p.get("continuous") or {}).get("results") or []) \
        + d.get("decode", []) + d.get("continuous", {}).get("results", []):
    print(f"  {r.get('loop')} {r['impl']}: {r['status']} tok/s={r.get('tokens_per_s') or r.get('output_tokens_per_s')}"
          f" ms/token={r.get('step_ms')} cold_s={r.get('cold_s') or r.get('warmup_s')} {(r.get('reason') or '')[:120]}")
PY
done
ls -la "$dest"
