#!/usr/bin/env bash
# One device call: install carried wheels, run the named claims' reproduce.sh (or scripts/gpu/<name>.sh), pack $OUT.
# Usage on the device: bash scripts/gpu/run_all.sh stages audit verify ...
#   a name with docs/results/<name>/reproduce.sh runs that script with OUT=<pack>/<name> (it writes its claim folder
#   there: copy it back over docs/results/<name>/); any other name runs scripts/gpu/<name>.sh with OUT=<pack>.
# EACH_TIMEOUT (default 300 s) caps each name; DEADLINE (epoch seconds) is passed on for scripts that share a call.
set -u
export PYTHONUNBUFFERED=1
# once per machine: a run left going by an earlier call (scripts/gpu/background.sh) may be importing from /tmp/site
if ls .whl/*.whl >/dev/null 2>&1; then
  [ -f /tmp/site/.carried ] || { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && touch /tmp/site/.carried; }
  [ -f /tmp/site/.carried ] && export PYTHONPATH=/tmp/site
  # nvidia-cutlass-dsl (FlashAttention-4's runtime) is a meta package whose .pth pip --target does not apply
  [ -d /tmp/site/nvidia_cutlass_dsl/dsl_packages ] && export PYTHONPATH=$PYTHONPATH:/tmp/site/nvidia_cutlass_dsl/dsl_packages
fi
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}
# .git does not travel to the device: the caller writes the commit here (scripts/gpu/.sha, git-ignored, so the call
# must name it in `carry`; without it the results say no git sha).
[ -f scripts/gpu/.sha ] && export ATTNPROF_GIT_SHA=$(cat scripts/gpu/.sha)
real_out="$OUT"; pack=/tmp/evidence; mkdir -p "$pack"
export PACK="tar czf $real_out/evidence.tgz -C $pack ."  # a script may pack what it has so far: eval "${PACK:-:}"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,utilization.gpu,memory.used --format=csv > "$pack/gpu.txt" 2>&1
for name in "$@"; do
  start=$(date +%s)
  echo "=== $name"
  if [ -f "docs/results/$name/reproduce.sh" ]; then
    script="docs/results/$name/reproduce.sh"; out="$pack/$name"; mkdir -p "$out"; cp "$pack/gpu.txt" "$out/gpu.txt"
  else
    script="scripts/gpu/$name.sh"; out="$pack"
  fi
  OUT="$out" timeout "${EACH_TIMEOUT:-300}" bash "$script" 2>&1 | tee "$pack/$name.log" | tail -"${TAIL:-25}"
  echo "=== $name done in $(( $(date +%s) - start ))s"
  tar czf "$real_out/evidence.tgz" -C "$pack" .  # after each script: a call cut short keeps what finished
done
ls -la "$real_out"
