"""Our kernel repo inside transformers, the way flash-attn kernels run there: dense models and continuous batching.

transformers drives a flash-attn-style kernel through three entry points (`flash_attn_func`,
`flash_attn_varlen_func`, `flash_attn_with_kvcache`) from its own wrappers: `flash_attention_forward` for dense and
padded batches (padding goes through varlen) and, in continuous batching, the packed varlen prefill plus, for
decode-only batches on CUDA, `flash_attn_with_kvcache` over the paged cache (its "decode fast path").

The documented way in, `attn_implementation="org/repo"` with `LOCAL_KERNELS=org/repo=kernels/flash-triton`, is
gated by transformers on the `kernels` version it was released with, and the `kernels` this project pins (0.17.2)
is outside that window in both transformers we run (5.17 takes [0.16, 0.17), 5.24 takes [0.18.2, 0.19)):
`kernels_route_problem()` says so for the installed pair. So `hub_attention()` loads the repo with `kernels`
(`attnprof.variants.kernel_hub`, the same loader as every other command) and hands its three functions to
transformers' own flash wrappers under one registered name, by filling the slot transformers' lazy flash import
keeps (`modeling_flash_attention_utils._loaded_implementation` and the functions beside it) — what
`load_and_register_attn_kernel` does after `get_kernel`. The registered functions re-fill that slot on each call
(transformers keeps one slot; loading another flash kernel empties it).

The name: "flash" in it makes continuous batching accept it; transformers turns on its decode fast path only for
names matching `flash…3` (5.17) or `flash…[23]` (5.24), so the name ends in "fa3_api" (it speaks flash-attn's API;
it is not FlashAttention-3). 5.17's continuous batching runs `paged|<name>` (registered too). Because the slot
holds one name, switch a model between the two with `HubAttention.apply(model, paged=...)`, which fills the slot
before `set_attn_implementation` reads it; a model already on `paged|<name>` is not switched again by 5.17's
continuous batching (so it does not switch back either). Everything that cannot work here comes back as
`rejected` with the reason; nothing falls back to another kernel.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

NAME = "attnprof_flash_triton_fa3_api"
ENTRY_POINTS = ("flash_attn_func", "flash_attn_varlen_func", "flash_attn_with_kvcache")
# transformers' private lazy-import slot (modeling_flash_attention_utils); 5.24 adds _process_with_kvcache_kwargs_fn
_SLOT = ("_loaded_implementation", "_flash_fn", "_flash_varlen_fn", "_flash_with_kvcache_fn", "_pad_fn", "_unpad_fn",
         "_process_flash_kwargs_fn", "_lazy_define_process_function", "_pad_input", "_unpad_input")


@dataclass(frozen=True)
class HubAttention:
    """What to pass to transformers for our kernel, or why it cannot run there."""

    dense: str = ""  # attn_implementation for a model built from a config (dense, padded and generate)
    paged: str = ""  # the model's attn_implementation for init_continuous_batching / generate_batch
    decode_fast_path: bool = False  # whether continuous batching can call flash_attn_with_kvcache (CUDA only)
    transformers: str = ""
    kernel: str = ""
    rejected: str | None = None
    fill: Callable[[str], None] | None = field(default=None, repr=False, compare=False)

    def apply(self, model, paged: bool = False) -> str:
        """Put `model` on our kernel (`paged`: the continuous-batching name); returns the name it runs."""
        if self.rejected is not None or self.fill is None:
            raise RuntimeError(self.rejected or "hub_attention() did not register the kernel")
        name = self.paged if paged else self.dense
        self.fill(name)
        model.set_attn_implementation(name)
        return name


def kernels_route_problem() -> str | None:
    """None when this transformers would load a kernel repo by name through `kernels`, else why not."""
    import transformers
    from transformers.utils import import_utils

    low = getattr(import_utils, "KERNELS_MIN_VERSION", "?")
    high = getattr(import_utils, "KERNELS_MAX_VERSION", "?")
    if import_utils.is_kernels_available():
        return None
    from importlib.metadata import PackageNotFoundError, version

    try:
        have = version("kernels")
    except PackageNotFoundError:
        have = "not installed"
    return (f"transformers {transformers.__version__} loads attn_implementation='org/repo' only with kernels "
            f">= {low}, < {high}; this environment has kernels {have}")


def hub_attention(repo: str | Path | None = None) -> HubAttention:
    """Load the kernel repo (default: our flash-triton) with `kernels` and register it with transformers."""
    import transformers

    from attnprof.variants import kernel_hub
    from attnprof.variants.base import Rejected

    spec = kernel_hub.parse_spec(None if repo is None else str(repo))
    module = kernel_hub.load(spec)
    base = HubAttention(transformers=transformers.__version__, kernel=spec.label())
    if isinstance(module, Rejected):
        return _with(base, rejected=module.reason)
    missing = [f for f in ENTRY_POINTS[:2] if not callable(getattr(module, f, None))]
    if missing:
        return _with(base, rejected=f"{spec.label()} has no {' or '.join(missing)}: transformers' flash path needs "
                                    "flash_attn_func and flash_attn_varlen_func")
    registered = _register(module)
    if isinstance(registered, str):
        return _with(base, rejected=f"kernel in transformers {transformers.__version__}: {registered}")
    fill, paged = registered
    import torch

    fast = callable(getattr(module, "flash_attn_with_kvcache", None)) and torch.cuda.is_available()
    return _with(base, dense=NAME, paged=paged, decode_fast_path=fast, fill=fill)


def _with(base: HubAttention, **changes) -> HubAttention:
    import dataclasses

    return dataclasses.replace(base, **changes)


def _register(module: ModuleType) -> tuple[Callable[[str], None], str] | str:
    """Register `NAME` (and `paged|NAME` where continuous batching runs that) with transformers' flash wrappers;
    returns (the slot filler, the continuous-batching name), or the reason this transformers cannot take it."""
    from transformers import AttentionInterface
    from transformers import modeling_flash_attention_utils as mfu
    from transformers.integrations.flash_attention import flash_attention_forward
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    absent = [name for name in _SLOT if not hasattr(mfu, name)]
    if absent:
        return ("its flash lazy-import slot has changed (no " + ", ".join(absent) + "); "
                "attnprof.serving.flash_registration knows the slot of transformers 5.17 to 5.24")
    fill = _filler(module, mfu)
    fill(NAME)  # set_attn_implementation / from_config import the flash functions right away
    flash_mask = ALL_MASK_ATTENTION_FUNCTIONS["flash_attention_2"]

    def dense(mod, *args, **kwargs):
        fill(mod.config._attn_implementation)
        return flash_attention_forward(mod, *args, **kwargs)

    AttentionInterface.register(NAME, dense)
    AttentionMaskInterface.register(NAME, flash_mask)
    if hasattr(mfu, "lazy_import_paged_flash_attention"):  # 5.17-style continuous batching: "paged|NAME"
        from transformers.integrations.flash_paged import paged_attention_forward

        def paged(mod, *args, **kwargs):
            fill(mod.config._attn_implementation)
            return paged_attention_forward(mod, *args, **kwargs)

        AttentionInterface.register(f"paged|{NAME}", paged)
        AttentionMaskInterface.register(f"paged|{NAME}", flash_mask)
        return fill, f"paged|{NAME}"
    return fill, NAME


def _filler(module: ModuleType, mfu) -> Callable[[str], None]:
    """A function that points transformers' lazy flash import at `module` under an implementation name."""
    import torch

    varlen = module.flash_attn_varlen_func
    kvcache = getattr(module, "flash_attn_with_kvcache", None)
    kvcache_call = torch.compiler.disable(kvcache) if kvcache is not None else None
    process_varlen = mfu._lazy_define_process_function(varlen)
    process_kvcache = mfu._lazy_define_process_function(kvcache) if kvcache is not None else dict

    @torch.compiler.disable  # plain Python on module globals: continuous batching may compile the forward around it
    def fill(implementation: str) -> None:
        if mfu._loaded_implementation == implementation and mfu._flash_varlen_fn is varlen:
            return
        mfu._flash_fn, mfu._flash_varlen_fn, mfu._flash_with_kvcache_fn = module.flash_attn_func, varlen, kvcache_call
        mfu._pad_fn, mfu._unpad_fn = mfu._pad_input, mfu._unpad_input
        mfu._process_flash_kwargs_fn = process_varlen
        if hasattr(mfu, "_process_with_kvcache_kwargs_fn"):
            mfu._process_with_kvcache_kwargs_fn = process_kvcache
        mfu._loaded_implementation = implementation

    return fill
