#!/usr/bin/env bash
# GPU evidence for issue 18 part A (status + verdicts) on one H200:
#   1. verify's kernel level, flex + sdpa, bf16+fp16, default cases (seed 20261202): torch.compile(flex_attention,
#      dynamic=False) recompiles per shape and hits dynamo's recompile limit (8) part-way (it did at git 045c18c,
#      in that tree's docs/results/h200-refactor/verify-half.log); the rows after it must be named `flex (unfused)` with dynamo's
#      warning in their reason, never plain `flex`.
#   2. verify's model level on tiny-llama (eager, sdpa, flex_attention; fp32+bf16): flex compiles with Triton here, so
#      it must pass or fail on its numbers, and is named `flex_attention (unfused)` if generate's growing KV length
#      pushed it past the recompile limit; a crash would be `error` (exit 1), never `rejected`.
#   3. compare: the same small bench run twice (naive, sdpa; seq 512,1024; bf16), then `compare` B vs A and A vs A
#      with --fail-on-regression: an identical re-run is never a regression (exit 0); verdict counts in the log.
# Each part has its own time limit; one that fails or hangs does not stop the next. Budget: ~4 min (110+80+50 s).
# Writes $OUT/robust-a/{verify-flex/verify.{json,md}, verify-model/verify.{json,md}, compare/compare.json, *.log,
# summary.md}.
set -u
dest="${OUT:-/tmp/out}/robust-a"; mkdir -p "$dest"
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH}
t0=$(date +%s)
summary="$dest/summary.md"
{ echo "# robust-a on $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)"; echo;
  python3 -c "import torch, triton, transformers; print(f'torch {torch.__version__} · triton {triton.__version__} · transformers {transformers.__version__}')" 2>&1
  echo; } > "$summary"

# 1. kernel level: flex past the recompile limit
timeout 110 python3 -m attnprof verify --device "${DEVICE:-cuda}" --dtype bf16,fp16 --variants flex,sdpa --seed 20261202 \
  --out "$dest/verify-flex" --json > "$dest/verify-flex.log" 2>&1
rc=$?; echo "verify-flex exit=$rc at $(( $(date +%s) - t0 ))s"
python3 - "$dest/verify-flex/verify.json" >> "$summary" 2>&1 <<'PY' || echo "verify-flex: no verify.json (exit $rc)" >> "$summary"
import json, sys
d = json.load(open(sys.argv[1]))
rows = [r for c in d["kernel"]["cases"] for r in c["results"] if r["variant"].startswith("flex")]
print("## 1. verify kernel level, flex: " + ("PASS" if d["ok"] else "FAIL"))
print()
for r in rows:
    print(f"- {r['case']} {r['dtype']}: `{r['variant']}` {r['status']}" + (f" — {r['reason'][:220]}" if r["reason"] and "unfused" in r["variant"] else ""))
print()
print(f"unfused rows: {sum('unfused' in r['variant'] for r in rows)} of {len(rows)}")
print()
PY
tail -3 "$summary"

# 2. model level: flex_attention compiled by transformers
timeout 80 python3 -m attnprof verify --device "${DEVICE:-cuda}" --model tiny-llama --dtype fp32,bf16 \
  --impls eager,sdpa,flex_attention --seed 20261202 --out "$dest/verify-model" --json > "$dest/verify-model.log" 2>&1
rc=$?; echo "verify-model exit=$rc at $(( $(date +%s) - t0 ))s"
{ echo "## 2. verify --model tiny-llama (exit $rc)"; echo; tail -1 "$dest/verify-model.log" | cut -c1-900; echo;
  grep -h "recompile_limit" "$dest/verify-model.log" | head -2; echo; } >> "$summary"
tail -4 "$summary"

# 3. compare: an identical re-run is never a regression
B=(--device "${DEVICE:-cuda}" --variants naive,sdpa --seq 512,1024 --batch 4 --heads 16 --head-dim 128 --dtype bf16 --reps 20)
timeout 50 bash -c "python3 -m attnprof bench ${B[*]} --out '$dest/bench-a' > '$dest/compare.log' 2>&1 &&
  python3 -m attnprof bench ${B[*]} --out '$dest/bench-b' >> '$dest/compare.log' 2>&1 &&
  python3 -m attnprof compare '$dest/bench-a' '$dest/bench-b' --fail-on-regression --out '$dest/compare' --json \
    >> '$dest/compare.log' 2>&1; echo \"compare B vs A exit=\$?\" >> '$dest/compare.log';
  python3 -m attnprof compare '$dest/bench-a' '$dest/bench-a' --fail-on-regression --out '$dest/compare-same' --json \
    >> '$dest/compare.log' 2>&1; echo \"compare A vs A exit=\$?\" >> '$dest/compare.log'"
echo "compare part exit=$? at $(( $(date +%s) - t0 ))s"
{ echo "## 3. compare, the same bench twice"; echo; grep -E "^(compare .* exit|\{)" "$dest/compare.log" | cut -c1-400;
  echo; } >> "$summary"
tail -6 "$summary"
rm -rf "$dest/bench-a/traces" "$dest/bench-b/traces" "$dest/compare-same" 2>/dev/null
ls -la "$dest"
