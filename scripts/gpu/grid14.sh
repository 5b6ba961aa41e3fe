#!/usr/bin/env bash
# Session 14, issue 30 item 1: production decode over batch 1/4/16/64/128 x context 1k/8k/32k in ONE `attnprof serve`
# run. The run takes longer than one 10-minute device call (each row compiles the model anew), so it runs in its own
# process session (setsid) on the warm machine, from a private copy of the tree (a later call's copy of the working
# tree cannot change what it imports). Every call of this script (re)attaches: it starts the run when none was
# started on this machine, waits for it up to WAIT_S seconds, then copies what the run has written so far.
#   WAIT_S=500 EACH_TIMEOUT=530 bash scripts/gpu/run_all.sh grid14   # call 1; call 2 (at once): the same command
# (the call's 600 s must also hold the wheel install and the packing). Sessions 15 and 16 lost a starting call each
# to its 600 s limit: the backgrounded `cd && setsid ...` subshell kept run_all.sh's `| tee | tail` pipe open, so
# the call waited for the whole grid; the redirection now covers that subshell (tests/test_gpu_scripts.py fails on the old form).
set -u
dest="${OUT:-/tmp/out}/grid14"; mkdir -p "$dest"
state=${GRID14_STATE:-/tmp/grid14}  # s14a.sh and s16a.sh look here; tests/test_gpu_scripts.py sets its own
t0=$(date +%s)
if [ ! -f "$state/pid" ]; then
  mkdir -p "$state"
  cp -r src kernels "$state/"  # what the run imports: attnprof and the kernel repo
  py=$state/src${PYTHONPATH:+:$PYTHONPATH}; py=${py//$PWD\/src:/}  # the private copy, not the call's tree
  (cd "$state" && PYTHONPATH="$py" PYTHONUNBUFFERED=1 setsid nohup bash -c \
    "python3 -m attnprof serve --model llama-1b --dtype bf16 --loop production --mode decode --impls sdpa,kernel \
      --decode-batch 1,4,16,64,128 --decode-context 1024,8192,32768 --new-tokens 32 --no-share --out $state/out \
      --stem production-decode-grid --json > $state/serve.log 2>&1; echo \$? > $state/rc" &) \
    > /dev/null 2>&1 < /dev/null  # the whole launching subshell, not only setsid, leaves run_all's tee pipe
  sleep 2; pgrep -f "attnprof serve" | head -1 > "$state/pid"
  echo "started the grid run (pid $(cat "$state/pid")) from $state"
else
  echo "attached to the grid run (pid $(cat "$state/pid")), started earlier on this machine"
fi
while [ ! -f "$state/rc" ] && [ $(( $(date +%s) - t0 )) -lt "${WAIT_S:-575}" ]; do sleep 5; done
cp -r "$state/serve.log" "$state"/out/. "$dest/" 2>/dev/null
for part in "$state"/.out.*.part; do [ -d "$part" ] && cp -r "$part"/. "$dest/"; done  # a run not yet ended writes here
if [ -f "$state/rc" ]; then
  echo "grid run done: exit $(cat "$state/rc") after this call's $(( $(date +%s) - t0 ))s"
  grep -E "^ (sdpa|kernel) " "$state/serve.log" | head -40; grep -iE "recompile|gains" "$state/serve.log" | head -5
else
  echo "grid run still going after this call's $(( $(date +%s) - t0 ))s: call again at once (same command)"
  tr '\r' '\n' < "$state/serve.log" | grep -E "decode .* \(production\)" | tail -2
fi
