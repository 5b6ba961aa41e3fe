"""Stage three: `torch.nn.functional.scaled_dot_product_attention`, PyTorch's choice and each backend pinned.

`sdpa` lets PyTorch choose (on an H200 that is cuDNN, not FlashAttention-2; on a CPU, the CPU flash kernel).
`sdpa-flash`, `sdpa-efficient`, `sdpa-cudnn` and `sdpa-math` pin one backend with `sdpa_kernel`. A pinned backend
that cannot take the workload is rejected before it runs with PyTorch's own reason, read from
`torch.backends.cuda.can_use_*(SDPAParams(...), debug=True)`: the same checks SDPA itself runs
(`dispatch.sdpa_checks.backend_refusal`).

Causal with Sq != Sk uses `causal_lower_right` (bottom-right aligned, as FlashAttention and KV caches do): plain
`is_causal=True` would align the diagonal top-left.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel
from torch.nn.attention.bias import causal_lower_right

from attnprof.dispatch.sdpa_checks import BACKENDS, backend_refusal
from attnprof.variants.base import Accepted, Rejected, Support, Variant
from attnprof.workload import Inputs, Workload


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


def _pinned(backend: str) -> Variant:
    def run(inputs: Inputs) -> torch.Tensor:
        with sdpa_kernel([BACKENDS[backend]]):
            return sdpa_call(inputs)

    def supports(workload: Workload) -> Support:
        reason = backend_refusal(backend, workload)
        return Accepted() if reason is None else Rejected(f"sdpa-{backend}: {reason}")

    run.__name__ = f"sdpa_{backend}"
    return Variant(name=f"sdpa-{backend}", fn=run, supports=supports, family="extra",
                   description=f"SDPA pinned to the {backend} backend with sdpa_kernel", recipe=(_pinned, (backend,)))


SDPA = Variant(name="sdpa", fn=sdpa_call, family="sdpa",
               description="F.scaled_dot_product_attention, PyTorch's own backend choice")
PINNED = {v.name: v for v in (_pinned(b) for b in BACKENDS)}
