#!/usr/bin/env bash
# Issue 30, first call: the recompile fix, the fast launch path and the chunked split merge, checked and measured.
#   EACH_TIMEOUT=560 bash scripts/gpu/run_all.sh decode30a
#   1. cuda tests with FLASH_TRITON_CHECK_LAUNCH=1 (every fast launch asks Triton's binder for its kernel)  (<= 150 s)
#   2. host_cost.py with the fast launch off, then on (prefill and decode, ours vs SDPA)                   (<= 90 s)
#   3. kernel_serving_bench.py decode + the decode config sweep (graph-timed, vs SDPA)                    (<= 170 s)
#   4. serve --loop production --mode decode, sdpa and kernel at batch 16, context 4096 (the issue's row)   (<= 140 s)
set -u
dest="${OUT:-/tmp/out}/decode30a"; mkdir -p "$dest"
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
t0=$(date +%s)
FLASH_TRITON_CHECK_LAUNCH=1 timeout 150 python3 -m pytest -q -m cuda -p no:cacheprovider tests/test_kernel_serving_cuda.py \
  tests/test_kernel_cuda.py -k "not test_continuous_batching and (kvcache or decode or no_host_sync or default_dispatch or (views and x128) or timing or variant)" \
  > "$dest/cuda-tests.log" 2>&1
echo "cuda tests exit=$? at $(( $(date +%s) - t0 ))s"; grep -E "passed|failed|FAILED|Error" "$dest/cuda-tests.log" | tail -8 | cut -c1-300
FLASH_TRITON_FAST_LAUNCH=0 timeout 45 python3 kernels/flash-triton/host_cost.py > "$dest/host-cost-slow.log" 2>&1
echo "host_cost (fast launch off) exit=$? at $(( $(date +%s) - t0 ))s"; cat "$dest/host-cost-slow.log"
timeout 45 python3 kernels/flash-triton/host_cost.py > "$dest/host-cost.log" 2>&1
echo "host_cost exit=$? at $(( $(date +%s) - t0 ))s"; cat "$dest/host-cost.log"
timeout 170 python3 benchmarks/kernel_serving_bench.py --out "$dest" --parts decode,tune --batches 1,16,64 \
  --kv-lens 1024,8192,32768 --flex-budget-s -1 > /dev/null 2> "$dest/serving-bench.log"
echo "serving bench exit=$? at $(( $(date +%s) - t0 ))s"; tail -4 "$dest/serving-bench.log"
python3 - "$dest/kernel-serving-bench.json" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))["rows"]
for r in rows:
    if r.get("status") == "ok" and r["impl"] in ("ours", "sdpa") and r["part"] == "decode":
        print(f"decode B={r['batch']:>3} S={r['kv_len']:>6} {r['impl']:<6} {r['graph']*1e3:7.1f} us {r['graph_of_copy']*100:4.0f} %")
best = {}
for r in rows:
    if r["part"] == "tune" and r.get("status") == "ok":
        print(f"tune B={r['batch']:>3} S={r['kv_len']:>6} {r['impl']:<40} {r['graph']*1e3:7.1f} us {r['graph_of_copy']*100:4.0f} %")
PY
timeout 140 python3 -m attnprof serve --model llama-1b --dtype bf16 --loop production --mode decode --impls sdpa,kernel \
  --decode-batch 16 --decode-context 4096 --new-tokens 40 --no-share --out "$dest" --stem production-decode-b16 --json \
  > "$dest/serve-b16.log" 2>&1
echo "serve b16 exit=$? at $(( $(date +%s) - t0 ))s"
grep -E "^\| (sdpa|kernel) " "$dest/production-decode-b16.md" | cut -c1-200; grep -iE "recompile|error" "$dest/serve-b16.log" | head -5
