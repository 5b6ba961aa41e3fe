#!/usr/bin/env bash
# Regenerates docs/results/stages/ on a GPU: `attnprof stages` on the tutorial workload, the long run
# (1x32x8192x128 bf16, eight implementations) and the story run (every kernel named, SageAttention from .whl/).
#   bash scripts/gpu/run_all.sh stages        (or alone: OUT=/some/dir bash docs/results/stages/reproduce.sh)
set -u
. scripts/gpu/lib.sh
claim stages
part() {  # part NAME CAP ARGS...: one `attnprof stages` run -> NAME.md + NAME.json
  local name=$1 cap=$2; shift 2
  timeout "$cap" python3 -m attnprof stages "$@" --out "/tmp/stages-$name" > "$dest/$name.log" 2>&1
  echo "$name exit=$?"
  cp "/tmp/stages-$name/report.md" "$dest/$name.md"; cp "/tmp/stages-$name/results.json" "$dest/$name.json"
  stamp "$name"
}
part story 90 --variants sdpa,flex,kernel,sageattention,naive-compiled
part tutorial 90
part long-8192 120 --batch 1 --heads 32 --seq 8192 --head-dim 128 --dtype bf16 \
  --variants naive,inplace,sdpa,sdpa-flash,sdpa-efficient,sdpa-cudnn,flex,kernel
