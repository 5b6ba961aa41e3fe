"""Users' own attention: `package.module:function` taking `(q, k, v, *, causal, scale)` in `[B, H, S, D]`.

k and v may have fewer heads than q (GQA): they arrive with Hkv heads, as SDPA's `enable_gqa=True` takes them, never
repeated for the function. `gqa_convention` says so in one sentence; commands print it up front (stages), the
variant's `supports` carries it as its note, and a function that raises on such a call gets that sentence in front
of its error (`GQAConventionError`), so the likely cause is named where the failure is. A function that also accepts `attn_mask=` is given the workload's mask
(bool, True = attend; or additive float) and `causal=False`; one that does not is rejected for masked workloads.
A function with a `kv_cache=` parameter is given, when the workload's keys and values are an FP8 KV cache
(`--kv-dtype`), the cache as stored (`workload.Fp8KV`: FP8 k/v `[B, Hkv, Sk, D]`, fp32 descales `[B, Hkv]`), so a
user's FP8 kernel reads the FP8 bytes; k/v are then the dequantised cache, what any other function gets. A
function with `q_descale=`, `k_descale=` and `v_descale=` parameters runs FP8 attention (`--dtype fp8`, which rejects
any other function): it is given e4m3 q, k, v `[B, H, S, D]` (quantized in the call, `variants.fp8`) and the fp32
descales `[B, Hkv]` in FlashAttention-3's convention, and returns bf16; without defaults for them it runs nothing else.
The output must be `[B, Hq, Sq, D]`: anything else (`None` included) is that function's `error` row, naming what it
returned and the shape expected (`base.check_output`, at every call site: `run()` and the model adapter). A function
that calls `sys.exit` is an `error` row too ("raised SystemExit(5)"), never the tool's exit; Ctrl-C still stops the run.
"""

from __future__ import annotations

import importlib
import inspect

import torch

from attnprof.errors import UsageError, VariantFailed, first_line
from attnprof.variants.base import Accepted, Rejected, Support, Variant, takes_keywords
from attnprof.variants.fp8 import quantized_qkv
from attnprof.workload import Inputs, Workload


class GQAConventionError(RuntimeError):
    """A user function raised on a GQA call: its error, after the sentence that says how k and v arrived."""


def gqa_convention(spec: str, workload: Workload) -> str | None:
    """The sentence that says how k and v reach `spec` for a GQA workload (None when Hkv == Hq)."""
    if not workload.gqa:
        return None
    return gqa_sentence(spec, workload.heads, workload.kv_heads)


def gqa_sentence(spec: str, heads: int, kv_heads: int) -> str:
    return (f"{spec}: k and v arrive with Hkv={kv_heads} heads (q has Hq={heads}), as SDPA's enable_gqa=True; "
            f"repeat them yourself if your function needs Hq={heads} heads")


def load_user_variant(spec: str) -> Variant:
    """`pkg.mod:fn` → Variant, or a UsageError that says what is wrong with it."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise UsageError(f"user variant {spec!r} must look like package.module:function")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UsageError(f"cannot import {module_name!r} for variant {spec!r}: {exc}") from None
    fn = module
    for part in attr.split("."):
        fn = getattr(fn, part, None)
        if fn is None:
            raise UsageError(f"{module_name!r} has no attribute {attr!r} (variant {spec!r})")
    if not callable(fn):
        raise UsageError(f"variant {spec!r} is not callable")
    takes_mask = _check_signature(spec, fn)
    takes_cache = takes_keywords(fn, "kv_cache")  # the FP8 cache as stored (see the module docstring)
    takes_descales = takes_keywords(fn, *DESCALES)  # FP8 attention (see the module docstring)
    fp8_only = takes_descales and _required(fn, *DESCALES)  # descales without defaults: FP8 attention only

    def run(inputs: Inputs) -> torch.Tensor:
        try:
            return call(inputs)  # its shape is checked where it is called
        except SystemExit as exc:  # the function's failure, not the tool's exit code (which the caller owns)
            raise VariantFailed(f"{spec} raised SystemExit({exc.code!r}): it called sys.exit") from None

    def call(inputs: Inputs) -> torch.Tensor:
        kwargs = {"causal": inputs.causal, "scale": inputs.scale}
        if inputs.attn_mask is not None:
            kwargs["attn_mask"] = inputs.attn_mask
        if inputs.fp8 is not None and takes_cache:
            kwargs["kv_cache"] = inputs.fp8
        q, k, v = inputs.q, inputs.k, inputs.v
        if inputs.fp8_qkv is not None:  # FP8 attention: only functions taking the descales get here (Variant.check)
            q, k, v = quantized_qkv(inputs)
            c = inputs.fp8_qkv
            kwargs.update(q_descale=c.q_descale, k_descale=c.k_descale, v_descale=c.v_descale)
        heads, kv_heads = q.shape[1], k.shape[1]
        if heads == kv_heads:
            return fn(q, k, v, **kwargs)
        try:
            return fn(q, k, v, **kwargs)
        except torch.OutOfMemoryError:
            raise  # out of memory is its own status, whatever the heads
        except (RuntimeError, ValueError, TypeError, IndexError, AssertionError) as exc:  # shape errors, asserts
            raise GQAConventionError(f"{gqa_sentence(spec, heads, kv_heads)}. It raised {first_line(exc)}") from exc

    def supports(workload: Workload) -> Support:
        if fp8_only and not workload.fp8_attention:
            return Rejected(f"{spec}: its q_descale, k_descale, v_descale have no defaults: FP8 attention only "
                            "(--dtype fp8)")
        if workload.mask != "none" and not takes_mask:
            return Rejected(f"{spec}: the workload has a {workload.mask} mask and the function takes no attn_mask=")
        return Accepted(gqa_convention(spec, workload) or "")

    run.__name__ = getattr(fn, "__name__", attr)
    return Variant(name=spec, fn=run, supports=supports, family="user",
                   fp8_path="the FP8 bytes, as kv_cache=" if takes_cache else None,
                   fp8_attention=("e4m3 q, k, v with q_descale, k_descale, v_descale" if takes_descales else None),
                   description=(inspect.getdoc(fn) or "user function").splitlines()[0],
                   recipe=(load_user_variant, (spec,)))


DESCALES = ("q_descale", "k_descale", "v_descale")


def _required(fn, *names: str) -> bool:
    """Whether any of `names` is a parameter of `fn` without a default."""
    params = inspect.signature(fn).parameters
    return any(params[n].default is inspect.Parameter.empty for n in names if n in params)


def _check_signature(spec: str, fn) -> bool:
    """Raise UsageError unless fn(q, k, v, *, causal=…, scale=…) binds; return whether it takes attn_mask."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return False  # builtins without a signature: trust the call, the output check still applies
    extra = {name: None for name in DESCALES if name in sig.parameters}  # FP8 attention's, when it takes them
    try:
        sig.bind(1, 2, 3, causal=True, scale=1.0, **extra)
    except TypeError as exc:
        raise UsageError(f"variant {spec!r} must accept (q, k, v, *, causal, scale): {exc}") from None
    params = sig.parameters
    return "attn_mask" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())
