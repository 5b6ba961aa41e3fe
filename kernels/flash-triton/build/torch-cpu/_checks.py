"""Argument checks shared by the three entry points: what flash-attn's signatures accept and we do not run.

The entry points keep flash-attn's full signatures so that code written for kernels-community/flash-attn (and
transformers, which passes every argument the signature names) calls them unchanged. An argument that would change
the result and that this kernel does not implement is refused with a ValueError naming it, never ignored:
transformers only forwards `softcap`, `s_aux` (attention sinks) or a sliding `window_size` when the model uses them,
so a model that needs one fails loudly instead of running without it.
"""

from __future__ import annotations

import torch

from ._config import INTERPRETED, SUPPORTED_DTYPES, SUPPORTED_HEAD_DIMS

# The FP8 formats the kernels take, as the decode program's constexprs: largest finite value (what appended keys
# saturate at), mantissa bits, smallest normal exponent
FP8_FORMAT = {torch.float8_e4m3fn: dict(FP8_MAX=448.0, FP8_MANT=3, FP8_EMIN=-6),
              torch.float8_e5m2: dict(FP8_MAX=57344.0, FP8_MANT=2, FP8_EMIN=-14)}
FP8_MAX = {dtype: f["FP8_MAX"] for dtype, f in FP8_FORMAT.items()}


def refuse_unsupported(entry: str, *, dropout_p: float = 0.0, window_size=(-1, -1), softcap: float | None = 0.0,
                       alibi_slopes=None, s_aux=None, return_attn_probs: bool = False, block_table=None,
                       rotary_cos=None, rotary_sin=None) -> None:
    """Raise ValueError naming the first argument that asks for something flash-triton does not compute."""
    def no(arg: str, why: str) -> None:
        raise ValueError(f"flash-triton {entry}: {arg} is not supported ({why})")

    if dropout_p:
        no(f"dropout_p={dropout_p}", "forward-only inference kernel; pass dropout_p=0.0")
    if window_size is not None and tuple(window_size) != (-1, -1):
        no(f"window_size={tuple(window_size)}", "no sliding-window (local) attention; (-1, -1) means none")
    if softcap:
        no(f"softcap={softcap}", "no logit soft-capping; 0.0 means none")
    if alibi_slopes is not None:
        no("alibi_slopes", "no ALiBi bias")
    if s_aux is not None:
        no("s_aux", "no attention sinks")
    if return_attn_probs:
        no("return_attn_probs=True", "the kernel never forms the attention probabilities")
    if block_table is not None:
        no("block_table", "a paged cache is read by flash_attn_with_kvcache, not by the varlen prefill")
    if rotary_cos is not None or rotary_sin is not None:
        no("rotary_cos/rotary_sin", "apply rotary embeddings before the call")


def keys_contiguous(t) -> bool:
    """t a `[B, S, H, D]` tensor stored with the keys contiguous (stride 1 along S, the head dim strided): the layout
    the FP8 programs read V in (Vᵀ tiles, the K-major operand); `tensor_problem` checks it as `t.transpose(1, 3)`."""
    return (isinstance(t, torch.Tensor) and t.dim() == 4 and t.stride(1) == 1 and t.stride(3) != 1
            and t.shape[1] > 1 and t.shape[3] > 1)


def tensor_problem(name: str, t, dims: int, layout: str, fp8_ok: bool = False) -> str | None:
    """None when `t` is a `dims`-D fp16/bf16 tensor (or, `fp8_ok`, an FP8 one: a KV cache) whose last dim is
    contiguous, else why not."""
    if not isinstance(t, torch.Tensor):
        return f"{name} is a {type(t).__name__}, not a torch.Tensor"
    if t.dim() != dims:
        return f"{name} must be {dims}-D {layout}, got shape {tuple(t.shape)}"
    if t.dtype not in SUPPORTED_DTYPES and not (fp8_ok and t.dtype in FP8_MAX):
        return dtype_problem(name, t.dtype, fp8_ok)
    if t.stride(-1) != 1 and t.shape[-1] > 1:
        return f"{name} must have a contiguous last (head) dimension, got strides {t.stride()}"
    return None


def dtype_problem(name: str, dtype: torch.dtype, fp8_ok: bool = False) -> str:
    """Why `dtype` is refused for tensor `name`; an FP8 one names the entry point that reads FP8 (a KV cache)."""
    if fp8_ok:
        return f"{name} has dtype {dtype}; flash-triton supports float16 and bfloat16 (a KV cache may also be " \
               "float8_e4m3fn or float8_e5m2)"
    if dtype in FP8_MAX:
        return (f"{name} has dtype {dtype}; FP8 runs through flash_attn_func with e4m3 q, k and v (and their "
                "descales) or as a KV cache of flash_attn_with_kvcache; here float16 and bfloat16 only")
    return f"{name} has dtype {dtype}; flash-triton supports float16 and bfloat16 only"


def common_problem(q: torch.Tensor, k: torch.Tensor, tensors: dict[str, torch.Tensor]) -> str | None:
    """Shared rules once the shapes are known: one dtype, one device, head dim, GQA."""
    dtypes = {t.dtype for t in tensors.values()}
    if len(dtypes) > 1:
        return "q, k, v (and the caches) must share one dtype, got " + ", ".join(f"{n} {t.dtype}" for n, t in tensors.items())
    devices = {t.device for t in tensors.values()}
    if len(devices) > 1:
        return "all tensors must be on one device, got " + ", ".join(f"{n} {t.device}" for n, t in tensors.items())
    d = q.shape[-1]
    if k.shape[-1] != d:
        return f"head dim of q ({d}) and k/v ({k.shape[-1]}) differ"
    if d not in SUPPORTED_HEAD_DIMS:
        return head_dim_problem(d)
    hq, hkv = q.shape[-2], k.shape[-2]
    if hkv == 0 or hq % hkv:
        return f"query heads ({hq}) must be a multiple of kv heads ({hkv}) for GQA"
    return None


def descale_problem(name: str, t, cache_dtype: torch.dtype, batch: int, hkv: int, device) -> str | None:
    """None when `t` is None or a descale of flash-attn's convention for an FP8 cache: fp32, one per (sequence, kv
    head) `[B, Hkv]` or one per tensor (one element), on the call's device; else why not."""
    if t is None:
        return None
    if cache_dtype not in FP8_MAX:
        return f"{name} applies to an FP8 KV cache; this cache is {cache_dtype} (pass {name}=None)"
    if not isinstance(t, torch.Tensor):
        return f"{name} is a {type(t).__name__}, not a torch.Tensor"
    if t.dtype != torch.float32:
        return f"{name} must be float32, got {t.dtype}"
    if t.numel() != 1 and tuple(t.shape) != (batch, hkv):
        return f"{name} must be [B={batch}, Hkv={hkv}] (per sequence and kv head) or one element, got {tuple(t.shape)}"
    if t.device != device:
        return f"{name} is on {t.device}, the other tensors on {device}"
    return None


def descale_strides(t) -> tuple[int, int]:
    """(batch, kv head) strides of a descale: 0, 0 for one per tensor (or none), which broadcasts."""
    if t is None or t.numel() == 1:
        return 0, 0
    return t.stride(0), t.stride(1)


def device_problem(q: torch.Tensor) -> str | None:
    """None when the kernels can run on q's device (checked last: every other problem is named first)."""
    if q.device.type == "cpu" and not INTERPRETED:
        return ("CPU tensors need Triton's interpreter, and it was off when this kernel was loaded: "
                "set TRITON_INTERPRET=1 before loading the kernel")
    if q.device.type not in ("cpu", "cuda"):
        return f"device {q.device} is not supported (CUDA, or the CPU through Triton's interpreter)"
    if INTERPRETED and q.dtype == torch.bfloat16:  # refused, never a silent wrong answer
        return ("bfloat16 through Triton's interpreter: it upcasts bf16 tl.dot operands wrongly (relative error ~1e9), "
                "so the varlen and kvcache programs refuse it on the CPU; use float16 there, or a CUDA GPU "
                "(flash_attn_func runs bf16 on the CPU through float32 copies)")
    return None


def index_problem(name: str, t, length: int | None, device: torch.device, dims: int = 1) -> str | None:
    """None when `t` is an int32/int64 index tensor of `dims` dims (first dim `length`, when given) on `device`."""
    if not isinstance(t, torch.Tensor):
        return f"{name} is a {type(t).__name__}, not a torch.Tensor"
    if t.dtype not in (torch.int32, torch.int64):
        return f"{name} must be int32 (or int64), got {t.dtype}"
    if t.dim() != dims:
        return f"{name} must be {dims}-D, got shape {tuple(t.shape)}"
    if length is not None and t.shape[0] != length:
        return f"{name} must have {length} rows, got shape {tuple(t.shape)}"
    if t.device != device:
        return f"{name} is on {t.device}, the other tensors on {device}"
    if t.stride(-1) != 1 and t.shape[-1] > 1:
        return f"{name} must be contiguous along its last dimension, got strides {t.stride()}"
    return None


def head_dim_problem(d: int) -> str:
    """Why head dim `d` is refused, with the nearest supported one (the model needs a kernel built for its own)."""
    nearest = min(SUPPORTED_HEAD_DIMS, key=lambda n: (abs(n - d), -n))  # a tie: the larger (d padded up fits)
    return (f"head dim {d} is not supported; flash-triton is built and tuned for head dims "
            f"{', '.join(map(str, SUPPORTED_HEAD_DIMS))} (tile shapes and shared memory are sized for them; nearest "
            f"supported: {nearest}; a model with head dim {d} needs another backend, e.g. SDPA)")


def _heads_major(t: torch.Tensor) -> bool:
    """A `[B, S, H, D]` view of a contiguous `[B, H, S, D]` tensor (PyTorch's attention layout, transposed)."""
    return t.transpose(1, 2).is_contiguous()


def tma_layout(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> str | None:
    """How TMA can read these `[B, S, H, D]` tensors: "rows" (all contiguous: 2-D `[B*S, H*D]`), "heads" (all views
    of contiguous `[B, H, S, D]`: 2-D `[B*H*S, D]`), or None (other strides: pointer loads). Packed `[total, H, D]`
    tensors are asked as `[1, total, H, D]` (`_varlen._packed_layout`)."""
    if any(t.data_ptr() % 16 for t in (q, k, v)):
        return None  # a TMA descriptor's base must be 16-byte aligned
    if all(t.is_contiguous() for t in (q, k, v)):
        return "rows"
    if all(_heads_major(t) for t in (q, k, v)):
        return "heads"
    return None
