"""The attention implementations a transformers model can run, by name: what to pass and what to wrap it in.

One small map, shared by `attnprof verify --model` and the serving commands:

| name | `attn_implementation` | active while it runs |
| --- | --- | --- |
| eager | "eager" | nothing (transformers' own matmul/softmax; the fp32 run is the reference) |
| sdpa | "sdpa" | nothing: PyTorch picks the backend |
| sdpa-flash / -efficient / -cudnn / -math | "sdpa" | `sdpa_kernel([that backend])`: pinned, refused when it cannot run |
| flex_attention (alias flex) | "flex_attention" | nothing |
| kernel | what `attnprof.variants.kernel_hub.register_transformers_attention()` registered | nothing |
| package.module:function | "attnprof_user_package_module_function", registered here | nothing |

A user function has the signature of `attnprof.variants.user` (`fn(q, k, v, *, causal, scale, attn_mask=None)`,
`[B, H, S, D]`, GQA by fewer kv heads, causal bottom-right aligned, bool mask True = attend). It is wrapped as a
transformers attention function and registered with `AttentionInterface`, together with transformers' `sdpa_mask`
as its mask function in `AttentionMaskInterface`, so the model hands it the same boolean `[B, 1, Sq, Sk]` mask
(or None with `causal=True` when nothing is padded) that SDPA gets.

Nothing falls back: an implementation that cannot run here comes back with `rejected` set to the reason.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass

from attnprof.errors import UsageError

PINNED = ("flash", "efficient", "cudnn", "math")
KNOWN = ("eager", "sdpa", *(f"sdpa-{b}" for b in PINNED), "flex_attention", "kernel")
ALIASES = {"flex": "flex_attention"}


@dataclass(frozen=True)
class AttentionImpl:
    """`attn_implementation` to build the model with, a context active while it runs, or why it cannot run."""

    name: str
    attn_implementation: str
    context: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext
    rejected: str | None = None
    description: str = ""


def resolve_impls(spec: str | None, device: str, *, workload=None) -> list[AttentionImpl]:
    """`"eager,sdpa,pkg.mod:fn"` (default: every KNOWN name) → implementations, unknown names a UsageError.

    `workload` (an `attnprof.workload.Workload` describing the model's attention call: heads, kv heads, head dim,
    dtype, mask kind, device) lets a pinned SDPA backend be refused up front with PyTorch's own reason.
    """
    names = [n.strip() for n in spec.split(",") if n.strip()] if spec else list(KNOWN)
    if not names:
        raise UsageError("the list of attention implementations is empty; known: " + ", ".join(KNOWN))
    out = []
    for raw in dict.fromkeys(names):
        name = ALIASES.get(raw, raw)
        if ":" in name:
            out.append(AttentionImpl(name, register_user_function(name), description="user function"))
        elif name in ("eager", "sdpa", "flex_attention"):
            out.append(AttentionImpl(name, name, description=f"transformers' {name!r}"))
        elif name.startswith("sdpa-") and name[5:] in PINNED:
            out.append(_pinned(name[5:], device, workload))
        elif name == "kernel":
            out.append(_kernel())
        else:
            raise UsageError(f"unknown attention implementation {raw!r}; known: {', '.join(KNOWN)}, flex, "
                             "or package.module:function")
    return out


def _pinned(backend: str, device: str, workload) -> AttentionImpl:
    from torch.nn.attention import sdpa_kernel

    from attnprof.audit.sdpa_checks import BACKENDS, backend_refusal

    reason = backend_refusal(backend, workload) if workload is not None else None
    if reason is None and backend != "math" and not device.startswith("cuda") and backend != "flash":
        reason = f"SDPA's {backend} backend has no CPU kernel"
    return AttentionImpl(f"sdpa-{backend}", "sdpa", context=lambda: sdpa_kernel([BACKENDS[backend]]),
                         rejected=f"sdpa-{backend}: {reason}" if reason else None,
                         description=f"transformers' 'sdpa' with sdpa_kernel([{backend}])")


def _kernel() -> AttentionImpl:
    from attnprof.variants import kernel_hub

    register = getattr(kernel_hub, "register_transformers_attention", None)
    if register is None:
        return AttentionImpl("kernel", "", rejected="kernel: attnprof.variants.kernel_hub has no "
                                                    "register_transformers_attention() yet")
    got = register()
    if isinstance(got, str):
        return AttentionImpl("kernel", got, description="stage-four kernel via the kernels library")
    return AttentionImpl("kernel", "", rejected=f"kernel: {getattr(got, 'reason', got)}")


def register_user_function(spec: str) -> str:
    """Load `pkg.mod:fn`, wrap it as a transformers attention function, register it and its mask; return its name."""
    from attnprof.variants.user import load_user_variant

    load_user_variant(spec)  # the same import and signature checks (UsageError) as the kernel-level variant
    module_name, _, attr = spec.partition(":")
    fn = __import__(module_name, fromlist=["_"])
    for part in attr.split("."):
        fn = getattr(fn, part)
    params = inspect.signature(fn).parameters
    takes_mask = "attn_mask" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())

    def forward(module, query, key, value, attention_mask, dropout: float = 0.0, scaling: float | None = None,
                is_causal: bool | None = None, **kwargs):
        # query [B, Hq, Sq, D], key/value [B, Hkv, Sk, D]; attention_mask bool [B, 1, Sq, Sk] or None
        scale = scaling if scaling is not None else query.shape[-1] ** -0.5
        call = {"scale": scale}
        if attention_mask is not None:
            if not takes_mask:
                raise UsageError(f"{spec}: this batch is padded and the function takes no attn_mask=")
            call.update(causal=False, attn_mask=attention_mask)
        else:
            causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
            call["causal"] = bool(causal)
        out = fn(query, key, value, **call)
        if tuple(getattr(out, "shape", ())) != tuple(query.shape):
            got = tuple(out.shape) if hasattr(out, "shape") else type(out).__name__
            raise UsageError(f"{spec} returned {got} inside the model, expected {tuple(query.shape)} [B, Hq, Sq, D]")
        return out.transpose(1, 2).contiguous(), None  # (B, Sq, Hq, D), as transformers expects

    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    # no ":" or "/" (transformers reads those as Hub kernel repos) and no "flash" (read as the flash-attn package)
    name = "attnprof_user_" + "".join(c if c.isalnum() else "_" for c in spec).replace("flash", "fl_ash")
    AttentionInterface.register(name, forward)
    AttentionMaskInterface.register(name, sdpa_mask)
    return name


ModelImpl = AttentionImpl  # the name serving/throughput.py used for the same record
