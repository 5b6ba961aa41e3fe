"""Third-party attention kernels through the calling conventions users meet, as stages like any other.

Conventions (our inputs are q `[B, Hq, Sq, D]`, k/v `[B, Hkv, Sk, D]`; outputs go back to `[B, Hq, Sq, D]`):

- `flash-attn`: `fn(q, k, v, softmax_scale=, causal=)` on `[B, S, H, D]` (flash_attn.flash_attn_func; also what
  every `kernels` hub flash repo exposes, and FlashAttention-4's `flash_attn.cute.flash_attn_func`, which returns
  `(out, lse)`). GQA native.
- `sageattention`: `sageattn(q, k, v, tensor_layout="HND", is_causal=, sm_scale=)` on `[B, H, S, D]`.
- `flashinfer`: `single_prefill_with_kv_cache(q, k, v, causal=, sm_scale=)`, NHD `[S, H, D]`, one sequence per
  call (the batch is a loop of calls). GQA native.
- `xformers`: `memory_efficient_attention(q, k, v, attn_bias=LowerTriangularMask(), scale=)` on BMHK
  `[B, S, H, D]`; equal head counts.

Chosen by name (`--variants sageattention`) or by `module:function@convention`. A missing package, a CPU device
for a CUDA-only package, or a workload outside the convention (a mask tensor, fp32, GQA where not native, a causal
mask with Sq != Sk where the library aligns it top-left) is a `Rejected` row with the reason and, for a missing
package, the pip command. The backend column names the implementation and its version (`sageattention 2.2.0`).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass

import torch

from attnprof.errors import UsageError
from attnprof.variants.base import Accepted, Rejected, Support, Variant
from attnprof.workload import Inputs, Workload


@dataclass(frozen=True)
class Convention:
    name: str
    call: Callable[[Callable, Inputs], torch.Tensor]  # (the library function, inputs) → [B, Hq, Sq, D]
    gqa: bool  # takes fewer kv heads natively
    fp32: bool  # runs fp32 inputs
    causal_top_left: bool  # aligns a causal mask top-left (then Sq != Sk is rejected)
    cuda_only: bool = True


def _bshd(t: torch.Tensor) -> torch.Tensor:
    return t.transpose(1, 2)  # [B, H, S, D] → [B, S, H, D] (a view; the library copies if it must)


def _flash_attn(fn, inputs: Inputs) -> torch.Tensor:
    out = fn(_bshd(inputs.q), _bshd(inputs.k), _bshd(inputs.v), softmax_scale=inputs.scale, causal=inputs.causal)
    out = out[0] if isinstance(out, tuple) else out
    return out.transpose(1, 2)


def _sage(fn, inputs: Inputs) -> torch.Tensor:
    return fn(inputs.q, inputs.k, inputs.v, tensor_layout="HND", is_causal=inputs.causal, sm_scale=inputs.scale)


def _flashinfer(fn, inputs: Inputs) -> torch.Tensor:
    outs = [fn(inputs.q[b].transpose(0, 1), inputs.k[b].transpose(0, 1), inputs.v[b].transpose(0, 1),
               causal=inputs.causal, sm_scale=inputs.scale) for b in range(inputs.q.shape[0])]
    return torch.stack(outs).transpose(1, 2)


def _xformers(fn, inputs: Inputs) -> torch.Tensor:
    bias = None
    if inputs.causal:
        from xformers.ops import LowerTriangularMask

        bias = LowerTriangularMask()
    out = fn(_bshd(inputs.q), _bshd(inputs.k), _bshd(inputs.v), attn_bias=bias, scale=inputs.scale)
    return out.transpose(1, 2)


CONVENTIONS: dict[str, Convention] = {
    "flash-attn": Convention("flash-attn", _flash_attn, gqa=True, fp32=False, causal_top_left=False),
    "sageattention": Convention("sageattention", _sage, gqa=True, fp32=False, causal_top_left=True),
    "flashinfer": Convention("flashinfer", _flashinfer, gqa=True, fp32=False, causal_top_left=False),
    "xformers": Convention("xformers", _xformers, gqa=False, fp32=True, causal_top_left=True),
}


@dataclass(frozen=True)
class Library:
    """A named third-party kernel: where its function lives, its convention, its pip name, and the envelope the
    library itself enforces (`limits(workload)` → the reason it would refuse, or None), checked before it runs."""

    module: str
    function: str
    convention: str
    pip: str
    limits: Callable[[Workload], str | None] | None = None


def _fa4_limits(workload: Workload) -> str | None:
    """FlashAttention-4's own checks (flash_attn/cute/interface.py): head dims 8–256 in steps of 8 on sm90, compute
    capability 8.x–12.x; asked before the call so a refusal is a reason, not an AssertionError mid-run."""
    d = workload.head_dim
    if not 8 <= d <= 256 or d % 8:
        return f"flash-attn-4: head dim {d} is outside its 8–256 in steps of 8"
    major, minor = torch.cuda.get_device_capability(torch.device(workload.device))
    if major < 8:
        return f"flash-attn-4: needs compute capability 8.0 or newer; this GPU is {major}.{minor}"
    return None


LIBRARIES: dict[str, Library] = {
    "flash-attn": Library("flash_attn", "flash_attn_func", "flash-attn", "flash-attn"),
    # FlashAttention-4 (CuTe DSL; sm80–sm120, its fastest forward on sm90/sm100)
    "flash-attn-4": Library("flash_attn.cute", "flash_attn_func", "flash-attn", "flash-attn-4", _fa4_limits),
    "sageattention": Library("sageattention", "sageattn", "sageattention", "sageattention"),
    "flashinfer": Library("flashinfer", "single_prefill_with_kv_cache", "flashinfer", "flashinfer-python"),
    "xformers": Library("xformers.ops", "memory_efficient_attention", "xformers", "xformers"),
}


def _version(module: str, pip: str) -> str | None:
    for dist in (pip, module.split(".")[0]):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def adapter_variant(name: str, lib: Library, recipe: tuple[Callable[..., Variant], tuple] | None = None) -> Variant:
    """A variant that imports `lib` only when asked whether it supports a workload (so a missing package is a
    rejected row, not an error at start-up), then calls it through its convention."""
    conv = CONVENTIONS[lib.convention]
    state: dict = {}
    top = lib.module.split(".")[0]
    version = _version(lib.module, lib.pip) if importlib.util.find_spec(top) is not None else None
    backend = f"{lib.pip}{' ' + version if version else ''}"

    def load() -> Callable | str:
        if "fn" in state:
            return state["fn"]
        if importlib.util.find_spec(top) is None:
            return f"{top} is not installed: pip install {lib.pip}"
        try:
            module = importlib.import_module(lib.module)
        except ModuleNotFoundError as exc:
            if exc.name is not None and lib.module.startswith(exc.name):  # the package shares a top with another
                return f"{lib.module} is not installed: pip install {lib.pip}"
            return f"{lib.module} does not import here: ModuleNotFoundError: {str(exc)[:160]}"
        except Exception as exc:  # noqa: BLE001 — an import that fails for any reason is a rejected row
            return f"{lib.module} does not import here: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
        fn = module
        for part in lib.function.split("."):
            fn = getattr(fn, part, None)
            if fn is None:
                return f"{lib.module} has no {lib.function} (a different version of {lib.pip}?)"
        state["fn"] = fn
        return fn

    def supports(workload: Workload) -> Support:
        if conv.cuda_only and not workload.device.startswith("cuda"):
            installed = "installed" if importlib.util.find_spec(top) is not None else f"pip install {lib.pip}"
            return Rejected(f"{name} runs on CUDA only (its kernels are GPU code); device is {workload.device} "
                            f"({installed})")
        fn = load()
        if isinstance(fn, str):
            return Rejected(fn)
        if workload.mask != "none":
            return Rejected(f"{name}: the {conv.name} convention takes no mask tensor ({workload.mask} mask)")
        if workload.dtype == "fp32" and not conv.fp32:
            return Rejected(f"{name}: fp16/bf16 only (the {conv.name} convention), not fp32")
        if workload.gqa and not conv.gqa:
            return Rejected(f"{name}: equal query and key/value head counts only ({workload.heads} vs "
                            f"{workload.kv_heads})")
        if workload.causal and conv.causal_top_left and workload.seq != workload.kv_seq:
            return Rejected(f"{name}: its causal mask is aligned top-left; Sq {workload.seq} != Sk "
                            f"{workload.kv_seq} would differ from the bottom-right reference")
        refused = lib.limits(workload) if lib.limits is not None else None
        return Rejected(refused) if refused else Accepted()

    def run(inputs: Inputs) -> torch.Tensor:
        fn = load()
        if isinstance(fn, str):
            raise UsageError(fn)
        return conv.call(fn, inputs)

    run.__name__ = lib.function
    return Variant(name=name, fn=run, supports=supports, family="third-party", backend=backend,
                   description=f"{lib.module}.{lib.function} ({conv.name} convention)", recipe=recipe)


def named(name: str) -> Variant:
    return adapter_variant(name, LIBRARIES[name], recipe=(named, (name,)))  # pickles by name: `bench --ray` workers


def from_spec(spec: str) -> Variant:
    """`module:function@convention` → a variant through that convention."""
    target, _, conv = spec.rpartition("@")
    module, _, function = target.partition(":")
    if conv not in CONVENTIONS or not module or not function:
        raise UsageError(f"variant {spec!r}: expected module:function@convention with convention one of "
                         f"{', '.join(CONVENTIONS)}")
    return adapter_variant(spec, Library(module, function, conv, module.split(".")[0]), recipe=(from_spec, (spec,)))
