"""Why a call did not get the fastest backend, in PyTorch's own words, and what to change.

"The fastest backend this device offers" is not a table either: it is what SDPA itself picks for the friendliest
inputs on this device (`torch._fused_sdp_choice` on half-precision, head dim 64, no mask, contiguous; cuDNN on an
H200, the CPU flash kernel on a CPU). Every backend ranked above the one that ran is then asked why it refused:
- on CUDA, `torch.backends.cuda.can_use_{flash,efficient,cudnn}_attention(SDPAParams(...), debug=True)`, the same
  checks SDPA runs, with their warnings captured (the reuse of `attnprof.variants.sdpa.backend_refusal` for a
  `Workload`; the real tensors' `SDPAParams` for a watched call);
- on the CPU, where PyTorch gives no debug text, by counterfactuals: the same call with one thing changed
  (dropout 0, no mask, contiguous, one dtype), each asked of `torch._fused_sdp_choice`; the change that lets the
  CPU flash kernel take the call is the reason.
A backend switched off with `sdpa_kernel` / `torch.backends.cuda.enable_*_sdp(False)` is reported as such.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from attnprof.audit.watch import DispatchRecord, watch
from attnprof.workload import Workload

_ENUM_NAME = {SDPBackend.FLASH_ATTENTION: "flash", SDPBackend.EFFICIENT_ATTENTION: "efficient",
              SDPBackend.CUDNN_ATTENTION: "cudnn", SDPBackend.MATH: "math"}
_ENABLED = {"flash": torch._C._get_flash_sdp_enabled, "efficient": torch._C._get_mem_efficient_sdp_enabled,
            "cudnn": torch._C._get_cudnn_sdp_enabled, "math": torch._C._get_math_sdp_enabled,
            "cpu_flash": torch._C._get_flash_sdp_enabled}


def _is_cuda(device) -> bool:
    return torch.device(device).type == "cuda"


@functools.cache
def _preferred(device_type: str, index: int | None) -> str:
    device = torch.device(device_type, index) if index is not None else torch.device(device_type)
    dtype = torch.float32
    if device_type == "cuda":
        dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    q = torch.empty(1, 8, 128, 64, dtype=dtype, device=device)
    with sdpa_kernel(list(_ENUM_NAME), set_priority=False):
        choice = SDPBackend(torch._fused_sdp_choice(q, q, q))
    name = _ENUM_NAME.get(choice, str(choice))
    return "cpu_flash" if device_type == "cpu" and name == "flash" else name


def preferred_backend(device) -> str | None:
    """What SDPA picks on this device for the friendliest inputs (None on devices other than CPU and CUDA)."""
    d = torch.device(device)
    return _preferred(d.type, d.index) if d.type in ("cpu", "cuda") else None


def ranked_backends(device) -> list[str]:
    """Backends of this device, fastest first: the preferred one, the other fused ones in PyTorch's priority, math."""
    first = preferred_backend(device)
    if not _is_cuda(device):
        return [first, "math"] if first != "math" else ["math"]
    get_order = getattr(torch._C, "_get_sdp_priority_order", None)  # torch >= 2.6
    order = [_ENUM_NAME.get(SDPBackend(i)) for i in get_order()] if get_order else ["flash", "efficient", "cudnn"]
    rest = [b for b in order if b in ("flash", "efficient", "cudnn") and b != first]
    return [first, *rest, "math"]


def faster_than(backend: str, device) -> list[str]:
    ranks = ranked_backends(device)
    return ranks[: ranks.index(backend)] if backend in ranks else ranks[:-1]


def _cuda_refusal(backend: str, params) -> str | None:
    from attnprof.variants.sdpa import can_use_reason

    return can_use_reason(backend, params)


def _cpu_flash_refusal(q, k, v, mask, dropout, causal, enable_gqa) -> str | None:
    def picks_flash(q, k, v, mask, dropout) -> bool:
        choice = torch._fused_sdp_choice(q, k, v, mask, dropout, causal, enable_gqa=enable_gqa)
        return SDPBackend(choice) == SDPBackend.FLASH_ATTENTION

    with torch.no_grad():
        if picks_flash(q, k, v, mask, dropout):
            return None
        flips: list[tuple[str, tuple]] = []
        if dropout:
            flips.append((f"dropout_p={dropout:g}", (q, k, v, mask, 0.0)))
        if mask is not None:
            flips.append((f"this attn_mask ({mask.dtype}, shape {list(mask.shape)})", (q, k, v, None, dropout)))
        if any(t.stride(-1) != 1 for t in (q, k, v)):
            flips.append(("the last dimension is not contiguous (stride != 1)",
                          (q.contiguous(), k.contiguous(), v.contiguous(), mask, dropout)))
        if len({q.dtype, k.dtype, v.dtype}) > 1:
            flips.append(("q, k and v have different dtypes", (q, k.to(q.dtype), v.to(q.dtype), mask, dropout)))
        said = [why for why, args in flips if picks_flash(*args)]
    if said:
        return "the CPU flash kernel refuses " + "; ".join(said) + " (torch._fused_sdp_choice, one change at a time)"
    return "the CPU flash kernel refuses these inputs (torch._fused_sdp_choice picks math; no single change found)"


def _disabled(backend: str) -> str | None:
    if not _ENABLED[backend]():
        flag = {"efficient": "mem_efficient", "cpu_flash": "flash"}.get(backend, backend)
        return f"{backend} is switched off here (sdpa_kernel(...) without it, or torch.backends.cuda.enable_{flag}_sdp(False))"
    return None


def refusals_for_call(q, k, v, mask, dropout: float, causal: bool, enable_gqa: bool, *, ran: str) -> dict[str, str]:
    """For one call's real tensors: each backend faster than `ran` → why PyTorch refused it."""
    out: dict[str, str] = {}
    plain_mask = mask if isinstance(mask, torch.Tensor) and type(mask) is torch.Tensor else None
    variant = getattr(getattr(mask, "variant", None), "name", None)  # torch.nn.attention.bias.CausalBias
    bias_note = None
    if variant is not None:
        causal = True
        if variant == "LOWER_RIGHT" and q.shape[-2] != k.shape[-2]:
            bias_note = (f"attn_mask is causal_lower_right with Sq={q.shape[-2]} != Sk={k.shape[-2]}: "
                         "torch.nn.attention.bias sends it to the mem-efficient kernel (or a materialised mask), "
                         "never to this backend")
    params = None
    for backend in faster_than(ran, q.device):
        why = _disabled(backend) or bias_note
        if why is None and _is_cuda(q.device):
            if params is None:
                params = torch.backends.cuda.SDPAParams(q, k, v, plain_mask, dropout, causal, enable_gqa)
            why = _cuda_refusal(backend, params)
        elif why is None:
            why = _cpu_flash_refusal(q, k, v, plain_mask, dropout, causal, enable_gqa)
        out[backend] = why or f"PyTorch's checks accept {backend} here, but SDPA ran {ran} (its priority order)"
    return out


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
    from attnprof.variants.sdpa import backend_refusal, sdpa_call

    with watch(explain=False) as calls:
        sdpa_call(w.make_inputs(0))
    rec = calls[-1]
    if _is_cuda(w.device) and rec.fell_back and rec.mask == "none" and not rec.mask.startswith("causal-bias"):
        # the same SDPAParams checks, through the variants' helper (the one `stages` uses to reject pinned SDPA)
        rec.refusals = {b: _disabled(b) or backend_refusal(b, w) or (
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
