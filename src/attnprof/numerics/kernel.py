"""Kernel-level verification: every variant × every case against the fp64 oracle, judged by the baseline rule.

For each case: fresh random inputs from `Workload.make_inputs(seed + i)` (the seeds are recorded), the fp64
reference, plain PyTorch in the case's dtype (the baseline), then each variant through `run()` (attnprof.run) with
the gate: `ok` passes, `lossy` (or a NaN/Inf output) fails, `rejected` keeps its own reason, and a variant that
raises or runs out of memory is an error (a failure). A user function that returns the wrong shape raises
UsageError, which is the user's input and propagates (exit 2).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from attnprof.numerics.cases import Case
from attnprof.numerics.compare import Agreement, Reference
from attnprof.numerics.diagnose import diagnose
from attnprof.numerics.gate import MASKED_ROWS_PREFIX, Gate, Rule, Verdict
from attnprof.run import Status, run
from attnprof.variants import Variant

_MASKED_HINT = ("valid rows agree; rows that see no key are not zeros (an unguarded softmax over an all -inf row "
                "gives NaN, a finite fill such as finfo.min gives the mean of V)")

DIAGNOSE_PER_VARIANT = 3

CaseStatus = Literal["pass", "fail", "rejected", "error"]  # verify's words for Run's statuses


@dataclass(frozen=True)
class CaseResult:
    case: str
    dtype: str
    variant: str
    status: CaseStatus
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
    baseline: Agreement
    results: tuple[CaseResult, ...]

    def to_json(self) -> dict:
        return {**self.case.to_json(), "seed": self.seed, "baseline": self.baseline.to_json(),
                "results": [r.to_json() for r in self.results]}


def verify_case(case: Case, variants: Sequence[Variant], *, seed: int, rule: Rule,
                diagnose_budget: dict[str, int] | None = None) -> CaseRun:
    """One case: reference, baseline, then every variant (see the module docstring).

    `diagnose_budget` maps variant name → how many more failures to diagnose (each costs a few fp64 references);
    missing names get DIAGNOSE_PER_VARIANT.
    """
    budget = {} if diagnose_budget is None else diagnose_budget
    w = case.workload
    inputs = w.make_inputs(seed)
    ref = Reference.of(inputs, scale=True)  # fp64 [B, Hq, Sq, D], valid rows, ∂out/∂log(scale)
    gate = Gate.of(inputs, ref, w.dtype, rule)
    results = []
    for variant in variants:
        r = run(variant, w, inputs, reference=ref, gate=gate, warm=False, keep_output=True)
        if r.status is Status.REJECTED:
            results.append(CaseResult(case.name, w.dtype, variant.name, "rejected", reason=r.reason))
            continue
        if r.agreement is None:  # it raised or ran out of memory before its output could be compared
            results.append(CaseResult(case.name, w.dtype, variant.name, "error", reason=r.reason))
            continue
        verdict = r.verdict
        status: CaseStatus = "pass" if r.status is Status.OK else "fail"
        hint = None
        if status == "fail":
            only_masked = all(x.startswith(MASKED_ROWS_PREFIX) for x in verdict.reasons)
            left = budget.setdefault(variant.name, DIAGNOSE_PER_VARIANT)
            if only_masked:
                hint = _MASKED_HINT
            elif left > 0:
                budget[variant.name] = left - 1
                hint = diagnose(r.output, w, inputs, ref.out, r.agreement, ref.rows, gate.baseline.norm_rel,
                                ref.direction)
        text = "; ".join(verdict.reasons + verdict.warnings) or None
        results.append(CaseResult(case.name, w.dtype, variant.name, status, reason=text, agreement=r.agreement,
                                  verdict=verdict, hint=hint))
    return CaseRun(case=case, seed=seed, baseline=gate.baseline, results=tuple(results))


def verify_kernels(variants: Sequence[Variant], cases: Sequence[Case], *, seed: int, rule: Rule = Rule(),
                   on_case: Callable[[Case], None] | None = None) -> list[CaseRun]:
    """Every case in order; case i draws its inputs from seed + i."""
    runs, budget = [], {}
    for i, case in enumerate(cases):
        if on_case is not None:
            on_case(case)
        runs.append(verify_case(case, variants, seed=seed + i, rule=rule, diagnose_budget=budget))
    return runs
