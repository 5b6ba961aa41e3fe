"""What SDPA's own checks say: the fastest backend of a device, and why a backend refuses a call or a workload.

The audit (`watch`, `explain`, the envelope probe) and the variants (`sdpa-<backend>`'s `supports`) ask the same
questions, so the answers live here, below both:
- "the fastest backend this device offers" is what SDPA itself picks for the friendliest inputs on it
  (`torch._fused_sdp_choice` on half precision, head dim 64, no mask, contiguous): cuDNN on an H200, the CPU flash
  kernel on a CPU; the others follow in PyTorch's priority order, math last;
- on CUDA a backend's refusal is `torch.backends.cuda.can_use_{flash,efficient,cudnn}_attention(SDPAParams(...),
  debug=True)`, the checks SDPA runs, with their `TORCH_WARN` reasons read from Python warnings and from fd 2;
- on the CPU, where PyTorch gives no debug text, by counterfactuals: the same call with one thing changed
  (dropout 0, no mask, contiguous, one dtype), each asked of `torch._fused_sdp_choice`;
- a backend switched off with `sdpa_kernel` / `torch.backends.cuda.enable_*_sdp(False)` is reported as such.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from attnprof.stderr import c10_warnings, capture_fd2
from attnprof.workload import Inputs, Workload

BACKENDS: dict[str, SDPBackend] = {
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "math": SDPBackend.MATH,
}


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


_ENUM_NAME = {SDPBackend.FLASH_ATTENTION: "flash", SDPBackend.EFFICIENT_ATTENTION: "efficient",
              SDPBackend.CUDNN_ATTENTION: "cudnn", SDPBackend.MATH: "math"}
_ENABLED = {"flash": torch._C._get_flash_sdp_enabled, "efficient": torch._C._get_mem_efficient_sdp_enabled,
            "cudnn": torch._C._get_cudnn_sdp_enabled, "math": torch._C._get_math_sdp_enabled,
            "cpu_flash": torch._C._get_flash_sdp_enabled}


def is_cuda(device) -> bool:
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
    if not is_cuda(device):
        return [first, "math"] if first != "math" else ["math"]
    get_order = getattr(torch._C, "_get_sdp_priority_order", None)  # torch >= 2.6
    order = [_ENUM_NAME.get(SDPBackend(i)) for i in get_order()] if get_order else ["flash", "efficient", "cudnn"]
    rest = [b for b in order if b in ("flash", "efficient", "cudnn") and b != first]
    return [first, *rest, "math"]


def faster_than(backend: str, device) -> list[str]:
    ranks = ranked_backends(device)
    return ranks[: ranks.index(backend)] if backend in ranks else ranks[:-1]


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


def disabled(backend: str) -> str | None:
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
        why = disabled(backend) or bias_note
        if why is None and is_cuda(q.device):
            if params is None:
                params = torch.backends.cuda.SDPAParams(q, k, v, plain_mask, dropout, causal, enable_gqa)
            why = can_use_reason(backend, params)
        elif why is None:
            why = _cpu_flash_refusal(q, k, v, plain_mask, dropout, causal, enable_gqa)
        out[backend] = why or f"PyTorch's checks accept {backend} here, but SDPA ran {ran} (its priority order)"
    return out


