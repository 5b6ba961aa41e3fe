"""Where a model step's time goes: the attention share of prefill and decode steps, from the PyTorch profiler.

Every step runs inside `record_function(STEP_RANGE)` and the model's attention function inside
`record_function(ATTENTION_RANGE)` (`attention_scope`, whatever the implementation); on CUDA the GPU kernels
launched inside each range are read from the exported Kineto trace (correlation ids, so Triton kernels launched
through the driver API count too) and classified by role; on the CPU the aten ops under each range are.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
from torch.profiler import ProfilerActivity, profile, record_function

ATTENTION_RANGE = "attnprof::attention"
STEP_RANGE = "attnprof::serve_step"


@dataclass(frozen=True)
class Share:
    """Where one model step's time went. Milliseconds per step; `busy_ms` is GPU kernel time (CPU op time on CPU)."""

    attention_ms: float
    busy_ms: float
    roles: dict[str, float] = field(default_factory=dict)  # attention kernels by role → ms per step
    backends: tuple[str, ...] = ()
    basis: str = "gpu-kernels"  # "gpu-kernels" | "cpu-ops"
    # host (CPU) time spent inside the model's attention function per step, under the profiler: when an
    # implementation is slow although its attention kernels are fast, this is where the time went
    attention_host_ms: float | None = None
    # wall time of the profiled step itself (profiler overhead included): tells whether the slowness of the timed
    # steps was reproduced in the profiled ones
    step_wall_ms: float | None = None
    # `production_share` only: the kernels (CPU ops) that took the most time per step, short names → ms
    kernels: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"attention_ms": self.attention_ms, "busy_ms": self.busy_ms, "roles": self.roles,
                "backends": list(self.backends), "basis": self.basis, "attention_host_ms": self.attention_host_ms,
                "step_wall_ms": self.step_wall_ms, "kernels": self.kernels}



# ---------------------------------------------------------------------------------------------- attention scope --

@contextlib.contextmanager
def attention_scope(model) -> Iterator[None]:
    """Run the model's attention function inside `record_function(ATTENTION_RANGE)`, whatever its implementation.

    transformers looks the function up by `config._attn_implementation` on every forward; a local override on the
    shared `ALL_ATTENTION_FUNCTIONS` instance wraps it without changing the name (so the mask it builds is the same).
    """
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    name = model.config._attn_implementation
    modeling = sys.modules[type(model).__module__]
    inner = ALL_ATTENTION_FUNCTIONS.get_interface(name, getattr(modeling, "eager_attention_forward", None))
    if inner is None:
        raise RuntimeError(f"no attention function for {name!r} in {modeling.__name__}")

    def scoped(*args, **kwargs):
        with record_function(ATTENTION_RANGE):
            return inner(*args, **kwargs)

    local = ALL_ATTENTION_FUNCTIONS._local_mapping
    previous = local.get(name)
    local[name] = scoped
    try:
        yield
    finally:
        if previous is None:
            local.pop(name, None)
        else:
            local[name] = previous


def _subtree(event) -> Iterator:
    yield event
    for child in event.cpu_children:
        yield from _subtree(child)


def _cpu_leaves(event, parents: tuple[str, ...] = ()) -> Iterator[tuple[str, tuple[str, ...], float]]:
    """(op, parents, ms) for the ops that do work under `event`; a fused attention op counts whole."""
    from attnprof.profiling.classify import classify_cpu, is_metadata

    for child in event.cpu_children:
        name = child.name
        if is_metadata(name):
            continue
        role = classify_cpu(name, parents)
        working = [c for c in child.cpu_children if not is_metadata(c.name)]
        if role.role == "fused_attention" or not working:
            yield name, parents, child.cpu_time_total / 1e3
        else:
            yield from _cpu_leaves(child, parents + (name,))


def profile_share(step: Callable[[], object], model, device: str, *, steps: int = 2) -> Share:
    """Profile `steps` calls of `step` (already warmed up) and split each into attention / the rest."""

    def run() -> None:
        for _ in range(steps):
            with record_function(STEP_RANGE):
                step()

    return profiled_share(run, model, device, steps)


def profiled_share(run: Callable[[], object], model, device: str, steps: int) -> Share:
    """Run `run` (which marks `steps` STEP_RANGE ranges) under the profiler with the attention scoped, and split
    each step into attention / the rest: GPU kernels on CUDA, CPU ops on the CPU."""
    cuda = device.startswith("cuda")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with attention_scope(model), profile(activities=activities) as prof:
        run()
        if cuda:
            torch.cuda.synchronize(device)
    return _gpu_share(prof, steps) if cuda else _cpu_share(prof)


def _cpu_share(prof) -> Share:
    """CPU op time inside the step ranges, and inside the attention ranges within them, by role."""
    from attnprof.profiling.classify import classify_cpu

    cpu_events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CPU]
    step_events = [e for e in cpu_events if e.name == STEP_RANGE]
    roles: dict[str, float] = {}
    backends: set[str] = set()
    attention = busy = 0.0
    for s in step_events:
        busy += s.cpu_time_total / 1e3
        for a in (e for e in _subtree(s) if e.name == ATTENTION_RANGE):
            attention += a.cpu_time_total / 1e3
            for name, parents, ms in _cpu_leaves(a):
                c = classify_cpu(name, parents)
                roles[c.role] = roles.get(c.role, 0.0) + ms
                if c.backend:
                    backends.add(c.backend)
    n = max(1, len(step_events))
    return Share(attention_ms=attention / n, busy_ms=busy / n,
                 roles={k: v / n for k, v in sorted(roles.items())}, backends=tuple(sorted(backends)),
                 basis="cpu-ops", attention_host_ms=attention / n, step_wall_ms=busy / n)


def _gpu_share(prof, steps: int) -> Share:
    """GPU kernels by launch time inside the step and attention ranges, read from the exported Kineto trace.

    The profiler's event tree links only runtime-API launches to their CPU op; Triton kernels (our stage-four
    kernel, compiled flex) launch through the driver API and would be missed, so the trace's correlation ids
    are used instead, as `attnprof stages` does.
    """
    from attnprof.profiling.classify import classify_gpu
    from attnprof.profiling.trace import cpu_ranges, gpu_work_in_ranges

    trace = _exported_trace(prof)
    busy = sum(k.dur for work in gpu_work_in_ranges(trace, STEP_RANGE) for k in work) / 1e3
    roles: dict[str, float] = {}
    backends: set[str] = set()
    attention = 0.0
    for work in gpu_work_in_ranges(trace, ATTENTION_RANGE, within=STEP_RANGE):
        for k in work:
            c = classify_gpu(k.name)
            roles[c.role] = roles.get(c.role, 0.0) + k.dur / 1e3
            attention += k.dur / 1e3
            if c.backend:
                backends.add(c.backend)
    host = sum(e.dur for e in cpu_ranges(trace, ATTENTION_RANGE, within=STEP_RANGE)) / 1e3
    wall = sum(e.dur for e in cpu_ranges(trace, STEP_RANGE)) / 1e3
    n = max(1, steps)
    return Share(attention_ms=attention / n, busy_ms=busy / n, roles={k: v / n for k, v in sorted(roles.items())},
                 backends=tuple(sorted(backends)), basis="gpu-kernels", attention_host_ms=host / n,
                 step_wall_ms=wall / n)


# ------------------------------------------------------------------------------------------- production loop --

TOP_KERNELS = 12


def production_share(short: Callable[[], object], long: Callable[[], object], steps: int, device: str) -> Share | None:
    """Where a decode step of the production loop goes, as the loop is timed: `short` and `long` are two whole
    `generate` calls that differ by `steps` decode steps (the same prompt, so the same prefill). Each runs once under
    the profiler; a kernel's time per step is the difference of its totals over `steps`. Inside a CUDA graph there
    are no CPU ranges to attribute a kernel to the attention function (`profiled_share` needs them), so kernels are
    told by name (`classify_gpu`): attention is the fused attention kernels (an eager attention's matmuls count as
    gemm). On the CPU the same with the aten ops' self time (`basis` "cpu-ops"). None when the profiler saw no work
    in the difference (a profiler without kernel records of graph replays)."""
    cuda = device.startswith("cuda")
    a, b = _work_by_name(short, cuda, device), _work_by_name(long, cuda, device)
    per = {n: (b.get(n, 0.0) - a.get(n, 0.0)) / max(1, steps) for n in set(a) | set(b)}
    per = {n: ms for n, ms in per.items() if ms > 0}
    if not per:
        return None
    from attnprof.profiling.names import short_name

    roles: dict[str, float] = {}
    backends: set[str] = set()
    attention = 0.0
    for name, ms in per.items():
        c = _role_by_name(name, cuda)
        roles[c.role] = roles.get(c.role, 0.0) + ms
        if c.role == "fused_attention":
            attention += ms
            if c.backend:
                backends.add(c.backend)
    top: dict[str, float] = {}
    for name, ms in sorted(per.items(), key=lambda kv: -kv[1])[:TOP_KERNELS]:
        label = short_name(name)
        top[label] = top.get(label, 0.0) + ms
    return Share(attention_ms=attention, busy_ms=sum(per.values()), roles=dict(sorted(roles.items())),
                 backends=tuple(sorted(backends)), basis="gpu-kernels" if cuda else "cpu-ops", kernels=top)


def _role_by_name(name: str, cuda: bool):
    from attnprof.backends import kernel_backend
    from attnprof.profiling.classify import Classified, classify_cpu, classify_gpu

    if cuda:
        return classify_gpu(name)
    c = classify_cpu(name)
    if c.role == "other" and not name.startswith("aten::") and (backend := kernel_backend(name)) is not None:
        return Classified("fused_attention", backend)  # a custom op named for attention (our kernel's)
    return c


def _work_by_name(run: Callable[[], object], cuda: bool, device: str) -> dict[str, float]:
    """ms per kernel name (CUDA: GPU kernels, copies and memsets from the Kineto trace, graph replays included) or
    per CPU op (self time, metadata ops left out) over one call of `run`."""
    from attnprof.profiling.classify import is_metadata
    from attnprof.profiling.trace import GPU_CATEGORIES

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        run()
        if cuda:
            torch.cuda.synchronize(device)
    totals: dict[str, float] = {}
    if cuda:
        for e in _exported_trace(prof).events:
            if e.cat in GPU_CATEGORIES:
                totals[e.name] = totals.get(e.name, 0.0) + e.dur / 1e3
        return totals
    for avg in prof.key_averages():
        if not is_metadata(avg.key) and avg.self_cpu_time_total > 0:
            totals[avg.key] = totals.get(avg.key, 0.0) + avg.self_cpu_time_total / 1e3
    return totals


def _exported_trace(prof):
    """The profiler's Kineto trace, exported and read back (`profiling.trace`): GPU kernels with their correlation
    ids, which the profiler's own event tree links only for runtime-API launches."""
    import tempfile
    from pathlib import Path

    from attnprof.profiling.trace import load_trace

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "share.json"
        prof.export_chrome_trace(str(path))
        return load_trace(path)

