"""Wall latency of one call: device events on CUDA, `perf_counter` on the CPU, warm-up first, quantiles out.

Device work is asynchronous, so a host clock around a CUDA call measures the launch, not the kernel: on CUDA each
repetition is bracketed by `torch.cuda.Event`s and the GPU is synchronised once at the end. `flush_l2` writes a
buffer larger than the L2 cache between repetitions so a small workload is not timed from cache.

`cuda_graph=True` times replays of the call captured once in a CUDA graph: the GPU time of its kernels, without
the host's cost of launching them (which, for a small call whose launch takes longer than its kernels, is what
plain events measure). Where capture fails the call is timed plainly and the method says so.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Timing:
    """Milliseconds per call over `reps` repetitions."""

    p20: float
    p50: float
    p80: float
    reps: int
    method: str  # "cuda-events" | "cuda-graph" | "cuda-events (no graph: <why>)" | "perf_counter"

    def to_json(self) -> dict:
        return {"p20": self.p20, "p50": self.p50, "p80": self.p80, "reps": self.reps, "method": self.method}


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile, q in [0, 100] (numpy's default, `statistics.quantiles`' inclusive method);
    NaN for no values. The one percentile of the project: timings, inter-token latencies, TTFT."""
    if not values:
        return math.nan
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def quantiles(samples: list[float]) -> tuple[float, float, float]:
    """p20, p50, p80."""
    return percentile(samples, 20), percentile(samples, 50), percentile(samples, 80)


# The host clock of CPU timings (seconds), read through this module attribute so that a test can plant a delay in
# what is measured without sleeping: a planted sleep competes with the machine's load, a planted clock offset does not.
clock: Callable[[], float] = time.perf_counter

_FLUSH: dict[str, torch.Tensor] = {}


def flush_l2(device: str) -> None:
    """Overwrite the L2 cache (twice its size, or 256 MiB when unknown)."""
    if not device.startswith("cuda"):
        return
    if device not in _FLUSH:
        props = torch.cuda.get_device_properties(torch.device(device))
        size = 2 * getattr(props, "L2_cache_size", 128 * 2**20) or 256 * 2**20
        _FLUSH[device] = torch.empty(size, dtype=torch.uint8, device=device)
    _FLUSH[device].zero_()


def captured(fn: Callable[[], object], device: str) -> tuple[Callable[[], object] | None, str]:
    """`fn` captured in a CUDA graph (warmed on a side stream first, as capture needs): (replay, "") or
    (None, why not)."""
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    try:
        with torch.cuda.stream(side):
            fn()
        torch.cuda.current_stream(device).wait_stream(side)
        with torch.cuda.graph(graph):
            fn()
    except RuntimeError as e:
        torch.cuda.synchronize(device)
        return None, str(e).splitlines()[0][:120] if str(e) else type(e).__name__
    return graph.replay, ""


def time_call(fn: Callable[[], object], device: str, *, warmup: int = 3, reps: int = 20,
              l2_flush: bool = False, cuda_graph: bool = False) -> Timing:
    """Time `fn()` `reps` times after `warmup` calls (as CUDA-graph replays with `cuda_graph`, on CUDA)."""
    for _ in range(warmup):
        fn()
    if device.startswith("cuda"):
        method = "cuda-events"
        if cuda_graph:
            replay, why = captured(fn, device)
            fn, method = (replay, "cuda-graph") if replay is not None else (fn, f"cuda-events (no graph: {why})")
        torch.cuda.synchronize(device)
        stream = torch.cuda.current_stream(device)  # `device`'s own, also when it is not the current device (cuda:1)
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        for start, end in zip(starts, ends, strict=True):
            if l2_flush:
                flush_l2(device)
            start.record(stream)
            fn()
            end.record(stream)
        torch.cuda.synchronize(device)
        samples = [s.elapsed_time(e) for s, e in zip(starts, ends, strict=True)]
    else:
        samples = []
        for _ in range(reps):
            t0 = clock()
            fn()
            samples.append((clock() - t0) * 1e3)
        method = "perf_counter"
    p20, p50, p80 = quantiles(samples)
    return Timing(p20=p20, p50=p50, p80=p80, reps=reps, method=method)
