#!/usr/bin/env bash
# GPU evidence for issue 18, part B (validation up front, no leftovers, output for people) on one H200.
#   1. sizes against the GPU's memory: `stages --seq 1000000`, `--batch 1000000000000`, a 10^12-parameter config in
#      `audit --model` -> exit 2 "needs N GiB, the device (cuda) has M GiB", no folder left; `verify --model-seq 0`;
#      a naive score matrix beyond the GPU -> an `oom` row (on a GPU it is a row, not exit 2), sdpa still `ok`;
#   2. `--kernel` mistakes (a folder that is not a kernel repo, a Hub name without --trust-remote-kernel) -> exit 2;
#   3. third-party noise: the tutorial `stages` and `verify --model tiny-llama` on CUDA: stderr has no raw USDT,
#      c10 `[W…]`, UserWarning, dynamo or nanobind lines; what was captured is in verify.json's third_party_warnings;
#   4. an interrupted `bench` (SIGINT after 12 s): exit 130, folder marked INCOMPLETE with the finished rows;
#      `--resume` with another grid -> exit 2; `--resume` with the same grid completes it and removes INCOMPLETE;
#   5. every stdout table of the above fits 80 columns.
# Each command has its own `timeout`; a failed or hung part is a FAIL line, the next part still runs.
# Writes $OUT/robust-b/{checks.md, stages.txt, bench.txt} and $OUT/robust-b/logs/*.
# Budget: ~5 minutes (caps 30x6 + 150 + 240 + 120 + 12 + 20 + 150 s; most parts take seconds).
set -u
dest="${OUT:-/tmp/out}/robust-b"; logs="$dest/logs"; mkdir -p "$logs"
work=$(mktemp -d /tmp/robust-b.XXXX)
t0=$(date +%s)
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH}
checks="$dest/checks.md"
{
  echo "# issue 18 part B on the GPU: validation, leftovers, output"
  echo
  echo "$(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null | head -1); torch" \
       "$(python3 -c 'import torch;print(torch.__version__)' 2>/dev/null); commit ${ATTNPROF_GIT_SHA:-unknown}"
  echo
  echo "| check | expected | exit | what it said (first error line, or the result) | verdict |"
  echo "|---|---|---|---|---|"
} > "$checks"
pass=0; fail=0

row() {  # row NAME EXPECTED EXIT SAID OK(0/1)
  local said="${4//|/\\|}"
  if [ "$5" = 0 ]; then pass=$((pass + 1)); v=PASS; else fail=$((fail + 1)); v=FAIL; fi
  echo "| $1 | $2 | $3 | ${said:0:160} | $v |" >> "$checks"
  echo "$v $1 (exit $3, $(( $(date +%s) - t0 ))s): ${said:0:140}"
}

first_error() { grep -m1 -E "attnprof: (error|check failed)|Traceback|Error" "$1" | tr -d '\r'; }

width_ok() {  # width_ok FILE: 0 when no stdout line is wider than 80 columns
  python3 - "$1" <<'EOF'
import sys
lines = open(sys.argv[1], encoding="utf-8", errors="replace").read().splitlines()
wide = [l for l in lines if len(l.rstrip()) > 80]
print(f"widest line {max((len(l.rstrip()) for l in lines), default=0)} columns")
sys.exit(1 if wide else 0)
EOF
}

expect_2() {  # expect_2 NAME MUST_SAY OUTDIR CMD...: exit 2, one line saying MUST_SAY, no traceback, OUTDIR absent
  local name=$1 say=$2 outdir=$3; shift 3
  timeout 30 python3 -m attnprof "$@" > "$logs/$name.out" 2> "$logs/$name.err"; local rc=$?
  local line; line=$(first_error "$logs/$name.err")
  local ok=1
  if [ $rc = 2 ] && grep -q -- "$say" "$logs/$name.err" && ! grep -q Traceback "$logs/$name.err" \
     && [ ! -e "$outdir" ]; then ok=0; fi
  row "$name" "exit 2, says \`$say\`, no folder" "$rc" "$line" $ok
}

noise_of() {  # the raw third-party lines left on a stderr log
  grep -cE "^USDT|^STAGE:|^\[W[0-9]{4}|UserWarning|^W[0-9]{4} .*dynamo|nanobind: leaked|without psutil" "$1"
}

# --- 1. sizes ------------------------------------------------------------------------------------------------------
expect_2 stages-seq-1e6 "GiB, the device (cuda" "$work/s1" stages --seq 1000000 --out "$work/s1"
expect_2 stages-batch-1e12 "GiB, the device (cuda" "$work/s2" stages --batch 1000000000000 --out "$work/s2"
python3 - "$work/huge.json" <<'EOF'
import json, sys
json.dump(dict(model_type="llama", hidden_size=16384, intermediate_size=53248, num_hidden_layers=1000,
               num_attention_heads=128, num_key_value_heads=8, vocab_size=128256), open(sys.argv[1], "w"))
EOF
expect_2 audit-model-1e12-params "GiB, the device (cuda" "$work/a1" audit --model "$work/huge.json" --out "$work/a1"
python3 -c "import json,sys;d=json.load(open(sys.argv[1]));d['num_attention_heads']=0;json.dump(d,open(sys.argv[2],'w'))" \
  "$work/huge.json" "$work/zero.json"
expect_2 serve-model-zero-heads "at least one attention head" "$work/z1" serve --model "$work/zero.json" --out "$work/z1"
expect_2 verify-model-seq-0 "--model-seq" "$work/v0" verify --model tiny-llama --model-seq 0 --out "$work/v0"

timeout 150 python3 -m attnprof stages --batch 8 --heads 32 --seq 16384 --head-dim 128 --dtype bf16 \
  --variants naive,sdpa --out "$work/oom" > "$logs/stages-oom.out" 2> "$logs/stages-oom.err"; rc=$?
said=$(python3 -c "
import json,sys
d=json.load(open(sys.argv[1]))
print('; '.join(f\"{s['variant']} {s['status']}\" + (f\" ({(s.get('reason') or '')[:60]})\" if s['status']!='ok' else '') for s in d['stages']))" \
  "$work/oom/results.json" 2>/dev/null || first_error "$logs/stages-oom.err")
ok=1; case "$said" in *"naive oom"*"sdpa ok"*) [ $rc = 0 ] || [ $rc = 1 ] && ok=0;; esac
row stages-naive-beyond-gpu "naive an oom row, sdpa ok (no exit 2 on a GPU)" "$rc" "$said" $ok

# --- 2. --kernel mistakes --------------------------------------------------------------------------------------------
mkdir -p "$work/not-a-repo"
expect_2 kernel-not-a-repo "no build/" "$work/k1" stages --variants kernel --kernel "$work/not-a-repo" --out "$work/k1"
expect_2 kernel-hub-untrusted "trust-remote-kernel" "$work/k2" stages --variants kernel --kernel some-org/flash@1 \
  --out "$work/k2"

# --- 3. noise, and the 80-column tables --------------------------------------------------------------------------
timeout 240 python3 -m attnprof stages --out "$work/tutorial" > "$dest/stages.txt" 2> "$logs/stages.err"; rc=$?
n=$(noise_of "$logs/stages.err"); w=$(width_ok "$dest/stages.txt"); wrc=$?
notes=$(grep -c "default for CUDA" "$logs/stages.err")
ok=1; [ $rc -le 1 ] && [ "$n" = 0 ] && [ $wrc = 0 ] && [ "$notes" = 1 ] && ok=0
row stages-tutorial-clean "exit 0/1, no raw third-party line, note once, stdout <= 80 cols" "$rc" \
  "$n raw noise line(s); note printed $notes time(s); $w" $ok

timeout 150 python3 -m attnprof verify --model tiny-llama --seed 1 --out "$work/verify" > "$logs/verify.out" \
  2> "$logs/verify.err"; rc=$?
n=$(noise_of "$logs/verify.err"); w=$(width_ok "$logs/verify.out"); wrc=$?
cap=$(python3 -c "
import json,sys
d=json.load(open(sys.argv[1]))
print('; '.join(f\"{e['count']}x {e['meaning']}\" for e in d.get('third_party_warnings', [])) or 'none captured')" \
  "$work/verify/verify.json" 2>/dev/null || echo "no verify.json")
ok=1; [ $rc -le 1 ] && [ "$n" = 0 ] && [ $wrc = 0 ] && ok=0
row verify-model-clean "exit 0/1, no raw third-party line, stdout <= 80 cols" "$rc" \
  "$n raw noise line(s); $w; captured: $cap" $ok

# --- 4. an interrupted bench, --resume -----------------------------------------------------------------------------
grid=(--variants naive,sdpa,flex --seq 1024,2048,4096,8192,16384 --batch 4 --heads 16 --head-dim 64 --reps 50)
timeout --preserve-status -s INT 12 python3 -m attnprof bench "${grid[@]}" --out "$work/sweep" \
  > "$logs/bench-cut.out" 2> "$logs/bench-cut.err"; rc=$?
rows=$(wc -l < "$work/sweep/results.jsonl" 2>/dev/null || echo 0)
ok=1; [ $rc = 130 ] && [ -f "$work/sweep/INCOMPLETE" ] && [ -f "$work/sweep/results.jsonl" ] && ok=0
[ $rc = 0 ] && ok=1 && rows="the sweep finished inside 12 s: the interrupt was not exercised"
row bench-interrupted "exit 130, folder kept with INCOMPLETE and its finished rows" "$rc" "$rows row(s) kept" $ok

timeout 20 python3 -m attnprof bench --variants naive,sdpa --seq 1024 --batch 4 --heads 16 --head-dim 64 \
  --out "$work/sweep" --resume > "$logs/bench-other.out" 2> "$logs/bench-other.err"; rc=$?
ok=1; [ $rc = 2 ] && grep -q "another grid" "$logs/bench-other.err" && ok=0
row bench-resume-other-grid "exit 2, says another grid" "$rc" "$(first_error "$logs/bench-other.err")" $ok

timeout 150 python3 -m attnprof bench "${grid[@]}" --out "$work/sweep" --resume > "$dest/bench.txt" \
  2> "$logs/bench-resume.err"; rc=$?
rows=$(wc -l < "$work/sweep/results.jsonl" 2>/dev/null || echo 0); w=$(width_ok "$dest/bench.txt"); wrc=$?
ok=1; [ $rc = 0 ] && [ ! -f "$work/sweep/INCOMPLETE" ] && [ "$rows" = 15 ] && [ $wrc = 0 ] && ok=0
row bench-resumed "exit 0, 15 rows, INCOMPLETE gone, table <= 80 cols" "$rc" "$rows rows; $w" $ok

{
  echo
  echo "$pass passed, $fail failed, in $(( $(date +%s) - t0 )) s. Logs: logs/*.err, logs/*.out."
} >> "$checks"
rm -rf "$work"
echo "robust-b: $pass passed, $fail failed in $(( $(date +%s) - t0 ))s"
ls -la "$dest"
