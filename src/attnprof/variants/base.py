"""What a variant is: a named attention implementation that says, before it runs, whether it can run a workload.

Nothing falls back silently: `supports(workload)` returns `Accepted` or `Rejected(reason)`, and every command
reports rejected variants with their reason instead of running something else in their place.
Every variant's callable takes `Inputs` (q `[B, Hq, Sq, D]`, k/v `[B, Hkv, Sk, D]`) and returns `[B, Hq, Sq, D]`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from attnprof.errors import VariantFailed
from attnprof.workload import Inputs, Workload


@dataclass(frozen=True)
class Accepted:
    note: str = ""

    ok = True


@dataclass(frozen=True)
class Rejected:
    reason: str

    ok = False


Support = Accepted | Rejected


def takes_keywords(fn, *names: str) -> bool:
    """Whether callable `fn`'s signature names every one of `names` (False when it is not callable or has no
    signature to read)."""
    if not callable(fn):
        return False
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return all(n in params for n in names)


def always(workload: Workload) -> Support:
    return Accepted()


@dataclass(frozen=True)
class Variant:
    """`fn(inputs) -> out [B, Hq, Sq, D]`; `supports(workload)` decides before anything runs."""

    name: str
    fn: Callable[[Inputs], torch.Tensor]
    supports: Callable[[Workload], Support] = always
    description: str = ""
    # The stage of the tutorial this variant stands for, or "extra" / "user".
    family: str = "extra"
    # For variants that cannot dispatch elsewhere (flex, our kernel): the backend they are. SDPA variants leave it
    # None: their backend is read from what ran.
    backend: str | None = None
    # How it reads an FP8 KV cache (`Workload.kv_dtype`) when it has a path for one ("flash_attn_with_kvcache"):
    # None means it is given the cache dequantised
    fp8_path: str | None = None
    # How it computes FP8 attention (`Workload.dtype == "fp8"`: e4m3 q, k, v) when it has a path for it; None means
    # it has none and `check` rejects such workloads (never a bf16 run under the fp8 name)
    fp8_attention: str | None = None

    # How the variant travels to another process (a Ray worker): `(constructor, args)` that builds it again there,
    # set by constructors whose functions close over objects that do not pickle (a pinned SDPA backend, a `--kernel`
    # repo, a user's `package.module:function`). None: the variant pickles field by field.
    recipe: tuple[Callable[..., Variant], tuple] | None = field(default=None, compare=False, repr=False)

    def __call__(self, inputs: Inputs) -> torch.Tensor:
        return self.fn(inputs)

    def check(self, workload: Workload) -> Support:
        """Whether it runs `workload`: FP8 attention only where it has a path for it, then its own `supports`."""
        if workload.fp8_attention is not None and self.fp8_attention is None:
            return Rejected(no_fp8_attention(self))
        return self.supports(workload)

    def __reduce_ex__(self, protocol):
        """Rebuilt from its recipe where one is set (the constructor and its arguments), else field by field."""
        if self.recipe is not None:
            return self.recipe
        return super().__reduce_ex__(protocol)


def no_fp8_attention(variant: Variant) -> str:
    """Why `variant` cannot run FP8 attention (`--dtype fp8`): SDPA's reason says what this torch has."""
    if variant.family == "sdpa" or variant.name.startswith("sdpa"):
        import importlib.util

        try:
            quantized = importlib.util.find_spec(QUANTIZED_SDPA) is not None
        except ModuleNotFoundError:
            quantized = False
        what = (f"its FP8 SDPA is a separate experimental function ({QUANTIZED_SDPA}: FlashAttention-3 through the "
                "flash_attn_interface package, activated process-wide) that attnprof does not run yet" if quantized
                else f"this torch has no FP8 SDPA (no {QUANTIZED_SDPA})")
        return (f"{variant.name}: no FP8 attention: scaled_dot_product_attention takes 16/32-bit q, k, v, and in "
                f"torch {torch.__version__} {what}; --dtype bf16 measures it")
    return (f"{variant.name}: no FP8 attention path (it computes in 16/32 bits); --dtype bf16 measures it, or "
            "use the kernel")


QUANTIZED_SDPA = "torch.nn.attention.experimental._scaled_dot_product_attention_quantized"


def expand_kv_heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    """`[B, Hkv, S, D]` → `[B, Hq, S, D]`: query head h reads kv head h // (Hq // Hkv) (repeat_kv's order)."""
    groups = heads // x.shape[1]
    return x if groups == 1 else x.repeat_interleave(groups, dim=1)


def check_output(name: str, out: object, q: torch.Tensor, where: str = "") -> torch.Tensor:
    """`out` when it is a tensor of q's shape `[B, Hq, Sq, D]`; else `VariantFailed` naming the variant, what it
    returned and what was expected: that variant's `error` row (a user function's mistake, mostly), not the run's end."""
    if isinstance(out, torch.Tensor) and tuple(out.shape) == tuple(q.shape):
        return out
    got = (f"a tensor of shape {list(out.shape)}" if isinstance(out, torch.Tensor)
           else "None" if out is None else f"a {type(out).__name__}")
    raise VariantFailed(f"variant {name!r} returned {got}{where}, expected a tensor of shape {list(q.shape)} "
                        "[B, Hq, Sq, D]")
