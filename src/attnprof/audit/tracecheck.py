"""What a Kineto trace says about attention, step by step: the audit for traces users recorded themselves.

Built on `profiling.trace` (reading, steps) and `profiling.classify` (name → role, backend): per step, the
kernels by role, the fused-attention backends found, and three smells the tutorial teaches to look for:
- a math fallback: GEMMs and a softmax with no fused attention kernel in the same step (also named directly when
  the CPU side shows `aten::_scaled_dot_product_attention_math`, SDPA's own math path);
- extra copies: copy kernels / device memcpys, with the out-of-place operators of the step that make them
  (`masked_fill` without the underscore, `clone`, `contiguous`);
- masks rebuilt every step: mask-building kernels in every step rather than once.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from attnprof.profiling.attribution import attribute
from attnprof.profiling.causes import UNEXPECTED_ROLES, explain
from attnprof.profiling.classify import ROLES, aten_name, classify_cpu
from attnprof.profiling.names import short_name
from attnprof.profiling.summary import step_hits
from attnprof.profiling.trace import Step, Trace

OUT_OF_PLACE = ("masked_fill", "clone", "contiguous")
SDPA_MATH_OP = "_scaled_dot_product_attention_math"


@dataclass
class StepReport:
    name: str
    kernels: int
    roles: dict[str, int]
    backends: list[str]
    math_fallback: str | None  # why this step looks like unfused attention, or None
    copies: list[str] = field(default_factory=list)  # copy kernel names
    out_of_place_ops: dict[str, int] = field(default_factory=dict)
    mask_builds: list[str] = field(default_factory=list)
    sdpa_calls: dict[str, int] = field(default_factory=dict)  # CPU-side SDPA backend ops → count
    causes: list[str] = field(default_factory=list)  # unexpected kernels with the cause from their launching op

    def to_json(self) -> dict:
        return {"name": self.name, "kernels": self.kernels, "roles": self.roles, "backends": self.backends,
                "math_fallback": self.math_fallback, "copies": self.copies, "out_of_place_ops": self.out_of_place_ops,
                "mask_builds": self.mask_builds, "sdpa_calls": self.sdpa_calls, "causes": self.causes}


@dataclass
class TraceReport:
    path: str
    on_gpu: bool
    steps: list[StepReport]
    notes: list[str]

    @property
    def backends(self) -> list[str]:
        return sorted({b for s in self.steps for b in s.backends})

    @property
    def mask_rebuilt_every_step(self) -> bool:
        return bool(self.steps) and all(s.mask_builds for s in self.steps)

    def to_json(self) -> dict:
        return {"path": self.path, "on_gpu": self.on_gpu, "steps": [s.to_json() for s in self.steps],
                "backends": self.backends, "math_fallback_steps": sum(bool(s.math_fallback) for s in self.steps),
                "mask_rebuilt_every_step": self.mask_rebuilt_every_step, "notes": self.notes}


def _sdpa_ops(step: Step) -> dict[str, int]:
    counts: Counter = Counter()
    for e in step.cpu_ops:
        op = aten_name(e.name)
        if op == SDPA_MATH_OP:
            counts["math"] += 1
        else:
            c = classify_cpu(e.name)
            if c.role == "fused_attention" and c.backend:
                counts[c.backend] += 1
    return dict(counts)


def analyze_step(step: Step, on_gpu: bool, origins: dict | None = None) -> StepReport:
    hits = step_hits(step, on_gpu, origins)
    causes = list(dict.fromkeys(f"{short_name(h.name)} ← {explain(h.name, h.role, h.origin).text()}"
                                for h in hits if h.role in UNEXPECTED_ROLES))
    roles = Counter(h.role for h in hits)
    backends = sorted({h.backend for h in hits if h.backend})
    sdpa = _sdpa_ops(step)
    math = None
    if sdpa.get("math"):
        math = f"SDPA ran its math path {sdpa['math']}× (aten::{SDPA_MATH_OP} on the CPU side)"
    elif roles["gemm"] >= 2 and roles["softmax"] and not roles["fused_attention"]:
        math = (f"{roles['gemm']} GEMM + {roles['softmax']} softmax kernel(s) and no fused attention kernel: "
                "attention computed unfused")
    elif roles["softmax"] and roles["fused_attention"]:
        math = (f"mixed: {roles['fused_attention']} fused attention kernel(s) but also {roles['softmax']} softmax "
                "kernel(s): some attention calls may be unfused")
    oop = Counter(aten_name(e.name) for e in step.cpu_ops if aten_name(e.name) in OUT_OF_PLACE)
    return StepReport(
        name=step.name, kernels=len(hits), roles={r: roles[r] for r in ROLES if roles[r]}, backends=backends,
        math_fallback=math, copies=[h.name for h in hits if h.role == "copy"], out_of_place_ops=dict(oop),
        mask_builds=[h.name for h in hits if h.role == "mask_build"], sdpa_calls=sdpa, causes=causes)


def analyze(trace: Trace) -> TraceReport:
    steps = trace.steps()
    on_gpu = trace.has_gpu
    notes = []
    if not on_gpu:
        notes.append("this trace has no GPU events (a CPU-only run, or the profiler was not given "
                     "ProfilerActivity.CUDA): the counts below are the CPU's aten ops")
    if len(steps) == 1 and steps[0].name == "whole trace":
        notes.append("no step ranges (record_function 'attnprof.step.N' or a profiler schedule's ProfilerStep#N): "
                     "the whole trace is treated as one step")
    origins = attribute(trace)  # every kernel → the aten op that launched it
    reports = [analyze_step(s, on_gpu, origins) for s in steps]
    if not any(r.kernels for r in reports):
        notes.append("no kernels or work ops inside the steps")
    return TraceReport(str(trace.path), on_gpu, reports, notes)
