"""The device scripts' plumbing, checked on the CPU before device time is spent on it.

`scripts/gpu/background.sh` starts a run longer than one device call (the production-decode grid) and returns after
`WAIT_S` seconds, so the next call can re-attach to the run on the warm machine. `run_all.sh` pipes every script
through `tee | tail`: if any process the script leaves running holds that pipe, the call waits for the whole run
instead, is cut at the call's limit and returns nothing (two calls, ~1,400 s of device time, were lost that way).
A stand-in `python3` that sleeps plays the serve run here."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CALL = "bash scripts/gpu/background.sh grid \"$DEST\" 'python3 -m attnprof serve --out \"$BG_OUT\"' 2>&1 | tee /dev/null | tail -5"


@pytest.mark.skipif(not Path("/usr/bin/pgrep").exists() and not Path("/bin/pgrep").exists(), reason="no pgrep")
def test_background_run_left_going_does_not_hold_the_calls_pipe(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stand_in = bin_dir / "python3"
    stand_in.write_text("#!/bin/sh\nexec sleep 29.7\n")
    stand_in.chmod(0o755)
    state = tmp_path / "state"
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", DEST=str(tmp_path / "out"), WAIT_S="1",
               BG_STATE=str(state))
    t0 = time.monotonic()
    try:
        # the way run_all.sh calls a script: through a pipe that ends only when every writer has closed it
        done = subprocess.run(["bash", "-c", CALL], cwd=REPO, env=env, capture_output=True, text=True, timeout=25)
        took = time.monotonic() - t0
        assert "started the grid run" in done.stdout and "still going" in done.stdout, done.stdout + done.stderr
        assert took < 15, f"the call waited {took:.0f} s for the run it left going"
        again = subprocess.run(["bash", "-c", CALL], cwd=REPO, env=env, capture_output=True, text=True, timeout=25)
        assert "attached to the grid run" in again.stdout, again.stdout + again.stderr
    finally:
        subprocess.run(["pkill", "-f", f"{state}/run.log"], check=False)  # the run's command line names it
        subprocess.run(["pkill", "-f", "sleep 29.7"], check=False)
