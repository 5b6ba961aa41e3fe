#!/usr/bin/env bash
# GPU evidence for issue 15 (the audit measures instead of ranking), on one H200. Run from the repo root with the
# image's python3 (through scripts/gpu/run_all.sh audit_measured, or alone: OUT=/some/dir bash scripts/gpu/audit_measured.sh).
#   1. run1: `attnprof audit --model llama-1b --phase prefill,decode --measure --require measured` (prompt 512,
#      16 new tokens, batch 1, bf16). Expected exit 1: SDPA picks cuDNN, which builds a plan for every new KV length,
#      i.e. every decode step. Its report names the decode call site, the faster arm, the regret per token, the fix.
#   2. run2: the same with the fix run1 named (its JSON's `fix_flag`, e.g. `--pin flash` or `--pin decode=flash`).
#      Expected exit 0. It shares run1's regret cache (same device and versions), so its arms are run1's numbers
#      and what it re-records is what ran under the fix.
#   3. benchmarks/watch_overhead.py --decode: the watcher's cost per decode step and as a share of the step.
# Writes $OUT/audit_measured/{run1,run2}/{report.md,audit.json} and $OUT/audit_measured/watch-overhead-decode.json.
# Budget: <= 100 s (caps 50 + 28 + 22 s); each part has its own timeout and a failing part does not stop the next.
set -u
dest="${OUT:-/tmp/out}/audit_measured"; mkdir -p "$dest/run1" "$dest/run2"
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH}
export ATTNPROF_CACHE_DIR=/tmp/audit-measured-cache; rm -rf "$ATTNPROF_CACHE_DIR"
t0=$(date +%s)
stamp() { echo "== $1 at $(( $(date +%s) - t0 ))s"; }
python3 -c "import torch, transformers, triton; print('torch', torch.__version__, 'cudnn', torch.backends.cudnn.version(), 'transformers', transformers.__version__, 'triton', triton.__version__)"
common=(--device cuda --model llama-1b --phase prefill,decode --batch 1 --seq 512 --new-tokens 16 --measure
        --require measured --json)

# 1. as shipped: expected exit 1 (cuDNN in decode)
timeout 50 python3 -m attnprof audit "${common[@]}" --out /tmp/am-run1 > /tmp/am-run1.log 2>&1
code1=$?
echo "run1 exit=$code1 (expected 1)"; grep -E "check failed|^model|apply the measured fix|Error|error" /tmp/am-run1.log | cut -c1-400 | head -12
tail -1 /tmp/am-run1.log | cut -c1-400
cp /tmp/am-run1/audit.md "$dest/run1/report.md" 2>/dev/null; cp /tmp/am-run1/audit.json "$dest/run1/audit.json" 2>/dev/null
stamp "run1"

# 2. with the fix run1 named
fix=$(python3 -c "import json; print(json.load(open('/tmp/am-run1/audit.json')).get('fix_flag') or '')" 2>/dev/null)
if [ -z "$fix" ]; then
  echo "run1 named no fix (exit $code1): run2 pins flash for decode, the fix GPU_FACTS expects"; fix="--pin decode=flash"
fi
echo "run2 fix: $fix"
# shellcheck disable=SC2086  # $fix is two words: --pin VALUE
timeout 28 python3 -m attnprof audit "${common[@]}" $fix --out /tmp/am-run2 > /tmp/am-run2.log 2>&1
code2=$?
echo "run2 exit=$code2 (expected 0)"; grep -E "check failed|^model|Error|error" /tmp/am-run2.log | cut -c1-400 | head -8
tail -1 /tmp/am-run2.log | cut -c1-400
cp /tmp/am-run2/audit.md "$dest/run2/report.md" 2>/dev/null; cp /tmp/am-run2/audit.json "$dest/run2/audit.json" 2>/dev/null
stamp "run2"

# 3. the watcher's cost per decode step
timeout 22 python3 benchmarks/watch_overhead.py --model llama-1b --device cuda --decode --batch 1 --seq 512 \
  --steps 16 --reps 4 --out "$dest/watch-overhead-decode.json" > /tmp/am-overhead.log 2>&1
echo "overhead exit=$?"; grep -v Warning /tmp/am-overhead.log | grep -v "return forward_call" | tail -2 | cut -c1-400
stamp "overhead"

# one summary line per run, for the lead's notes
python3 - <<'PY'
import json, os
dest = os.path.join(os.environ.get("OUT", "/tmp/out"), "audit_measured")
for run in ("run1", "run2"):
    try:
        d = json.load(open(f"{dest}/{run}/audit.json"))
    except (OSError, ValueError) as exc:
        print(run, "no audit.json:", exc); continue
    print(run, "violations", d.get("violations"), "regret ms/token", d.get("regret_ms_per_token"), "fix", d.get("fix_flag"))
    for r in d.get("sites") or []:
        print(f"  {r['site']['shape_class']:8} ran {r['ran']} best {r['best_arm']} ({r['best_backend']}) "
              f"regret {r['regret_pct']} % {r['regret_ms_per_token']} ms/token verdict {r['verdict']}")
        for a in r["arms"]:
            print(f"     {a['arm']:15} {str(a['backend']):10} {a['status']:9} first {a['first_p50']} repeat {a['repeat_p50']}"
                  f" est {a['estimate_ms']} {(a['reason'] or '')[:100]}")
PY
ls -la "$dest" "$dest/run1" "$dest/run2"
