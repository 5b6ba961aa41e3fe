"""The pass rule: a variant may be as wrong as plain PyTorch in the same dtype, times k, and no more.

A fixed tolerance is wrong twice: too loose for fp32 (where a 1 % scale bug is 1e-3 and rounding is 1e-7) and
too tight for bf16 (where rounding alone is 1e-2). FlashAttention's tests measure the error of the plain
PyTorch computation in the same dtype against a high-precision reference on the same inputs and allow a kernel
twice that. We do the same, against the fp64 oracle:

    limit(metric) = max(k × baseline(metric), floor[dtype][metric])      for metric in (max abs, norm-relative)

"Plain PyTorch in the same dtype" is `attnprof.variants.naive.plain_attention` (for FP8 attention
`plain_fp8_attention`: FlashAttention-3's arithmetic written out, P rounded to e4m3 for the P·V product): k and v repeated to the query
heads as models do (transformers' `repeat_kv`), then QKᵀ, scale, masked_fill, softmax, ·V, each op in the
workload's dtype: the straightforward math a user would write, whose only error is rounding. Fused kernels
usually beat it (they keep scores in fp32), so correct backends pass with margin. (Not the GQA-folded form the
`naive` stage runs: for decode it multiplies by V as a small GEMM whose accumulation is ~2.4× more accurate on
MKL than the per-head product every other implementation uses, a luck no correct backend can match.)

The floor keeps the rule meaningful only where the baseline is not measurable: exactly or nearly 0 (fp64, tiny
outputs). So each floor sits below what plain PyTorch reaches on every default case, and the rule is relative
there: in fp32 plain PyTorch's norm-relative error is 2-5e-7, and the fp32 floor is 1e-7 (a floor of 1e-5 would set
the limit everywhere and let a one-in-a-million bug pass). The fp32 max-abs floor, 2e-6 (about 16 fp32 rounding
units of the default cases' largest outputs, |out| ≈ 3.5), leaves room for the max's own noise: correct backends
reach 1.9× plain PyTorch's max abs error on some seeds while their norm-relative error stays within 1.15×.

A third, sharper check catches what rounding can hide: the effective softmax scale. The error's projection on
∂out/∂log(scale) (scale.py) is ~1e-5 for correct kernels and exactly ε for a scale off by ε, so
|ε| ≤ max(k × plain PyTorch's |ε|, SCALE_FLOORS[dtype]).

Beyond the error metrics a variant fails when its valid rows hold NaN/Inf the reference does not, and,
unless `masked_rows="report"`, when rows that see no key at all are not zeros (a NaN there spreads through the
next layer's V into valid rows).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from attnprof.oracle.agreement import Agreement, Reference
from attnprof.workload import Inputs

MaskedRowsPolicy = Literal["zeros", "report"]

# (max abs, norm-relative) floors per dtype: about a rounding unit of the format, below what plain PyTorch
# reaches on any default case, so they matter only where the baseline is ~0 (see the module docstring for fp32's).
FLOORS: dict[str, tuple[float, float]] = {
    "fp64": (1e-12, 1e-12),
    "fp32": (2e-6, 1e-7),
    "fp16": (5e-4, 3e-4),
    "bf16": (4e-3, 2e-3),
    "fp8": (3e-2, 1.5e-2),  # e4m3's rounding unit is 2^-4; the bf16 output's alone is bf16's floor
}


# |effective scale − 1| floors: ~20× what correct fused kernels show on the default cases, ≥ 10× below a 1 % bug
# in bf16. Plain PyTorch's own scale error (noise, up to ~1e-4 in bf16) times k is the other half of the limit.
SCALE_FLOORS: dict[str, float] = {"fp64": 1e-9, "fp32": 1e-5, "fp16": 2e-4, "bf16": 1e-3, "fp8": 6e-3}


MASKED_ROWS_PREFIX = "fully-masked rows"


@dataclass(frozen=True)
class Rule:
    """The gate's parameters; `k` scales the baseline error, `floors` overrides FLOORS per dtype."""

    k: float = 2.0
    masked_rows: MaskedRowsPolicy = "zeros"
    floors: dict[str, tuple[float, float]] = field(default_factory=lambda: dict(FLOORS))
    scale_floors: dict[str, float] = field(default_factory=lambda: dict(SCALE_FLOORS))

    def limits(self, dtype: str, baseline: Agreement) -> tuple[float, float]:
        floor_abs, floor_rel = self.floors.get(dtype, FLOORS["fp32"])
        return max(self.k * baseline.max_abs, floor_abs), max(self.k * baseline.norm_rel, floor_rel)

    def scale_limit(self, dtype: str, baseline: Agreement) -> float:
        base = abs(baseline.scale_err) if baseline.scale_err is not None else 0.0
        return max(self.k * base, self.scale_floors.get(dtype, SCALE_FLOORS["fp32"]))

    def to_json(self) -> dict:
        return {"k": self.k, "masked_rows": self.masked_rows, "floors": self.floors,
                "scale_floors": self.scale_floors,
                "baseline": "attnprof.variants.naive.plain_attention in the workload dtype (fp8: "
                            "plain_fp8_attention, P rounded to e4m3)"}


@dataclass(frozen=True)
class Verdict:
    ok: bool
    reasons: tuple[str, ...]
    warnings: tuple[str, ...]
    limit_max_abs: float
    limit_norm_rel: float
    limit_scale: float

    def to_json(self) -> dict:
        return {"ok": self.ok, "reasons": list(self.reasons), "warnings": list(self.warnings),
                "limit_max_abs": self.limit_max_abs, "limit_norm_rel": self.limit_norm_rel,
                "limit_scale": self.limit_scale}


def judge(agreement: Agreement, baseline: Agreement, dtype: str, rule: Rule = Rule()) -> Verdict:
    """Apply the rule to one variant's agreement, given plain PyTorch's agreement on the same inputs."""
    lim_abs, lim_rel = rule.limits(dtype, baseline)
    lim_scale = rule.scale_limit(dtype, baseline)
    reasons: list[str] = []
    warnings: list[str] = []
    a = agreement
    if not a.finite:
        reasons.append(f"{a.nan_out} NaN and {a.inf_out} Inf in rows that see at least one key (reference: "
                       f"{a.nan_ref} NaN, {a.inf_ref} Inf)")
    else:
        if a.max_abs > lim_abs:
            reasons.append(f"max abs error {a.max_abs:.3e} > limit {lim_abs:.3e} ({_why(rule, dtype, baseline.max_abs, lim_abs)}) "
                           f"at [b,h,q,d]={list(a.worst_index or ())}: out {a.worst_out:+.5g} vs ref {a.worst_ref:+.5g}")
        if a.norm_rel > lim_rel:
            reasons.append(f"norm-relative error {a.norm_rel:.3e} > limit {lim_rel:.3e} "
                           f"({_why(rule, dtype, baseline.norm_rel, lim_rel)})")
        if a.scale_err is not None:
            if abs(a.scale_err) > lim_scale:
                reasons.append(f"systematic error along the softmax-scale direction: effective scale "
                               f"×{1 + a.scale_err:.5f} ({100 * a.scale_err:+.3f}%), limit ±{100 * lim_scale:.3f}% "
                               f"(plain PyTorch {dtype}: {100 * (baseline.scale_err or 0):+.4f}%)")
    if a.masked_rows and not a.masked_rows_zero:
        msg = (f"{MASKED_ROWS_PREFIX} ({a.masked_rows} rows that see no key) are not zeros: {a.masked_nonzero} non-zero "
               f"elements, {a.masked_nan} NaN/Inf")
        (reasons if rule.masked_rows == "zeros" else warnings).append(msg)
    return Verdict(ok=not reasons, reasons=tuple(reasons), warnings=tuple(warnings),
                   limit_max_abs=lim_abs, limit_norm_rel=lim_rel, limit_scale=lim_scale)


def _why(rule: Rule, dtype: str, base: float, limit: float) -> str:
    if limit > rule.k * base:
        return f"the {dtype} floor; plain PyTorch {dtype}: {base:.2e}"
    return f"{rule.k:g} × plain PyTorch {dtype}'s {base:.2e}"


@dataclass(frozen=True)
class Gate:
    """The rule together with plain PyTorch's agreement on the same inputs: what `run()` needs to call an output
    `lossy` (ran, but further from the oracle than the rule allows)."""

    baseline: Agreement
    rule: Rule = Rule()

    @classmethod
    def of(cls, inputs: Inputs, reference: Reference, dtype: str, rule: Rule = Rule()) -> Gate:
        """Measure the baseline: `variants.naive.plain_attention` in the inputs' dtype against `reference`."""
        import torch

        from attnprof.variants.naive import plain_attention, plain_fp8_attention

        with torch.no_grad():
            out = plain_fp8_attention(inputs) if dtype == "fp8" else plain_attention(inputs)
        return cls(baseline=reference.compare(out, dtype), rule=rule)

    def judge(self, agreement: Agreement, dtype: str) -> Verdict:
        return judge(agreement, self.baseline, dtype, self.rule)
