"""Why a call did not get the fastest backend, in PyTorch's own words, and what to change.

`explain` turns a watched call (or a `Workload`, or a list of records) into an `Explanation`: what ran, the fastest
backend this device offers, every faster backend's refusal (asked of SDPA's own checks, `dispatch.sdpa_checks`), and
`advise`'s concrete changes read from those refusals and the call's envelope.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from attnprof.dispatch.sdpa_checks import backend_refusal, disabled, faster_than, is_cuda
from attnprof.dispatch.watch import DispatchRecord, watch
from attnprof.variants.sdpa import sdpa_call
from attnprof.workload import Workload


@dataclass
class Explanation:
    """One call that fell back: where, what ran, what should have run, why, and what to change."""

    where: str
    envelope: str
    backend: str
    preferred: str | None
    refusals: dict[str, str] = field(default_factory=dict)
    advice: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.refusals and self.backend == (self.preferred or self.backend)

    def text(self) -> str:
        head = f"{self.where}: {self.envelope} ran {self.backend}"
        if self.ok:
            return head + " (the fastest backend here)"
        lines = [head + f", not {self.preferred}"]
        lines += [f"  {b} refused: {why}" for b, why in self.refusals.items()]
        lines += [f"  fix: {a}" for a in self.advice]
        return "\n".join(lines)

    def to_json(self) -> dict:
        return {"where": self.where, "envelope": self.envelope, "backend": self.backend, "preferred": self.preferred,
                "refusals": self.refusals, "advice": self.advice}


def explain(target: DispatchRecord | Workload | list) -> Explanation | list[Explanation]:
    """Why `target` did not get the fastest backend. A record list gives the explanations of those that fell back."""
    if isinstance(target, list):
        return [explain(r) for r in target if r.fell_back]
    if isinstance(target, Workload):
        return _explain_workload(target)
    rec = target
    if rec.kind != "sdpa":
        advice = ["wrap the call in torch.compile (FlexAttention is only fused when compiled)"] if not rec.fused else []
        return Explanation(rec.where, rec.envelope(), rec.backend, rec.preferred,
                           {} if rec.fused else {rec.backend: rec.note or "not fused"}, advice)
    return Explanation(rec.where, rec.envelope(), rec.backend, rec.preferred, dict(rec.refusals), advise(rec))


def _explain_workload(w: Workload) -> Explanation:
    with watch(explain=False) as calls:
        sdpa_call(w.make_inputs(0))
    rec = calls[-1]
    if is_cuda(w.device) and rec.fell_back and rec.mask == "none" and not rec.mask.startswith("causal-bias"):
        # the same SDPAParams checks, through the variants' helper (the one `stages` uses to reject pinned SDPA)
        rec.refusals = {b: disabled(b) or backend_refusal(b, w) or (
            f"PyTorch's checks accept {b} here, but SDPA ran {rec.backend} (its priority order)")
            for b in faster_than(rec.backend, w.device)}
    else:
        with watch(explain=True) as calls:
            sdpa_call(w.make_inputs(0))
        rec = calls[-1]
    refusals = rec.refusals
    return Explanation(w.label(), w.label(), rec.backend, rec.preferred, refusals, advise(rec))


def advise(rec: DispatchRecord) -> list[str]:
    """What to change, read from the refusals' words and the call's envelope."""
    said = " ".join(rec.refusals.values()).lower()
    d = rec.q_shape[-1] if rec.q_shape else 0
    tips: list[str] = []
    if d and (d > 256 and ("256" in said or "head_dim" in said or "head dim" in said)):
        parts = math.ceil(d / 256)
        tips.append(f"head dim {d} > 256: split each head into {parts} heads of {math.ceil(d / parts / 8) * 8} "
                    f"(or project to a head dim <= 256); past 256 only the mem-efficient kernel runs")
    elif d and d % 8 and ("multiple of 8" in said or "head_dim" in said or "head dim" in said or "last dim" in said):
        tips.append(f"head dim {d} is not a multiple of 8: zero-pad q, k, v to {math.ceil(d / 8) * 8} "
                    f"(keep scale={d ** -0.5:.4g}) and slice the output")
    if "dtype" in said or "half, bfloat16" in said or "float16" in said:
        tips.append(f"dtype {rec.dtype}: run attention in bf16 or fp16 (torch.autocast, or cast q, k, v)")
    if "attn_mask" in said or "attention mask" in said or "mask" in said:
        if rec.mask == "bool":
            tips.append("boolean attn_mask: if it only encodes causality, pass is_causal=True instead; for padding, "
                        "pack the sequences (varlen / nested tensors) or drop the mask for unpadded batches")
        elif rec.mask == "additive":
            tips.append("additive float attn_mask: if it is only causal, pass is_causal=True; a bias that is "
                        "really a mask (0 / -inf) is better as is_causal or removed for unpadded batches")
        elif rec.mask != "none":
            tips.append(f"attn_mask {rec.mask}: pass is_causal=True where the mask is only causal")
    if rec.dropout and "dropout" in said:
        tips.append(f"dropout_p={rec.dropout:g}: pass dropout_p=0.0 at inference (model.eval())")
    if ("stride" in said or "contiguous" in said) and rec.contiguous and not all(rec.contiguous.values()):
        tips.append("non-contiguous q/k/v: call .contiguous() (or transpose after the projection, not before)")
    if "gqa" in said or "num_heads" in said or "heads" in said:
        if rec.gqa:
            tips.append("GQA: expand k/v to the query heads (repeat_interleave on dim 1) or drop enable_gqa")
    if "switched off" in said:
        tips.append("re-enable the faster backend: widen the sdpa_kernel([...]) list or remove enable_*_sdp(False)")
    if "causal" in said and rec.causal and rec.q_shape and rec.k_shape and rec.q_shape[2] != rec.k_shape[2]:
        tips.append("is_causal with Sq != Sk: pass attn_mask=causal_lower_right(Sq, Sk) (torch.nn.attention.bias)")
    if rec.mask.startswith("causal-bias:lower_right") and "never to this backend" in said:
        if rec.q_shape and rec.q_shape[2] == 1:
            tips.append("decode step (Sq=1) with causal_lower_right: drop the mask, one query sees every key")
        else:
            tips.append("causal_lower_right with Sq != Sk reaches only the mem-efficient kernel (still fused); "
                        "to test the others, pass the same rule as a boolean attn_mask and compare")
    if not tips and rec.refusals:
        tips.append("no simple fix known: see PyTorch's reasons above")
    return tips
