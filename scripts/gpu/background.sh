#!/usr/bin/env bash
# A run longer than one device call, started once and re-attached by every later call on the same warm machine.
#   bash scripts/gpu/background.sh NAME DEST 'COMMAND'    (COMMAND writes under "$BG_OUT")
# The first call copies src/ and kernels/ to a private state folder (a later call's copy of the working tree cannot
# change what the run imports), starts COMMAND there in its own process session (setsid), waits up to WAIT_S
# seconds, then copies what the run has written so far to DEST. Every later call with the same NAME attaches to the
# same run, waits again and copies again. The whole launching subshell's output is redirected: a process left
# holding run_all.sh's `| tee | tail` pipe would make the call wait for the whole run and be cut at its limit with
# nothing returned (tests/test_gpu_scripts.py fails on that form).
set -u
name=$1 dest=$2 cmd=$3
mkdir -p "$dest"
state=${BG_STATE:-/tmp/bg-$name}
t0=$(date +%s)
if [ ! -f "$state/pid" ]; then
  mkdir -p "$state/out"
  cp -r src kernels "$state/"
  py=$state/src${PYTHONPATH:+:$PYTHONPATH}; py=${py//$PWD\/src:/}  # relative src/ resolves inside $state
  (cd "$state" && BG_OUT="$state/out" PYTHONPATH="$py" PYTHONUNBUFFERED=1 setsid nohup bash -c \
    "$cmd > $state/run.log 2>&1; echo \$? > $state/rc" &) > /dev/null 2>&1 < /dev/null
  sleep 2; pgrep -f "$state/run.log" | head -1 > "$state/pid"
  echo "started the $name run (pid $(cat "$state/pid")) from $state"
else
  echo "attached to the $name run (pid $(cat "$state/pid")), started earlier on this machine"
fi
while [ ! -f "$state/rc" ] && [ $(( $(date +%s) - t0 )) -lt "${WAIT_S:-500}" ]; do sleep 5; done
cp "$state/run.log" "$dest/$name.log" 2>/dev/null; cp -r "$state"/out/. "$dest/" 2>/dev/null
for part in "$state"/.out.*.part; do [ -d "$part" ] && cp -r "$part"/. "$dest/"; done  # a run not yet ended writes here
if [ -f "$state/rc" ]; then
  echo "$name run done: exit $(cat "$state/rc") after this call's $(( $(date +%s) - t0 ))s"
else
  echo "$name run still going after this call's $(( $(date +%s) - t0 ))s: call again at once (same command)"
fi
