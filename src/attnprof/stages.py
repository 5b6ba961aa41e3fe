"""The main job: the tutorial's stages on one workload, each run under the profiler and the dispatch watcher.

For every variant: does it accept the workload (else `rejected` with the reason); one call under the SDPA watcher
(which backend really ran); error against the fp64 oracle; peak memory above the inputs; a profiled run of N
steps (kernels per step, their roles, GPU and CPU time per step, a Chrome trace per stage); and wall latency over
at least 20 timed calls. One stage failing (out of memory, an error) is recorded and the others still run.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from attnprof.audit.watch import watch
from attnprof.bench.flops import tflops
from attnprof.bench.timing import Timing, time_call
from attnprof.errors import UsageError
from attnprof.profiling.capture import capture
from attnprof.profiling.classify import UNEXPECTED
from attnprof.profiling.summary import Summary, summarize
from attnprof.profiling.trace import load_trace
from attnprof.variants import Variant, reference_attention
from attnprof.workload import Inputs, Workload

SCHEMA = "attnprof.stages/1"


@dataclass
class StageResult:
    variant: str
    family: str
    status: str  # ok | rejected | oom | error
    reason: str | None = None
    summary: Summary | None = None
    timing: Timing | None = None
    tflops: float | None = None
    peak_mib: float | None = None
    max_rel_err: float | None = None
    max_abs_err: float | None = None
    backend: str | None = None
    trace: str | None = None
    unexpected: list[str] = field(default_factory=list)
    # SDPA calls that did not get this device's fastest backend: what ran, what was preferred, and why not
    dispatch: list[dict] = field(default_factory=list)

    def to_json(self) -> dict:
        s = self.summary
        return {
            "variant": self.variant, "family": self.family, "status": self.status, "reason": self.reason,
            "kernels_per_step": s.kernels_per_step if s else None,
            "kernels": [k.to_json() for k in s.kernels] if s else [],
            "latency_ms": ({"p20": self.timing.p20, "p50": self.timing.p50, "p80": self.timing.p80,
                            "reps": self.timing.reps, "method": self.timing.method} if self.timing else None),
            "gpu_ms_per_step": s.gpu_ms_per_step if s else None,
            "cpu_ms_per_step": s.cpu_ms_per_step if s else None,
            "tflops": self.tflops, "peak_mib": self.peak_mib,
            "max_rel_err": self.max_rel_err, "max_abs_err": self.max_abs_err,
            "backend": self.backend, "trace": self.trace, "unexpected": self.unexpected,
            "dispatch": self.dispatch,
        }


def run_stage(variant: Variant, workload: Workload, inputs: Inputs, reference: torch.Tensor, out_dir: Path, *,
              steps: int = 5, reps: int = 20) -> StageResult:
    result = StageResult(variant=variant.name, family=variant.family, status="ok")
    support = variant.supports(workload)
    if not support.ok:
        result.status, result.reason = "rejected", support.reason
        return result
    try:
        _measure(variant, workload, inputs, reference, out_dir, result, steps=steps, reps=reps)
    except UsageError:
        raise
    except torch.OutOfMemoryError as exc:
        result.status, result.reason = "oom", _oom_reason(exc)
    except RuntimeError as exc:
        if "can't allocate memory" in str(exc) or "out of memory" in str(exc).lower():
            result.status, result.reason = "oom", _oom_reason(exc)
        else:
            result.status, result.reason = "error", f"{type(exc).__name__}: {_first_line(exc)}"
    finally:
        if workload.device.startswith("cuda"):
            torch.cuda.empty_cache()
    return result


def _measure(variant: Variant, workload: Workload, inputs: Inputs, reference: torch.Tensor, out_dir: Path,
             result: StageResult, *, steps: int, reps: int) -> None:
    device = workload.device
    cuda = device.startswith("cuda")
    call: Callable[[], torch.Tensor] = lambda: variant(inputs)  # noqa: E731

    call()  # first call: compilation, autotuning and lazy loads happen here, outside everything measured
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
    with watch() as calls:
        out = call()
    if cuda:
        torch.cuda.synchronize(device)
        result.peak_mib = (torch.cuda.max_memory_allocated(device) - before) / 2**20

    ref = reference.to(out.device)
    diff = out.detach().to(torch.float64) - ref
    result.max_abs_err = float(diff.abs().max()) if diff.numel() else 0.0
    result.max_rel_err = float(diff.norm() / ref.norm().clamp_min(1e-30))
    del out, diff

    trace_path = out_dir / "traces" / f"{_safe(variant.name)}.json"
    capture(call, trace_path, device=device, steps=steps, warmup=2)
    result.trace = str(trace_path.relative_to(out_dir))
    summary = summarize(load_trace(trace_path))
    result.summary = summary
    if not cuda:
        result.peak_mib = summary.peak_alloc_mib

    result.dispatch = _fallbacks(calls)
    watched = sorted({c.backend for c in calls})  # what SDPA really dispatched; else fused kernels by name
    result.backend = ",".join(watched or summary.backends) or variant.backend
    result.unexpected = _unexpected(summary)

    result.timing = time_call(call, device, warmup=2, reps=reps)
    result.tflops = tflops(workload, result.timing.p50 / 1e3)


def _fallbacks(calls) -> list[dict]:
    """One entry per distinct SDPA fallback seen: ran, preferred, PyTorch's refusals, and the advice."""
    from attnprof.audit import explain

    seen: dict[tuple, dict] = {}
    for e in explain(list(calls)):
        key = (e.backend, e.preferred, tuple(sorted(e.refusals.items())))
        seen.setdefault(key, {"ran": e.backend, "preferred": e.preferred, "refusals": e.refusals,
                              "advice": e.advice})
    return list(seen.values())


def dispatch_lines(result: StageResult) -> list[str]:
    """`ran efficient, not cudnn — cudnn: head_dim should be no more than 256; …` for each fallback."""
    lines = []
    for d in result.dispatch:
        why = "; ".join(f"{b}: {r}" for b, r in d["refusals"].items()) or "no reason given"
        lines.append(f"SDPA ran {d['ran']}, not {d['preferred']} — {why}")
        lines += [f"  fix: {a}" for a in d["advice"]]
    return lines


def _unexpected(summary: Summary) -> list[str]:
    if any(k.role == "fused_attention" for k in summary.kernels) and summary.kernels_per_step <= 2:
        return []
    notes = []
    for k in summary.kernels:
        if k.role in UNEXPECTED:
            notes.append(f"{k.name} ({k.per_step:g}/step): {UNEXPECTED[k.role]}")
    return notes


def _oom_reason(exc: BaseException) -> str:
    text = str(exc)
    asked = re.search(r"(?:Tried to allocate|tried to allocate) ([\d.]+ ?[KMGT]i?B|\d+ bytes)", text)
    return ("out of memory" + (f": asked for {asked.group(1)}" if asked else "") + f" ({_first_line(exc)[:160]})")


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)


def run_stages(workload: Workload, variants: list[Variant], out_dir: Path, *, seed: int = 0, steps: int = 5,
               reps: int = 20, on_stage: Callable[[str], None] | None = None) -> list[StageResult]:
    """Every variant on the same inputs (one `make_inputs(seed)`), in order; see the module docstring."""
    inputs = workload.make_inputs(seed)
    reference = reference_attention(inputs)
    results = []
    for variant in variants:
        if on_stage is not None:
            on_stage(variant.name)
        results.append(run_stage(variant, workload, inputs, reference, out_dir, steps=steps, reps=reps))
    return results


def deltas(results: list[StageResult]) -> list[str]:
    """Stage-to-stage changes in words, each ok stage against the previous ok one."""
    ok = [r for r in results if r.status == "ok" and r.summary and r.timing]
    lines = []
    base = ok[0] if ok else None
    for prev, cur in zip(ok, ok[1:], strict=False):
        before = {k.name: k for k in prev.summary.kernels}
        after = {k.name: k for k in cur.summary.kernels}
        gone = [before[n] for n in before if n not in after]
        new = [after[n] for n in after if n not in before]
        dk = prev.summary.kernels_per_step - cur.summary.kernels_per_step
        dt = prev.timing.p50 - cur.timing.p50
        verb = "removed" if dk >= 0 else "added"
        text = f"{cur.variant} vs {prev.variant}: {verb} {abs(dk):g} kernel(s) per step"
        if gone:
            text += " (gone: " + ", ".join(_kernel_phrase(k, base) for k in gone[:4]) + ")"
        if new:
            text += " (new: " + ", ".join(_short(k.name) for k in new[:3]) + ")"
        text += f" and {'saved' if dt >= 0 else 'lost'} {abs(dt):.3g} ms per call"
        text += f" ({prev.timing.p50 / cur.timing.p50:.2f}x)" if cur.timing.p50 > 0 else ""
        lines.append(text + ".")
    return lines


def _kernel_phrase(k, base: StageResult | None) -> str:
    phrase = f"{_short(k.name)} [{k.role}]"
    if base is not None and base.summary and base.summary.gpu_ms_per_step:
        share = k.time_us / 1e3 / base.summary.gpu_ms_per_step
        phrase += f", {share:.0%} of {base.variant}'s GPU time"
    return phrase


def _short(name: str, width: int = 60) -> str:
    return name if len(name) <= width else name[: width - 1] + "…"


def results_json(workload: Workload, results: list[StageResult], provenance: dict, note: str) -> dict:
    return {"schema": SCHEMA, "provenance": provenance, "workload": workload.to_json(), "workload_note": note,
            "stages": [r.to_json() for r in results], "deltas": deltas(results)}
