"""Kernel-level verification: every variant × every case against the fp64 oracle, judged by the baseline rule.

For each case: fresh random inputs from `Workload.make_inputs(seed + i)` (the seeds are recorded), the fp64
reference, plain PyTorch in the case's dtype (the baseline), then each variant. A variant that cannot run the
case is reported as rejected with its own reason; one that raises is an error (a failure). A user function that
returns the wrong shape raises UsageError, which is the user's input and propagates (exit 2).

With an executor (`verify --ray`) each case is one job (`CaseRunner`, picklable) on whichever node runs it; the run
names that node, and a case whose worker died on every attempt is an `error` for every variant, with the reason.
The diagnosis budget is then per case rather than per variant over the whole run.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

import torch

from attnprof.bench.executor import Executor, Job
from attnprof.errors import UsageError
from attnprof.numerics.cases import Case
from attnprof.numerics.compare import Agreement, compare, valid_rows_of
from attnprof.numerics.diagnose import diagnose
from attnprof.numerics.gate import MASKED_ROWS_PREFIX, Rule, Verdict, judge
from attnprof.numerics.scale import scale_direction
from attnprof.variants import Variant, reference_attention
from attnprof.variants.naive import eager_attention

_MASKED_HINT = ("valid rows agree; rows that see no key are not zeros (an unguarded softmax over an all -inf row "
                "gives NaN, a finite fill such as finfo.min gives the mean of V)")

DIAGNOSE_PER_VARIANT = 3

Status = Literal["pass", "fail", "rejected", "error"]


@dataclass(frozen=True)
class CaseResult:
    case: str
    dtype: str
    variant: str
    status: Status
    reason: str | None = None  # rejection / error text, or the failure reasons joined
    agreement: Agreement | None = None
    verdict: Verdict | None = None
    hint: str | None = None  # what the error pattern looks like (diagnose.py), on failures

    def to_json(self) -> dict:
        return {"case": self.case, "dtype": self.dtype, "variant": self.variant, "status": self.status,
                "reason": self.reason, "hint": self.hint,
                "agreement": self.agreement.to_json() if self.agreement else None,
                "verdict": self.verdict.to_json() if self.verdict else None}


@dataclass(frozen=True)
class CaseRun:
    case: Case
    seed: int
    baseline: Agreement | None  # None only when the case never ran (its worker died on every attempt)
    results: tuple[CaseResult, ...]
    node: dict[str, Any] | None = None  # where it ran, when an executor ran it

    def to_json(self) -> dict:
        out = {**self.case.to_json(), "seed": self.seed,
               "baseline": self.baseline.to_json() if self.baseline else None,
               "results": [r.to_json() for r in self.results]}
        if self.node is not None:
            out["node"] = self.node
        return out


def verify_case(case: Case, variants: Sequence[Variant], *, seed: int, rule: Rule,
                diagnose_budget: dict[str, int] | None = None) -> CaseRun:
    """One case: reference, baseline, then every variant (see the module docstring).

    `diagnose_budget` maps variant name → how many more failures to diagnose (each costs a few fp64 references);
    missing names get DIAGNOSE_PER_VARIANT.
    """
    budget = {} if diagnose_budget is None else diagnose_budget
    w = case.workload
    inputs = w.make_inputs(seed)
    ref = reference_attention(inputs)  # fp64 [B, Hq, Sq, D]
    rows = valid_rows_of(inputs.valid, ref.shape)
    direction = scale_direction(inputs)  # fp64 ∂out/∂log(scale), for the effective-scale check
    with torch.no_grad():
        base_out = eager_attention(inputs, inplace=False)
    baseline = compare(base_out, ref, dtype=w.dtype, valid_rows=rows, direction=direction)
    del base_out
    results = []
    for variant in variants:
        support = variant.supports(w)
        if not support.ok:
            results.append(CaseResult(case.name, w.dtype, variant.name, "rejected", reason=support.reason))
            continue
        try:
            with torch.no_grad():
                out = variant(inputs)
            if w.device.startswith("cuda"):
                torch.cuda.synchronize()
        except UsageError:
            raise
        except (RuntimeError, ValueError, TypeError, NotImplementedError, AssertionError, IndexError) as exc:
            msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            results.append(CaseResult(case.name, w.dtype, variant.name, "error",
                                      reason=f"raised {type(exc).__name__}: {msg}"))
            continue
        if not isinstance(out, torch.Tensor) or tuple(out.shape) != tuple(ref.shape):
            got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
            raise UsageError(f"variant {variant.name!r} returned {got}, expected shape {tuple(ref.shape)} "
                             "[B, Hq, Sq, D]")
        agreement = compare(out, ref, dtype=w.dtype, valid_rows=rows, direction=direction)
        verdict = judge(agreement, baseline, w.dtype, rule)
        status: Status = "pass" if verdict.ok else "fail"
        hint = None
        if not verdict.ok:
            only_masked = all(r.startswith(MASKED_ROWS_PREFIX) for r in verdict.reasons)
            left = budget.setdefault(variant.name, DIAGNOSE_PER_VARIANT)
            if only_masked:
                hint = _MASKED_HINT
            elif left > 0:
                budget[variant.name] = left - 1
                hint = diagnose(out, w, inputs, ref, agreement, rows, baseline.norm_rel, direction)
        text = "; ".join(verdict.reasons + verdict.warnings) or None
        results.append(CaseResult(case.name, w.dtype, variant.name, status, reason=text, agreement=agreement,
                                  verdict=verdict, hint=hint))
    return CaseRun(case=case, seed=seed, baseline=baseline, results=tuple(results))


@dataclass(frozen=True)
class CaseRunner:
    """One case where an executor puts it: points the `kernel` variant at the same repo as the caller, then
    `verify_case`. Payload: `(case, seed)`."""

    variants: tuple[Variant, ...]
    rule: Rule
    kernel: tuple[str | None, bool] = (None, False)  # (--kernel, --trust-remote-kernel)

    def __call__(self, payload: tuple[Case, int]) -> CaseRun:
        from attnprof.variants.kernel_hub import configure

        configure(*self.kernel)
        case, seed = payload
        return verify_case(case, self.variants, seed=seed, rule=self.rule)


def verify_kernels(variants: Sequence[Variant], cases: Sequence[Case], *, seed: int, rule: Rule = Rule(),
                   on_case: Callable[[Case], None] | None = None, executor: Executor | None = None,
                   kernel: tuple[str | None, bool] = (None, False)) -> list[CaseRun]:
    """Every case in order; case i draws its inputs from seed + i. With `executor`, the cases run as its jobs."""
    if executor is not None:
        return _on_executor(executor, CaseRunner(tuple(variants), rule, kernel), cases, seed, on_case)
    runs, budget = [], {}
    for i, case in enumerate(cases):
        if on_case is not None:
            on_case(case)
        runs.append(verify_case(case, variants, seed=seed + i, rule=rule, diagnose_budget=budget))
    return runs


def _on_executor(executor: Executor, runner: CaseRunner, cases: Sequence[Case], seed: int,
                 on_case: Callable[[Case], None] | None) -> list[CaseRun]:
    jobs = [Job(i, (case, seed + i), case.workload.device, f"verify {case.name} {case.workload.dtype}")
            for i, case in enumerate(cases)]
    runs: list[CaseRun | None] = [None] * len(jobs)
    outcomes = executor.run(runner, jobs)
    try:
        for o in outcomes:
            case, case_seed = o.job.payload
            if o.failure is None:
                run = o.value
            else:
                run = CaseRun(case, case_seed, None, tuple(
                    CaseResult(case.name, case.workload.dtype, v.name, "error", reason=f"never ran: {o.failure}")
                    for v in runner.variants))
            runs[o.job.index] = replace(run, node=o.node)
            if on_case is not None:
                on_case(case)
    finally:
        outcomes.close()
    return [r for r in runs if r is not None]
