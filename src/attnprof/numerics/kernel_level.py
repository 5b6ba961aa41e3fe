"""Kernel-level verification: every variant × every case against the fp64 oracle, judged by the baseline rule.

For each case: fresh random inputs from `Workload.make_inputs(seed + i)` (the seeds are recorded), the fp64
reference, plain PyTorch in the case's dtype (the baseline), then each variant through `run()` (attnprof.run) with
the gate: `ok` passes, `lossy` (or a NaN/Inf output) fails, `rejected` keeps its own reason, and a variant that
raises or runs out of memory is an error (a failure). A flex run after dynamo's recompile limit was hit for
flex_attention in this process is named `flex (unfused)` and its reason says why (`attnprof.run.unfused_since`). A user function that returns the wrong shape or
`None`, or calls `sys.exit`, is an error (a failure) like one that raises.

With an executor (`verify --ray`) each case is one job (`CaseRunner`, picklable) on whichever node runs it; the run
names that node, and a case whose worker died on every attempt is an `error` for every variant, with the reason.
The diagnosis budget is then per case rather than per variant over the whole run.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from attnprof.bench.executor import Executor, Job
from attnprof.numerics.cases import Case
from attnprof.numerics.diagnose import diagnose
from attnprof.oracle.agreement import Agreement, Reference
from attnprof.oracle.gate import MASKED_ROWS_PREFIX, Gate, Rule, Verdict
from attnprof.run import Status, recompile_limit_hits, run, unfused_since
from attnprof.variants import Variant

_MASKED_HINT = ("valid rows agree; rows that see no key are not zeros (an unguarded softmax over an all -inf row "
                "gives NaN, a finite fill such as finfo.min gives the mean of V)")

DIAGNOSE_PER_VARIANT = 3

# A compiled flex past dynamo's recompile limit runs every shape it has not compiled before eagerly: unfused.
_UNFUSED = ("unfused: torch.compile(flex_attention) hit dynamo's recompile limit in this process, so shapes it had not "
            "compiled before run eagerly, materialising the scores ({warning})")


def _join(*parts: str | None) -> str | None:
    return "; ".join(p for p in parts if p) or None

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
    # An FP8 KV cache: the error against the fp64 oracle of the keys/values *before* quantization, over plain
    # PyTorch's error in the same dtype on those unquantized inputs: what the FP8 cache costs, as a multiple of a
    # 16-bit cache's error (`lossy_factor`)
    lossy_factor: float | None = None
    kv_read: str | None = None  # with an FP8 KV cache: what the variant read (its `fp8_path`, or "dequantised")

    def to_json(self) -> dict:
        return {"case": self.case, "dtype": self.dtype, "variant": self.variant, "status": self.status,
                "reason": self.reason, "hint": self.hint, "lossy_factor": self.lossy_factor, "kv_read": self.kv_read,
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
    ref = Reference.of(inputs, scale=True)  # fp64 [B, Hq, Sq, D], valid rows, ∂out/∂log(scale)
    gate = Gate.of(inputs, ref, w.dtype, rule)
    lossy = _LossyFactor.of(inputs, w.dtype, rule)  # None without FP8 (a KV cache or the attention)
    results = []
    for variant in variants:
        with recompile_limit_hits():
            r = run(variant, w, inputs, reference=ref, gate=gate, warm=False, keep_output=True)
        name, unfused = variant.name, None
        if variant.backend == "flex" and r.status is not Status.REJECTED and unfused_since("flex") is not None:
            name, unfused = f"{variant.name} (unfused)", _UNFUSED.format(warning=unfused_since("flex"))
        if r.status is Status.REJECTED:
            results.append(CaseResult(case.name, w.dtype, name, "rejected", reason=r.reason))
            continue
        if r.agreement is None:  # it raised or ran out of memory before its output could be compared
            results.append(CaseResult(case.name, w.dtype, name, "error", reason=_join(r.reason, unfused)))
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
        text = _join("; ".join(verdict.reasons + verdict.warnings) or None, unfused)
        results.append(CaseResult(case.name, w.dtype, name, status, reason=text, agreement=r.agreement,
                                  verdict=verdict, hint=hint,
                                  lossy_factor=lossy.factor(r.output) if lossy and r.output is not None else None,
                                  kv_read=(variant.fp8_path or "the cache dequantised") if inputs.fp8 else None))
    return CaseRun(case=case, seed=seed, baseline=gate.baseline, results=tuple(results))


@dataclass(frozen=True)
class _LossyFactor:
    """What FP8 costs: errors against the fp64 oracle of the unquantized inputs, in units of plain PyTorch's error
    on those inputs in 16 bits: for an FP8 KV cache in the workload dtype (a 16-bit cache's error), for FP8
    attention in bf16 (its activations' dtype: bf16 attention's error). The gate itself judges each variant against
    the oracle of the dequantised inputs it was given; this says how far they are from the model's real ones."""

    ref: Reference
    unit: float

    @classmethod
    def of(cls, inputs, dtype: str, rule: Rule) -> _LossyFactor | None:
        if inputs.fp8 is None and inputs.fp8_qkv is None:
            return None
        plain = inputs.unquantized()
        ref = Reference.of(plain)
        return cls(ref, Gate.of(plain, ref, "bf16" if inputs.fp8_qkv is not None else dtype, rule).baseline.norm_rel)

    def factor(self, out) -> float:
        err = self.ref.compare(out, "fp64").norm_rel
        return err / self.unit if self.unit > 0 else float("inf")


@dataclass(frozen=True)
class CaseRunner:
    """One case where an executor puts it (`verify_case`); the variants travel with their kernel repo (a `kernel`
    variant pickles its `KernelSpec`). Payload: `(case, seed)`."""

    variants: tuple[Variant, ...]
    rule: Rule

    def __call__(self, payload: tuple[Case, int]) -> CaseRun:
        case, seed = payload
        return verify_case(case, self.variants, seed=seed, rule=self.rule)


def verify_kernels(variants: Sequence[Variant], cases: Sequence[Case], *, seed: int, rule: Rule = Rule(),
                   on_case: Callable[[Case], None] | None = None, executor: Executor | None = None) -> list[CaseRun]:
    """Every case in order; case i draws its inputs from seed + i. With `executor`, the cases run as its jobs."""
    if executor is not None:
        return _on_executor(executor, CaseRunner(tuple(variants), rule), cases, seed, on_case)
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
