"""The registry: a plain dict of named variants, and the one function that turns `--variants` into them."""

from __future__ import annotations

from attnprof.errors import UsageError
from attnprof.variants import adapters
from attnprof.variants.base import Accepted, Rejected, Support, Variant
from attnprof.variants.compiled import NAIVE_COMPILED
from attnprof.variants.flex import FLEX
from attnprof.variants.inplace import INPLACE
from attnprof.variants.kernel_hub import KERNEL, KernelSpec, kernel_variant
from attnprof.variants.naive import NAIVE
from attnprof.variants.reference import REFERENCE, reference_attention
from attnprof.variants.sdpa import PINNED, SDPA
from attnprof.variants.user import load_user_variant

VARIANTS: dict[str, Variant] = {v.name: v for v in (NAIVE, INPLACE, SDPA, *PINNED.values(), FLEX, KERNEL, REFERENCE,
                                                    NAIVE_COMPILED)}
# Third-party kernels by name (variants/adapters.py): made when asked for, a rejected row when not installed.
THIRD_PARTY: tuple[str, ...] = tuple(adapters.LIBRARIES)

# The tutorial's four stages, then FlexAttention: what `attnprof stages` runs when no --variants is given.
DEFAULT_STAGES = ("naive", "inplace", "sdpa", "flex", "kernel")


def resolve_variants(spec: str | None, default: tuple[str, ...] = DEFAULT_STAGES, *,
                     kernel: KernelSpec | None = None) -> list[Variant]:
    """`"naive,sdpa,my.mod:fn"` → variants; `"all"` → every registered one but the oracle. Unknown names: UsageError.

    `kernel` (the parsed `--kernel`) is the repo the `kernel` variant loads; default kernels/flash-triton."""
    names = [n.strip() for n in (spec.split(",") if spec else default) if n.strip()]
    if not names:
        raise UsageError("--variants is empty; valid names: " + ", ".join(VARIANTS))
    if names == ["all"]:
        names = [n for n in VARIANTS if n not in ("reference", "naive-compiled")]
    out: list[Variant] = []
    for name in names:
        if ":" in name and "@" in name:
            out.append(adapters.from_spec(name))
        elif name in THIRD_PARTY:
            out.append(adapters.named(name))
        elif ":" in name:
            out.append(load_user_variant(name))
        elif name == "kernel" and kernel is not None:
            out.append(kernel_variant(kernel))
        elif name in VARIANTS:
            out.append(VARIANTS[name])
        else:
            raise UsageError(f"unknown variant {name!r}; valid: {', '.join((*VARIANTS, *THIRD_PARTY))}, all, "
                             "package.module:function, or module:function@convention")
    return out


__all__ = ["VARIANTS", "DEFAULT_STAGES", "Variant", "Accepted", "Rejected", "Support", "resolve_variants",
           "reference_attention", "load_user_variant"]
