"""The attention implementations a transformers model can run, by name: what to pass and what to wrap it in.

One small map, shared by `attnprof verify --model` and the serving commands:

| name | `attn_implementation` | active while it runs |
| --- | --- | --- |
| eager | "eager" | nothing (transformers' own matmul/softmax; the fp32 run is the reference) |
| sdpa | "sdpa" | nothing: PyTorch picks the backend |
| sdpa-flash / -efficient / -cudnn / -math | "sdpa" | `sdpa_kernel([that backend])`: pinned, refused when it cannot run |
| flex_attention (alias flex) | "flex_attention" | nothing |
| kernel | "attnprof_kernel", registered here from the `kernel` variant | nothing |
| flash-attn-4, sageattention, … | "attnprof_<name>", a third-party kernel's registry variant (`variants.THIRD_PARTY`) | nothing |
| package.module:function | "attnprof_user_package_module_function", registered here from its variant | nothing |

Everything that is not transformers' own is a registry `Variant` (the stage-four kernel, third-party kernels in their
own conventions, users' functions) and reaches
the model through one adapter, `register_variant`: an `AttentionInterface` function that turns transformers'
call (query `[B, Hq, Sq, D]`, key/value `[B, Hkv, Sk, D]`, a boolean `[B, 1, Sq, Sk]` mask or None) into `Inputs`,
asks `Variant.supports` about that call's `Workload` (a refusal raises ValueError with the variant's own reason) and
returns `[B, Sq, Hq, D]`. Its mask function is transformers' `sdpa_mask`, so the variant gets the same mask SDPA
gets: None with causal=True when nothing is padded (decode included: one query sees every key), else the boolean
mask with causal=False. Causal is bottom-right aligned, as everywhere.

Nothing falls back: an implementation that cannot run here comes back with `rejected` set to the reason, which
`Variant.supports` gives for the model's attention call (`models.attention_workload`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import torch

from attnprof.dispatch.sdpa_checks import BACKENDS, backend_refusal
from attnprof.errors import UsageError
from attnprof.models.fp8_cache import FP8_DTYPES, fp8_of, static_fp8
from attnprof.models.kernel_cache import kernel_over_cache, register_cache_kernel
from attnprof.variants import THIRD_PARTY, adapters
from attnprof.variants.base import Variant, check_output, takes_keywords
from attnprof.variants.kernel_hub import DEFAULT, kernel_variant, load
from attnprof.variants.user import load_user_variant
from attnprof.workload import DTYPES, Inputs, Workload

PINNED = ("flash", "efficient", "cudnn", "math")
KNOWN = ("eager", "sdpa", *(f"sdpa-{b}" for b in PINNED), "flex_attention", "kernel")
ALIASES = {"flex": "flex_attention"}
_NOT_TAKEN = ("sliding_window", "softcap", "s_aux")  # attention features a `Variant` call cannot express
# ... except the `kernel` variant's, whose repo says it computes them (`MODEL_FEATURES`, flash-attn's argument names)
_FLASH_NAMES = {"softcap": "softcap", "sliding_window": "window_size", "s_aux": "s_aux"}
TAKES: dict[str, tuple[str, ...]] = {}  # attn_implementation -> the features of `_NOT_TAKEN` its adapter passes on
READS_FP8: set[str] = set()  # attn_implementations that attend over an FP8 static cache's bytes (`fp8_cache_refusal`)


def fp8_cache_refusal(impl: AttentionImpl) -> str | None:
    """None when `impl` attends over an FP8 KV cache as stored (`models.fp8_cache.Fp8StaticCache`), else why not."""
    if impl.rejected:
        return impl.rejected
    if impl.attn_implementation in READS_FP8:
        return None
    return (f"{impl.name} reads no FP8 KV cache: only a kernel whose flash_attn_with_kvcache takes k_descale/v_descale "
            "attends over the FP8 bytes (dequantising the whole cache every step is not what a serving engine does)")


def takes(attn_implementation: str) -> tuple[str, ...]:
    """The model features (`_NOT_TAKEN` names) the registered implementation computes; () for every other one."""
    return TAKES.get(attn_implementation, ())


@dataclass(frozen=True)
class AttentionImpl:
    """`attn_implementation` to build the model with, a context active while it runs, or why it cannot run."""

    name: str
    attn_implementation: str
    context: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext
    rejected: str | None = None
    description: str = ""


def resolve_impls(spec: str | None, device: str, *, workload: Workload | None = None,
                  kernel=None) -> list[AttentionImpl]:
    """`"eager,sdpa,pkg.mod:fn"` (default: every KNOWN name) → implementations, unknown names a UsageError.

    `workload` (the model's attention call, `models.attention_workload`) lets a pinned SDPA backend and every
    variant be refused up front with its own reason. `kernel` is the parsed `--kernel` (default flash-triton).
    """
    names = [n.strip() for n in spec.split(",") if n.strip()] if spec else list(KNOWN)
    if not names:
        raise UsageError("the list of attention implementations is empty; known: " + ", ".join(KNOWN))
    out = []
    for raw in dict.fromkeys(names):
        name = ALIASES.get(raw, raw)
        if ":" in name:
            out.append(from_variant(load_user_variant(name), workload, description="user function"))
        elif name in ("eager", "sdpa", "flex_attention"):
            out.append(AttentionImpl(name, name, description=f"transformers' {name!r}"))
        elif name.startswith("sdpa-") and name[5:] in PINNED:
            out.append(_pinned(name[5:], device, workload))
        elif name == "kernel":
            out.append(from_variant(kernel_variant(kernel or DEFAULT), workload,
                                    description="stage-four kernel via the kernels library"))
        elif name in THIRD_PARTY:  # asked for by name only: a missing package is a rejected row with the pip command
            out.append(from_variant(adapters.named(name), workload,
                                    description=f"third-party kernel {name} in its own convention"))
        else:
            raise UsageError(f"unknown attention implementation {raw!r}; known: {', '.join(KNOWN)}, flex, "
                             f"{', '.join(THIRD_PARTY)}, or package.module:function")
    return out


def _pinned(backend: str, device: str, workload: Workload | None) -> AttentionImpl:
    from torch.nn.attention import sdpa_kernel

    reason = backend_refusal(backend, workload) if workload is not None else None
    if reason is None and backend != "math" and not device.startswith("cuda") and backend != "flash":
        reason = f"SDPA's {backend} backend has no CPU kernel"
    return AttentionImpl(f"sdpa-{backend}", "sdpa", context=lambda: sdpa_kernel([BACKENDS[backend]]),
                         rejected=f"sdpa-{backend}: {reason}" if reason else None,
                         description=f"transformers' 'sdpa' with sdpa_kernel([{backend}])")


def from_variant(variant: Variant, workload: Workload | None, *, description: str = "") -> AttentionImpl:
    """A registry variant as a model implementation: refused with `supports(workload)`'s reason, else registered."""
    if workload is not None:
        verdict = variant.check(workload)
        if not verdict.ok:
            return AttentionImpl(variant.name, "", rejected=verdict.reason, description=description)
    return AttentionImpl(variant.name, register_variant(variant), description=description or variant.description)


def attn_name(variant: Variant) -> str:
    """The `attn_implementation` name a variant is registered under: no ":" or "/" (transformers reads those as Hub
    kernel repos) and no "flash" (read as the flash-attn package)."""
    base = "kernel" if variant.name == "kernel" else "user_" + variant.name if variant.family == "user" else variant.name
    return "attnprof_" + "".join(c if c.isalnum() else "_" for c in base).replace("flash", "fl_ash")


def register_variant(variant: Variant) -> str:
    """Register `variant` with transformers' `AttentionInterface` (and `sdpa_mask` as its mask function); return the
    `attn_implementation` name. See the module docstring for what the adapter does."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    cache_kernel = _cache_kernel(variant)  # loaded and registered here, outside any compiled region
    repo_takes = set(getattr(cache_kernel, "MODEL_FEATURES", ()))
    taken = tuple(f for f in _NOT_TAKEN if _FLASH_NAMES[f] in repo_takes)
    refusals: dict[tuple, str | None] = {}  # one supports() per distinct call envelope, not per layer and step

    @torch.compiler.assume_constant_result  # under torch.compile: decided while tracing, no Workload in the graph
    def refusal(envelope: tuple) -> str | None:
        if envelope not in refusals:
            verdict = variant.supports(_envelope_workload(envelope))
            refusals[envelope] = None if verdict.ok else verdict.reason
        return refusals[envelope]

    def forward(module, query, key, value, attention_mask, dropout: float = 0.0, scaling: float | None = None,
                is_causal: bool | None = None, **kwargs):
        # query [B, Hq, Sq, D], key/value [B, Hkv, Sk, D]; attention_mask bool [B, 1, Sq, Sk] or None
        asked = {f: kwargs[f] for f in _NOT_TAKEN if kwargs.get(f) is not None}
        for feature in asked:
            if feature not in taken:
                raise ValueError(f"{variant.name}: {feature} is not supported by an attnprof variant")
        if dropout and module.training:
            raise ValueError(f"{variant.name}: dropout is not supported (forward-only inference)")
        scale = scaling if scaling is not None else query.shape[-1] ** -0.5
        causal = attention_mask is None and bool(is_causal if is_causal is not None else
                                                 getattr(module, "is_causal", True))
        if causal and attention_mask is None and key.shape[2] > query.shape[2] > 1:
            # transformers drops the mask here only where SDPA's is_causal (top-left aligned) is right: a static
            # cache's first call (prefill), whose keys past Sq are not written yet. Top-left over Sk keys = causal over
            # the first Sq; taken bottom-right (flash's rule) over all Sk, the queries read the unwritten keys.
            key, value = key[:, :, :query.shape[2]], value[:, :, :query.shape[2]]
        kind = "none" if attention_mask is None else "bool" if attention_mask.dtype == torch.bool else "additive"
        cache = cache_kernel if kind == "bool" else None
        if cache is not None:  # a bool mask over a KV cache (static cache): our kernel's flash_attn_with_kvcache
            kind, causal = "none", True
        # plain ints and strings only: dynamo cannot keep a Workload (a frozen dataclass made while tracing) alive
        envelope = (*(int(n) for n in query.shape), int(key.shape[1]), int(key.shape[2]), str(query.dtype),
                    bool(causal), kind, str(query.device), bool(query.requires_grad))
        reason = refusal(envelope)
        if reason is not None:
            raise ValueError(reason)
        window = int(asked["sliding_window"]) - 1 if "sliding_window" in asked else -1  # keys i - w < j <= i
        fp8 = static_fp8(module, key, value)  # an Fp8StaticCache's bytes (serve --kv-dtype fp8), compiled or not
        if fp8 is None and key.dtype in FP8_DTYPES:
            raise ValueError(f"{variant.name}: FP8 keys from a cache that is not this layer's Fp8StaticCache")
        if fp8 is not None and cache is None:
            raise ValueError(f"{variant.name}: an FP8 static cache is read through flash_attn_with_kvcache only, "
                             "which this call (no KV-cache mask, or a variant without it) does not reach")
        if fp8 is None and not torch.compiler.is_compiling():
            fp8 = fp8_of(key, value)  # an Fp8Cache's bytes riding on its dequantised keys (verify --model)
        if cache is not None:
            out = kernel_over_cache(cache, variant.name, query, key, value, attention_mask, scale,
                                    softcap=asked.get("softcap") or 0.0, window_left=window, s_aux=asked.get("s_aux"),
                                    fp8=fp8)
            check_output(variant.name, out.transpose(1, 2), query, " inside the model")
            return out, None
        if asked:  # no mask: the kernel repo's own flash_attn_func takes the features (the Variant call has no place)
            out = cache_kernel.flash_attn_func(
                *(t.transpose(1, 2) for t in (query, key, value)), softmax_scale=scale, causal=causal,
                softcap=asked.get("softcap") or 0.0, window_size=(window, window) if window >= 0 else (-1, -1),
                s_aux=asked.get("s_aux"))  # [B, Sq, Hq, D] from [B, S, H, D] views, as transformers' flash path
            check_output(variant.name, out.transpose(1, 2), query, " inside the model")
            return out.contiguous(), None
        valid = attention_mask if attention_mask is not None and attention_mask.dtype == torch.bool else None
        # an FP8 cache's bytes go to a variant through Inputs only without a mask (our kernel reads them through
        # flash_attn_with_kvcache, which takes lengths, not masks: with a mask it reads the same values dequantised)
        # or to a user function, which gets the mask too
        out = variant.fn(Inputs(query, key, value, causal=causal, scale=scale, attn_mask=attention_mask, valid=valid,
                                fp8=fp8 if attention_mask is None or variant.family == "user" else None))
        check_output(variant.name, out, query, " inside the model")
        return out.transpose(1, 2).contiguous(), None  # [B, Hq, Sq, D] -> [B, Sq, Hq, D], as transformers expects

    name = attn_name(variant)
    if cache_kernel is not None and takes_keywords(cache_kernel.flash_attn_with_kvcache, "k_descale", "v_descale"):
        READS_FP8.add(name)
    AttentionInterface.register(name, forward)
    AttentionMaskInterface.register(name, sdpa_mask)
    TAKES[name] = taken
    return name


def _cache_kernel(variant: Variant):
    """The loaded kernel module when `variant` is a `kernel` variant whose repo has `flash_attn_with_kvcache`."""
    spec = getattr(variant.fn, "kernel_spec", None)
    if variant.family != "kernel" or spec is None:
        return None
    module = load(spec)
    if not callable(getattr(module, "flash_attn_with_kvcache", None)):
        return None
    register_cache_kernel(module)
    return module


_DTYPE_NAMES = {str(v): k for k, v in DTYPES.items()}  # "torch.float16" -> "fp16": the envelope carries str(dtype)


def _envelope_workload(envelope: tuple) -> Workload:
    """One attention call of the model (its envelope: shapes, dtype, causal, mask kind, device) as a `Workload`."""
    b, hq, sq, d, hkv, sk, dtype, causal, kind, device, _grad = envelope
    return Workload(batch=b, heads=hq, kv_heads=hkv, seq=sq, kv_seq=sk, head_dim=d, dtype=_DTYPE_NAMES.get(dtype, "fp32"),
                    causal=causal, mask=kind, device=device)
