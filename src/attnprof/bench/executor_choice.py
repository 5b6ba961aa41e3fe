"""`--ray` to an executor: in this process when absent, else Ray. Its own module because it names both executors, and
`ray_executor.py` builds on `executor.py` (Job, Outcome): kept apart, neither imports the other back."""

from __future__ import annotations

from attnprof.bench.executor import Executor, InProcess
from attnprof.bench.ray_executor import RayExecutor
from attnprof.interrupts import take_sigterm_back


def make_executor(ray_address: str | None, *, max_retries: int = 2) -> Executor:
    """`None` → in-process; `"local"` → a Ray runtime started here; `"auto"` / `host:port` → a running cluster."""
    if ray_address is None:
        return InProcess()
    executor = RayExecutor.connect(None if ray_address == "local" else ray_address, max_retries=max_retries)
    take_sigterm_back()  # `ray.init` sets its own SIGTERM handler (sys.exit), which would skip keeping the rows
    return executor
