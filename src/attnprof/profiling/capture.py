"""Run a variant under `torch.profiler`: warm-up first, then N steps each in its own `record_function` range.

Warm-up keeps one-off work (cuBLAS handle creation, Triton compilation, autotuning, lazy module loads) out of
the steps. Each profiled step is `attnprof.step.<i>`, so `trace.split_steps` can attribute every kernel to the
forward step that launched it. The trace is exported as Chrome JSON, which Perfetto and chrome://tracing open.
"""

from __future__ import annotations

import contextlib
import re
import sys
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from attnprof.profiling.trace import STEP_PREFIX
from attnprof.stderr import capture_fd2, noise_line


def capture(step_fn: Callable[[], object], trace_path: Path, *, device: str, steps: int = 5, warmup: int = 3) -> Path:
    """Profile `steps` calls of `step_fn` after `warmup` unprofiled ones; write the Chrome trace to `trace_path`."""
    cuda = device.startswith("cuda")
    for _ in range(warmup):
        step_fn()
    if cuda:
        torch.cuda.synchronize(device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with warnings.catch_warnings():
        # torch warns that events are cleared between profiler cycles; we export each trace before the next one.
        warnings.filterwarnings("ignore", message=".*Profiler clears events.*")
        _profile_steps(step_fn, trace_path, activities, steps=steps, cuda=cuda, device=device)
    return Path(trace_path)


def _profile_steps(step_fn, trace_path, activities, *, steps: int, cuda: bool, device: str) -> None:
    with _without_kineto_chatter(), profile(activities=activities, profile_memory=True, record_shapes=False) as prof:
        for i in range(steps):
            with record_function(f"{STEP_PREFIX}{i}"):
                step_fn()
        if cuda:
            torch.cuda.synchronize(device)
    trace_path = Path(trace_path)
    trace_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = trace_path.with_name(trace_path.name + ".part")
    prof.export_chrome_trace(str(tmp))
    tmp.replace(trace_path)


_CHATTER = re.compile(r"^(USDT|STAGE):\S+ \S+ \d+:\d+ \S+\.cpp:\d+\]")


@contextlib.contextmanager
def _without_kineto_chatter() -> Iterator[None]:
    """Kineto's C++ prints `USDT: … profiler_start` lines on fd 2 at every start and stop; keep everything else."""
    with capture_fd2() as lines:
        yield
    kept = [line for line in lines if not _CHATTER.match(line) and not noise_line(line, "profiler")]
    if kept:
        sys.stderr.write("\n".join(kept) + "\n")
