"""A test module's `__main__` run as a child process under Triton's interpreter, its last stdout line read as JSON.

`@triton.jit` decides when the kernel module is imported whether it compiles or interprets, so the CPU tests of the
kernels run their cases in a child started with TRITON_INTERPRET=1 (one per test module, from a module-scoped
fixture) and assert on what it reports.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_child(script: str, *args: str, timeout: int = 900) -> dict:
    """Run `script` with `args` under the interpreter (src/ and tests/ importable) and return its report."""
    path = os.pathsep.join([str(ROOT / "src"), str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": path}
    done = subprocess.run([sys.executable, script, *args], capture_output=True, text=True, env=env, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])
