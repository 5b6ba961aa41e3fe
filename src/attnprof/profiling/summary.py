"""From steps of a trace to what `stages` and `trace` report: kernels per step with roles, times and memory.

On the GPU the "kernels" of a step are its kernels, memcpys and memsets. On the CPU they are the aten ops that do
work (see `classify`): a fused attention op counts once and hides its children; another op counts when none of its
descendants does work; views and allocations are not counted.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from attnprof.profiling.attribution import Origin, attribute
from attnprof.profiling.causes import Cause, explain
from attnprof.profiling.classify import classify_cpu, classify_gpu, is_metadata, is_quantize_op
from attnprof.profiling.names import short_name
from attnprof.profiling.trace import Event, Step, Trace


@dataclass(frozen=True)
class Hit:
    """One kernel (or CPU work op) in one step."""

    name: str
    role: str
    backend: str | None
    dur_us: float
    origin: Origin | None = None  # the aten ops that launched it (attribution)


@dataclass(frozen=True)
class KernelRow:
    name: str
    role: str
    backend: str | None
    per_step: float
    time_us: float  # per step
    origin: Origin | None = None

    @property
    def short(self) -> str:
        return short_name(self.name)

    @property
    def op(self) -> str | None:
        return self.origin.op if self.origin else None

    @property
    def cause(self) -> Cause:
        return explain(self.name, self.role, self.origin)

    def to_json(self) -> dict:
        return {"name": self.name, "short": self.short, "role": self.role, "backend": self.backend,
                "per_step": self.per_step, "time_us": self.time_us,
                "launched_by": self.origin.to_json() if self.origin else None, "cause": self.cause.to_json()}


@dataclass(frozen=True)
class Summary:
    steps: int
    on_gpu: bool
    kernels: list[KernelRow]
    kernels_per_step: float
    gpu_ms_per_step: float | None
    cpu_ms_per_step: float
    peak_alloc_mib: float | None  # from the profiler's memory events, above the step's starting allocation

    @property
    def backends(self) -> list[str]:
        return sorted({k.backend for k in self.kernels if k.backend})

    def per_role(self) -> dict[str, float]:
        out: dict[str, float] = defaultdict(float)
        for k in self.kernels:
            out[k.role] += k.per_step
        return dict(out)


def step_hits(step: Step, on_gpu: bool, origins: dict[int, Origin] | None = None) -> list[Hit]:
    """The kernels of one step; with `origins` (`attribution.attribute`), each with the ops that launched it."""
    origins = origins or {}
    if on_gpu:
        return [Hit(e.name, *_gpu_role(e, origins.get(id(e))), e.dur, origins.get(id(e)))
                for e in sorted(step.gpu, key=lambda e: e.ts)]
    return _cpu_hits(step.cpu_ops, origins)


def _gpu_role(e: Event, origin: Origin | None) -> tuple[str, str | None]:
    """By the kernel's name; a kernel launched inside a quantize op (`attnprof::quantize_fp8`: an elementwise
    kernel named for its arithmetic) is that op's `quantize` step."""
    c = classify_gpu(e.name)
    if c.role != "fused_attention" and origin is not None and any(is_quantize_op(op) for op in origin.chain):
        return "quantize", None
    return c.role, c.backend


def _cpu_hits(ops: list[Event], origins: dict[int, Origin]) -> list[Hit]:
    """Work ops of one step on the CPU, from the nesting of cpu_op ranges (same thread assumed)."""
    ops = sorted(ops, key=lambda e: (e.ts, -e.dur))
    hits: list[Hit] = []
    stack: list[tuple[Event, list]] = []  # (op, [does any descendant do work?])

    def close(until: float) -> None:
        while stack and stack[-1][0].end <= until:
            op, flag = stack.pop()
            parents = tuple(p.name for p, _ in stack)
            if not flag[0] and not is_metadata(op.name) and not _inside_fused(parents):
                c = classify_cpu(op.name, parents)
                hits.append(Hit(op.name, c.role, c.backend, op.dur, origins.get(id(op))))
                flag[0] = True
            if flag[0] and stack:
                stack[-1][1][0] = True

    for op in ops:
        close(op.ts)
        stack.append((op, [False]))
        c = classify_cpu(op.name)
        if c.role == "fused_attention" and not _inside_fused(tuple(p.name for p, _ in stack[:-1])):
            hits.append(Hit(op.name, c.role, c.backend, op.dur, origins.get(id(op))))
            stack[-1][1][0] = True
    close(float("inf"))
    return sorted(hits, key=lambda h: h.name)


def _inside_fused(parents: tuple[str, ...]) -> bool:
    return any(classify_cpu(p).role == "fused_attention" for p in parents)


def summarize(trace: Trace, steps: list[Step] | None = None) -> Summary:
    steps = trace.steps() if steps is None else steps
    on_gpu = trace.has_gpu
    n = max(1, len(steps))
    # (name, role, backend, origin) → [count, total µs]: one name can play two roles, or come from two ops
    counts: dict[tuple, list] = {}
    origins = attribute(trace)
    gpu_us = 0.0
    for step in steps:
        for h in step_hits(step, on_gpu, origins):
            row = counts.setdefault((h.name, h.role, h.backend, h.origin), [0, 0.0])
            row[0] += 1
            row[1] += h.dur_us
            gpu_us += h.dur_us
    kernels = [KernelRow(name, role, backend, count / n, total / n, origin)
               for (name, role, backend, origin), (count, total) in counts.items()]
    kernels.sort(key=lambda k: -k.time_us)
    return Summary(
        steps=len(steps), on_gpu=on_gpu, kernels=kernels,
        kernels_per_step=sum(k.per_step for k in kernels),
        gpu_ms_per_step=gpu_us / n / 1e3 if on_gpu else None,
        cpu_ms_per_step=sum(s.dur for s in steps) / n / 1e3,
        peak_alloc_mib=_peak_mib(steps),
    )


def _peak_mib(steps: list[Step]) -> float | None:
    """Largest rise of 'Total Allocated' within a step above its first reading (CPU memory events)."""
    best = None
    for step in steps:
        totals = [e.args.get("Total Allocated") for e in sorted(step.memory, key=lambda e: e.ts)
                  if e.args.get("Device Type", 0) == 0 and isinstance(e.args.get("Total Allocated"), (int, float))]
        sizes = [e.args.get("Bytes") for e in sorted(step.memory, key=lambda e: e.ts)
                 if e.args.get("Device Type", 0) == 0 and isinstance(e.args.get("Bytes"), (int, float))]
        if not totals:
            continue
        start = totals[0] - (sizes[0] if sizes and sizes[0] > 0 else 0)
        rise = (max(totals) - start) / 2**20
        best = rise if best is None else max(best, rise)
    return best
