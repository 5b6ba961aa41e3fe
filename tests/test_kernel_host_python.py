"""kernels/flash-triton/host_python.py: the per-call Python before Triton's launcher, timed on the CPU. It runs, prints
one row per entry point, and refuses to run without the interpreter with one line and exit 2."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "kernels" / "flash-triton" / "host_python.py"


def _run(interpret: bool) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    return subprocess.run([sys.executable, str(SCRIPT), "--calls", "20"], capture_output=True, text=True, env=env,
                          timeout=300)


def test_times_each_entry_point():
    done = _run(True)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [line for line in done.stdout.splitlines() if line.startswith(("prefill", "decode"))]
    assert len(rows) == 3 and all(float(r.split()[-1]) > 0 for r in rows), done.stdout


def test_needs_the_interpreter():
    done = _run(False)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
