#!/usr/bin/env bash
# GPU evidence for issue 19 (the main job tells the true story for any kernel), on one H200. Run from the repo root
# with the image's python3 (through scripts/gpu/run_all.sh stages_story, or alone: OUT=/some/dir bash
# scripts/gpu/stages_story.sh). sageattention arrives from .whl/ (run_all.sh puts it on PYTHONPATH).
#   1. story:   `attnprof stages --variants sdpa,flex,kernel,sageattention,naive-compiled` (the issue's Done-means
#               run, first because it matters most): every kernel with a short name and the op that launched it,
#               SageAttention's quantize kernels, the lossy marker, what inductor made of naive attention.
#   2. default: `attnprof stages` (the tutorial workload, 5 stages), wall time measured (goal < 30 s; it was 33.2 s).
#   3. long:    the README's long run, 1x32x8192x128 bf16, 8 stages (-> docs/results/h200-stages/long-8192.*).
# Writes $OUT/stages_story/{default,story,long}/{report.md,results.json} + one .log each (no traces: too big)
# and $OUT/stages_story/times.txt. Budget <= 210 s (caps 70 + 60 + 80 s); a failing part does not stop the next.
set -u
dest="${OUT:-/tmp/out}/stages_story"; mkdir -p "$dest"
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH}
t0=$(date +%s)
stamp() { echo "== $1 at $(( $(date +%s) - t0 ))s"; }
python3 - <<'PY'
import importlib.util as u
import torch, triton, transformers
print("torch", torch.__version__, "triton", triton.__version__, "transformers", transformers.__version__,
      "cuda", torch.cuda.is_available())
for m in ("sageattention", "flash_attn", "flashinfer", "xformers"):
    print(m, "available" if u.find_spec(m) else "NOT available (its row will say rejected)")
PY

part() {  # part NAME TIMEOUT ARGS...: run one stages job, keep report.md + results.json + the log
  local name=$1 cap=$2; shift 2
  local s; s=$(date +%s.%N)
  timeout "$cap" python3 -m attnprof stages "$@" --out "/tmp/ss-$name" > "$dest/$name.log" 2>&1
  local code=$?
  local secs; secs=$(python3 -c "import time; print(f'{time.time() - $s:.1f}')")
  echo "$name exit=$code wall=${secs}s" | tee -a "$dest/times.txt"
  [ "$code" = 124 ] && echo "$name: TIMED OUT after ${cap}s"
  mkdir -p "$dest/$name"
  cp "/tmp/ss-$name/report.md" "$dest/$name/report.md" 2>/dev/null || echo "$name: no report.md"
  cp "/tmp/ss-$name/results.json" "$dest/$name/results.json" 2>/dev/null || echo "$name: no results.json"
  grep -vE "^\s*$|━|Warning|warn\(" "$dest/$name.log" | cut -c1-160 | head -45
  stamp "$name"
}

part story 70 --variants sdpa,flex,kernel,sageattention,naive-compiled
part default 60
part long 80 --batch 1 --heads 32 --seq 8192 --head-dim 128 --dtype bf16 \
  --variants naive,inplace,sdpa,sdpa-flash,sdpa-efficient,sdpa-cudnn,flex,kernel

# one line per stage of the story run, for the lead's notes
python3 - "$dest" <<'PY'
import json, sys
dest = sys.argv[1]
for run in ("story", "default", "long"):
    try:
        d = json.load(open(f"{dest}/{run}/results.json"))
    except (OSError, ValueError) as exc:
        print(run, "no results.json:", exc); continue
    for s in d["stages"]:
        lat = (s.get("latency_ms") or {}).get("p50")
        print(run, s["variant"], s["status"], s.get("backend"), "p50", lat, "kernels", s.get("kernels_per_step"),
              "err", s.get("max_rel_err"), "lossy", s.get("lossy"), "wall_s", s.get("wall_s"),
              (s.get("reason") or "")[:120])
        if run == "story":
            for k in s.get("kernels", []):
                print("   ", k.get("short"), "|", k.get("role"), "|", (k.get("cause") or {}).get("op"))
PY
stamp "all"
