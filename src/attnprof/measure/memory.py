"""Peak memory: the one measurement of "how much did this call need", for every consumer.

Extra memory is the most allocated while a call runs above what was allocated before it (the inputs, the weights).
On CUDA that is `max_memory_allocated` after `reset_peak_memory_stats`, minus `memory_allocated` before. The CPU
allocator keeps no peak, so there the profiler's memory events of one profiled step are read instead (the rise of
'Total Allocated' within the step, `profiling.summary`): they see every torch allocation.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from attnprof.profiling.capture import capture
from attnprof.profiling.summary import summarize
from attnprof.profiling.trace import load_trace


@dataclass
class CudaPeak:
    """Filled in when the `cuda_peak` block ends: MiB above the start, and the device's whole peak in MiB."""

    extra_mib: float | None = None
    total_mib: float | None = None


@contextlib.contextmanager
def cuda_peak(device: str, *, empty_cache: bool = False) -> Iterator[CudaPeak]:
    """Peak CUDA memory of the block (synchronised on both ends); nothing is measured on other devices."""
    peak = CudaPeak()
    if not device.startswith("cuda"):
        yield peak
        return
    torch.cuda.synchronize(device)
    if empty_cache:
        torch.cuda.empty_cache()
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    yield peak
    torch.cuda.synchronize(device)
    top = torch.cuda.max_memory_allocated(device)
    peak.extra_mib, peak.total_mib = (top - before) / 2**20, top / 2**20


def peak_mib(fn: Callable[[], object], device: str) -> tuple[float | None, str | None]:
    """Extra memory of one `fn()` call in MiB, and the reason when it is unknown (see the module docstring)."""
    if device.startswith("cuda"):
        with cuda_peak(device) as peak:
            out = fn()
            del out
        return peak.extra_mib, None
    with tempfile.TemporaryDirectory(prefix="attnprof-mem-") as tmp:
        path = capture(fn, Path(tmp) / "mem.json", device=device, steps=1, warmup=0)
        mib = summarize(load_trace(path)).peak_alloc_mib
    return cpu_peak_or_reason(mib)


def cpu_peak_or_reason(mib: float | None) -> tuple[float | None, str | None]:
    """A profiled step's CPU peak, or why there is none."""
    return (mib, None) if mib is not None else (None, "the CPU profiler recorded no allocation events")
