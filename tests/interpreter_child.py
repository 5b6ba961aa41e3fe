"""A test module's `__main__` run as a child process under Triton's interpreter, its last stdout line read as JSON.

`@triton.jit` decides when the kernel module is imported whether it compiles or interprets, so the CPU tests of the
kernels run their cases in a child started with TRITON_INTERPRET=1 (one per test module, from a module-scoped
fixture) and assert on what it reports.

The children are most of `make test`'s time and need nothing from the tests before them, so `prelaunch` (called by
conftest.py once the tests are collected, for every selected module that sets `INTERPRETER_CHILD = True`) starts
them one at a time in the background while the other tests run on the main process: the second core works too. A
fixture whose child has not started yet runs it itself at once; one whose child is running or done waits for it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_JOBS: dict[tuple, Future] = {}
_PROCS: list[subprocess.Popen] = []
_POOL: ThreadPoolExecutor | None = None
_LOCK = threading.Lock()


def _key(script: str, args: tuple[str, ...]) -> tuple:
    return (str(Path(script).resolve()), *args)


def _run(script: str, *args: str, timeout: int = 900) -> dict:
    path = os.pathsep.join([str(ROOT / "src"), str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": path}
    with subprocess.Popen([sys.executable, script, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env=env) as proc:
        with _LOCK:
            _PROCS.append(proc)
        try:
            out, err = proc.communicate(timeout=timeout)
        finally:
            proc.kill()
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


def run_child(script: str, *args: str, timeout: int = 900) -> dict:
    """Run `script` with `args` under the interpreter (src/ and tests/ importable) and return its report: the
    prelaunched run's when there is one that has started, else a run now."""
    job = _JOBS.pop(_key(script, args), None)
    if job is not None and not job.cancel():  # started (or finished) in the background: its result
        return job.result()
    return _run(script, *args, timeout=timeout)


def child_report(script: str):
    """For a module-scoped fixture (`yield from child_report(__file__)`): the child's report, and after the module's
    tests the folder the child made for its files (`report["tmp"]`) removed."""
    report = run_child(script)
    yield report
    shutil.rmtree(report["tmp"], ignore_errors=True)


def prelaunch(scripts: list[str]) -> None:
    """Start the children of `scripts` (no arguments) one after another in the background."""
    global _POOL
    if not scripts:
        return
    _POOL = ThreadPoolExecutor(max_workers=1, thread_name_prefix="interpreter-child")
    for script in scripts:
        _JOBS[_key(script, ())] = _POOL.submit(_run, script)


def stop() -> None:
    """Cancel the children no test asked for and kill the running ones (the session is over)."""
    for job in _JOBS.values():
        job.cancel()
    _JOBS.clear()
    with _LOCK:
        for proc in _PROCS:
            if proc.poll() is None:
                proc.kill()
    if _POOL is not None:
        _POOL.shutdown(wait=False, cancel_futures=True)
