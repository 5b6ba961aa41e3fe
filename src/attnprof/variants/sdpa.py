"""Stage three: `torch.nn.functional.scaled_dot_product_attention`, PyTorch's choice and each backend pinned.

`sdpa` lets PyTorch choose (on an H200 that is cuDNN, not FlashAttention-2; on a CPU, the CPU flash kernel).
`sdpa-flash`, `sdpa-efficient`, `sdpa-cudnn` and `sdpa-math` pin one backend with `sdpa_kernel`. A pinned backend
that cannot take the workload is rejected before it runs with PyTorch's own reason, read from
`torch.backends.cuda.can_use_*(SDPAParams(...), debug=True)`: the same checks SDPA itself runs.

Causal with Sq != Sk uses `causal_lower_right` (bottom-right aligned, as FlashAttention and KV caches do): plain
`is_causal=True` would align the diagonal top-left.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right

from attnprof.stderr import c10_warnings, capture_fd2
from attnprof.variants.base import Accepted, Rejected, Support, Variant
from attnprof.workload import Inputs, Workload

BACKENDS: dict[str, SDPBackend] = {
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "math": SDPBackend.MATH,
}


def sdpa_call(inputs: Inputs) -> torch.Tensor:
    """One SDPA call with the workload's mask, GQA and scale. `[B, H, S, D]` in and out."""
    q, k, v = inputs.q, inputs.k, inputs.v
    kwargs: dict = {"scale": inputs.scale}
    if k.shape[1] != q.shape[1]:
        kwargs["enable_gqa"] = True
    if inputs.attn_mask is not None:
        kwargs["attn_mask"] = inputs.attn_mask
    elif inputs.causal:
        if q.shape[2] == k.shape[2]:
            kwargs["is_causal"] = True
        else:
            kwargs["attn_mask"] = causal_lower_right(q.shape[2], k.shape[2])
    return F.scaled_dot_product_attention(q, k, v, **kwargs)


def sdpa_params(workload: Workload, *, dropout: float = 0.0) -> torch.backends.cuda.SDPAParams:
    """The `SDPAParams` SDPA would build for this workload, from unfilled tensors of the real shapes and strides."""
    inputs = _empty_inputs(workload)
    mask = inputs.attn_mask
    return torch.backends.cuda.SDPAParams(inputs.q, inputs.k, inputs.v, mask, dropout, inputs.causal, workload.gqa)


def _empty_inputs(workload: Workload) -> Inputs:
    # The checks read shapes, strides, dtypes and devices, never values: a tiny batch of uninitialised memory does.
    small = workload.replace(batch=1) if workload.mask == "none" else workload
    with torch.device(workload.device):
        return _unfilled(small)


def _unfilled(w: Workload) -> Inputs:
    def make(h: int, s: int) -> torch.Tensor:
        if w.transposed:
            return torch.empty(w.batch, s, h, w.head_dim, dtype=w.torch_dtype).transpose(1, 2)
        return torch.empty(w.batch, h, s, w.head_dim, dtype=w.torch_dtype)

    valid = w.valid_mask(w.device)
    mask = None
    if w.mask != "none":
        mask = valid if w.mask != "additive" else torch.zeros(valid.shape, dtype=w.torch_dtype)
    return Inputs(make(w.heads, w.seq), make(w.kv_heads, w.kv_seq), make(w.kv_heads, w.kv_seq),
                  causal=w.causal and mask is None, scale=w.scale, attn_mask=mask, valid=valid)


_CAN_USE: dict[str, Callable] = {
    "flash": torch.backends.cuda.can_use_flash_attention,
    "efficient": torch.backends.cuda.can_use_efficient_attention,
    "cudnn": torch.backends.cuda.can_use_cudnn_attention,
}


def backend_refusal(backend: str, workload: Workload, *, dropout: float = 0.0) -> str | None:
    """None when `backend` can run the workload here, else the reason in PyTorch's own words."""
    if backend == "math":
        return None
    if not workload.device.startswith("cuda"):
        return _cpu_refusal(backend, workload)
    return can_use_reason(backend, sdpa_params(workload, dropout=dropout))


def can_use_reason(backend: str, params) -> str | None:
    """None when `can_use_<backend>_attention(params)` holds, else PyTorch's own reasons for refusing.

    The reasons are `TORCH_WARN`s: depending on how the binding was built they arrive as Python warnings or are
    printed by c10 on fd 2, so both are read.
    """
    with capture_fd2() as printed, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ok = _CAN_USE[backend](params, debug=True)
    if ok:
        return None
    # c10's format when it matches; any other text the check printed is still PyTorch's words, kept as is
    from_c10 = c10_warnings(printed) or [line.strip() for line in printed]
    said = [str(w.message).split(" (Triggered internally")[0].strip() for w in caught] + from_c10
    said = list(dict.fromkeys(s for s in said if s))
    return "; ".join(said) or f"torch.backends.cuda.can_use_{backend}_attention returned False with no reason"


def _cpu_refusal(backend: str, workload: Workload) -> str | None:
    if backend != "flash":
        return f"SDPA's {backend} backend has no CPU kernel (on the CPU only flash and math exist)"
    inputs = _empty_inputs(workload)
    choice = torch._fused_sdp_choice(inputs.q, inputs.k, inputs.v, inputs.attn_mask, 0.0, inputs.causal,
                                     scale=inputs.scale, enable_gqa=workload.gqa)
    if SDPBackend(choice) == SDPBackend.FLASH_ATTENTION:
        return None
    return "the CPU flash kernel refuses these inputs (torch._fused_sdp_choice picks math)"


def _pinned(backend: str) -> Variant:
    def run(inputs: Inputs) -> torch.Tensor:
        with sdpa_kernel([BACKENDS[backend]]):
            return sdpa_call(inputs)

    def supports(workload: Workload) -> Support:
        reason = backend_refusal(backend, workload)
        return Accepted() if reason is None else Rejected(f"sdpa-{backend}: {reason}")

    run.__name__ = f"sdpa_{backend}"
    return Variant(name=f"sdpa-{backend}", fn=run, supports=supports, family="extra",
                   description=f"SDPA pinned to the {backend} backend with sdpa_kernel")


SDPA = Variant(name="sdpa", fn=sdpa_call, family="sdpa",
               description="F.scaled_dot_product_attention, PyTorch's own backend choice")
PINNED = {v.name: v for v in (_pinned(b) for b in BACKENDS)}
