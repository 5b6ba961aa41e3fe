#!/usr/bin/env bash
# One device call: install carried wheels, run the named evidence scripts, pack $OUT into one tarball.
# Usage on the device: bash scripts/gpu/run_all.sh stages audit verify ...   (names of scripts/gpu/<name>.sh)
set -u
export PYTHONUNBUFFERED=1
# once per machine: a run left going by an earlier call (grid14.sh) may be importing from /tmp/site
if ls .whl/*.whl >/dev/null 2>&1; then
  [ -f /tmp/site/.carried ] || { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && touch /tmp/site/.carried; }
  [ -f /tmp/site/.carried ] && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}
# .git does not travel to the device: the caller writes the commit here (scripts/gpu/.sha, git-ignored).
[ -f scripts/gpu/.sha ] && export ATTNPROF_GIT_SHA=$(cat scripts/gpu/.sha)
real_out="$OUT"; export OUT=/tmp/evidence; mkdir -p "$OUT"
export PACK="tar czf $real_out/evidence.tgz -C $OUT ."  # a script may pack what it has so far: eval "${PACK:-:}"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,utilization.gpu,memory.used --format=csv > "$OUT/gpu.txt" 2>&1
for name in "$@"; do
  start=$(date +%s)
  echo "=== $name"
  timeout "${EACH_TIMEOUT:-300}" bash "scripts/gpu/$name.sh" 2>&1 | tee "$OUT/$name.log" | tail -"${TAIL:-25}"
  echo "=== $name done in $(( $(date +%s) - start ))s"
  tar czf "$real_out/evidence.tgz" -C "$OUT" .  # after each script: a call cut short keeps what finished
done
ls -la "$real_out"
