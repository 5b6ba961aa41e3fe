"""The main job: the tutorial's stages on one workload, each run under the profiler and the dispatch watcher.

For every variant, one `run()` (attnprof.run): does it accept the workload (else `rejected` with the reason); one
call under the SDPA watcher (which backend really ran) and against the fp64 oracle (valid rows; rows that see no
key are compared apart, as everywhere); peak memory above the inputs; a profiled run of N steps (kernels per step,
their roles, GPU and CPU time per step, a Chrome trace per stage); and wall latency over at least 20 timed calls.
One stage failing (out of memory, an error, a NaN output) is recorded and the others still run. The sentences
about these results (stage-to-stage deltas, dispatch advice) are the renderer's: `report/stages_report.py`.
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from attnprof.audit import explain
from attnprof.bench.flops import tflops
from attnprof.oracle.agreement import Reference
from attnprof.oracle.gate import Gate, Rule
from attnprof.profiling.causes import UNEXPECTED_ROLES
from attnprof.profiling.summary import Summary
from attnprof.run import Run, run
from attnprof.variants import Variant
from attnprof.workload import Inputs, Workload


@dataclass(frozen=True)
class StageResult:
    """One stage: its `Run`, and what `stages` reads from it (backend, unexpected kernels, SDPA fallbacks)."""

    run: Run
    backend: str | None = None
    tflops: float | None = None
    trace: str | None = None  # relative to the report folder
    unexpected: tuple[str, ...] = ()
    # SDPA calls that did not get this device's fastest backend: what ran, what was preferred, and why not
    dispatch: tuple[dict, ...] = ()
    # plain PyTorch's norm-relative error vs fp64 in the same dtype (the verify rule's baseline); None: not measured
    baseline_rel: float | None = None
    wall_s: float | None = None  # how long the whole stage took (warm-up, compile, oracle, profile, timing)

    def __getattr__(self, name: str):
        """variant, family, status, reason, summary, timing, peak_mib: the `Run`'s own."""
        if name == "run":  # not set yet (copy, unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.run, name)

    @property
    def max_rel_err(self) -> float | None:
        return self.run.agreement.norm_rel if self.run.agreement else None

    @property
    def lossy_factor(self) -> float | None:
        """How many times plain PyTorch's error this stage's is, when the gate called it lossy; else None."""
        if self.status.value != "lossy" or self.max_rel_err is None or not self.baseline_rel:
            return None
        return self.max_rel_err / self.baseline_rel

    @property
    def max_abs_err(self) -> float | None:
        return self.run.agreement.max_abs if self.run.agreement else None

    def to_json(self) -> dict:
        s = self.summary
        return {
            "variant": self.variant, "family": self.family, "status": self.status.value, "reason": self.reason,
            "kernels_per_step": s.kernels_per_step if s else None,
            "kernels": [k.to_json() for k in s.kernels] if s else [],
            "latency_ms": self.timing.to_json() if self.timing else None,
            "gpu_ms_per_step": s.gpu_ms_per_step if s else None,
            "cpu_ms_per_step": s.cpu_ms_per_step if s else None,
            "tflops": self.tflops, "peak_mib": self.peak_mib,
            "max_rel_err": self.max_rel_err, "max_abs_err": self.max_abs_err,
            "backend": self.backend, "trace": self.trace, "unexpected": list(self.unexpected),
            "dispatch": list(self.dispatch), "baseline_rel_err": self.baseline_rel, "lossy": self.lossy_factor,
            "wall_s": self.wall_s,
        }


def run_stage(variant: Variant, workload: Workload, inputs: Inputs, reference: Reference, out_dir: Path, *,
              steps: int = 5, reps: int = 20, gate: Gate | None = None) -> StageResult:
    trace = out_dir / "traces" / f"{_safe(variant.name)}.json"
    r = run(variant, workload, inputs, reference=reference, gate=gate, watch=True, profile=trace, steps=steps,
            memory=True, reps=reps, warmup=2)
    base = gate.baseline.norm_rel if gate is not None else None
    if not r.status.ran:
        return StageResult(r, trace=_relative(r.trace, out_dir), baseline_rel=base)
    if variant.family == "third-party":
        r = _own_backend(r, variant.backend)
    watched = sorted({c.backend for c in r.calls})  # what SDPA really dispatched; else fused kernels by name
    summary_backends = r.summary.backends if r.summary else []
    backend = ",".join(watched or summary_backends) or variant.backend
    if variant.family == "third-party":  # the library that ran (`sageattention 1.0.6`), never our `kernel` label
        backend = ",".join([variant.backend, *(b for b in watched if b != "kernel")])
    return StageResult(r, backend=backend,
                       tflops=tflops(workload, r.timing.p50 / 1e3) if r.timing else None,
                       trace=_relative(r.trace, out_dir),
                       unexpected=tuple(_unexpected(r.summary)) if r.summary else (),
                       dispatch=tuple(_fallbacks(r.calls)), baseline_rel=base)


def _own_backend(r: Run, backend: str | None) -> Run:
    """A third-party kernel's attention kernels are its own (`sageattention 2.2.0`), not our `kernel` repo's,
    which the name table says for any unknown kernel with `attn` in its name."""
    if r.summary is None or not backend:
        return r
    kernels = [dataclasses.replace(k, backend=backend) if k.backend == "kernel" else k for k in r.summary.kernels]
    return dataclasses.replace(r, summary=dataclasses.replace(r.summary, kernels=kernels))


def _relative(path: Path | None, out_dir: Path) -> str | None:
    return str(path.relative_to(out_dir)) if path is not None else None


def _fallbacks(calls) -> list[dict]:
    """One entry per distinct SDPA fallback seen: ran, preferred, PyTorch's refusals, and the advice."""
    seen: dict[tuple, dict] = {}
    for e in explain(list(calls)):
        key = (e.backend, e.preferred, tuple(sorted(e.refusals.items())))
        seen.setdefault(key, {"ran": e.backend, "preferred": e.preferred, "refusals": e.refusals,
                              "advice": e.advice})
    return list(seen.values())


def _unexpected(summary: Summary) -> list[str]:
    if any(k.role == "fused_attention" for k in summary.kernels) and summary.kernels_per_step <= 2:
        return []
    notes = []
    for k in summary.kernels:  # the cause comes from the op that launched the kernel (profiling.causes)
        if k.role in UNEXPECTED_ROLES:
            notes.append(f"{k.short} ({k.per_step:g}/step) ← {k.cause.text()}")
    return notes


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)


def run_stages(workload: Workload, variants: list[Variant], out_dir: Path, *, seed: int = 0, steps: int = 5,
               reps: int = 20, on_stage: Callable[[str], None] | None = None) -> list[StageResult]:
    """Every variant on the same inputs (one `make_inputs(seed)`), in order; see the module docstring."""
    inputs = workload.make_inputs(seed)
    reference = Reference.of(inputs)
    # the verify rule: k × plain PyTorch's error in the same dtype. Rows that see no key are reported, not judged:
    # here lossy means "further from fp64", and `attnprof verify` owns the masked-rows policy.
    gate = Gate.of(inputs, reference, workload.dtype, Rule(masked_rows="report"))
    results = []
    for variant in variants:
        if on_stage is not None:
            on_stage(variant.name)
        start = time.perf_counter()
        result = run_stage(variant, workload, inputs, reference, out_dir, steps=steps, reps=reps, gate=gate)
        results.append(dataclasses.replace(result, wall_s=round(time.perf_counter() - start, 3)))
    return results
