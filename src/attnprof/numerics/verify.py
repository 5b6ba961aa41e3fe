"""`attnprof verify` as a library call: which dtypes and cases, the kernel level, the model level, verify.json.

Kernel level: every variant × case through `numerics.kernel_level.verify_kernels` (the gate), summarised per variant.
naive and inplace are plain PyTorch, the gate's own baseline: they are left out with a note, never compared with
themselves. Model level: `numerics.model_level.verify_model` on a preset with the implementations of
`models.attention`, each refused up front for the model's left-padded attention call. Each level returns its
`attnprof.verify/1` block and the one-line failures that make the command exit 1.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from attnprof.errors import UsageError
from attnprof.kinds import VERIFY_VARIANTS
from attnprof.numerics.cases import Case, default_cases
from attnprof.numerics.kernel_level import CaseRun, verify_kernels
from attnprof.oracle.gate import Rule
from attnprof.variants.base import Variant
from attnprof.workload import Workload, check_runs_here, dtype_name

SCHEMA = "attnprof.verify/1"
BASELINE_ITSELF = ("naive", "inplace")  # never verified: rows that would compare the baseline with itself


def dtypes_for(spec: str | None, device: str, *, check: bool = True) -> list[str]:
    """`--dtype a,b` (default bf16,fp16 on CUDA, fp32,bf16 on the CPU), each checked to run here (`check`; not on a
    cluster, whose GPUs are elsewhere: this machine cannot tell)."""
    if spec:
        names = [dtype_name(d.strip()) for d in spec.split(",") if d.strip()]
    else:
        names = ["bf16", "fp16"] if device.startswith("cuda") else ["fp32", "bf16"]
    for d in names if check else ():
        check_runs_here(Workload(dtype=d, device=device))
    return list(dict.fromkeys(names))


def cases_for(device: str, dtype: str, names: str | None) -> list[Case]:
    """The default cases for a device and dtype, or the comma-separated subset `names` (UsageError for unknown)."""
    cases = default_cases(device, dtype)
    if names:
        wanted = [c.strip() for c in names.split(",") if c.strip()]
        known = [c.name for c in cases]
        bad = [c for c in wanted if c not in known]
        if bad:
            raise UsageError(f"unknown case {bad[0]!r}; cases: {', '.join(known)}")
        cases = [c for c in cases if c.name in wanted]
    return cases


@dataclass(frozen=True)
class KernelLevel:
    """The kernel level's runs, and what verify.json and the terminal say about them."""

    dtypes: tuple[str, ...]
    variants: tuple[str, ...]
    not_verified: dict[str, str]
    runs: tuple[CaseRun, ...]

    def summary(self) -> dict[str, dict]:
        return variant_summary(self.runs)

    def failures(self) -> list[str]:
        """One line per failing variant: its first failure's case, dtype and hint (else reason)."""
        out = []
        for name, s in self.summary().items():
            if s["status"] == "fail":
                f = s["failures"][0]
                out.append(f"{name} ({f['case']} {f['dtype']}: {(f['hint'] or f['reason'] or '')[:160]})")
        return out

    def to_json(self) -> dict:
        return {"dtypes": list(self.dtypes), "variants": list(self.variants), "not_verified": self.not_verified,
                "cases": [r.to_json() for r in self.runs], "summary": self.summary()}


def kernel_level(variants: Sequence[Variant], cases: Sequence[Case], dtypes: Sequence[str], *, seed: int,
                 rule: Rule, on_case: Callable[[Case], None] | None = None, executor=None) -> KernelLevel:
    """Every variant but the baseline itself on every case (case i draws its inputs from seed + i)."""
    skipped = {v.name: "plain PyTorch: the gate's baseline itself, so comparing it proves nothing"
               for v in variants if v.name in BASELINE_ITSELF}
    kept = [v for v in variants if v.name not in skipped]
    if not kept:
        raise UsageError(f"{', '.join(skipped)} is plain PyTorch, the gate's own baseline; name a backend to verify "
                         "(default: " + ",".join(VERIFY_VARIANTS) + ")")
    runs = verify_kernels(kept, cases, seed=seed, rule=rule, on_case=on_case, executor=executor)
    return KernelLevel(tuple(dtypes), tuple(v.name for v in kept), skipped, tuple(runs))


def variant_summary(runs: list[CaseRun]) -> dict[str, dict]:
    """variant → {status, counts, first failure reason and hint, rejection reasons}, over every case and dtype."""
    out: dict[str, dict] = {}
    for run in runs:
        for r in run.results:
            s = out.setdefault(r.variant, {"pass": 0, "fail": 0, "error": 0, "rejected": 0, "failures": [],
                                           "rejections": []})
            s[r.status] += 1
            if r.status in ("fail", "error"):
                s["failures"].append({"case": r.case, "dtype": r.dtype, "reason": r.reason, "hint": r.hint})
            elif r.status == "rejected":
                s["rejections"].append({"case": r.case, "dtype": r.dtype, "reason": r.reason})
    for s in out.values():
        s["status"] = ("fail" if s["fail"] or s["error"] else "pass" if s["pass"] else "rejected")
    return out


def model_level(preset: str, impls_spec: str, device: str, dtypes: Sequence[str], *, seed: int, rule, batch: int,
                seq: int, decode_tokens: int, kernel=None,
                on_step: Callable[[str], None] | None = None, kv_dtype: str | None = None) -> tuple[dict, list[str]]:
    """The model gate (`numerics.model_level`) with the implementations `impls_spec` names; its dict and failures."""
    from attnprof.models import attention_workload
    from attnprof.models.attention import resolve_impls
    from attnprof.models.features import refuse_not_taken
    from attnprof.numerics.model_level import verify_model

    def impls(dtype, config):
        w = attention_workload(config, batch=batch, seq=seq, dtype=dtype, device=device,
                               mask="pad-left")  # the left-padded batch of numerics.model_level
        return refuse_not_taken(resolve_impls(impls_spec, device, workload=w, kernel=kernel), config)

    resolve_impls(impls_spec, device, kernel=kernel)  # unknown names, bad user functions: before the model is built
    report = verify_model(preset, impls, dtypes, device=device, seed=seed, batch=batch, seq=seq,
                          decode_tokens=decode_tokens, rule=rule, on_step=on_step, kv_dtype=kv_dtype)
    report.pop("_results")
    failures = [f"{r['impl']} {r['dtype']} on {preset}: {r['reason']}" for r in report["results"]
                if r["status"] in ("fail", "error")]
    return report, failures
