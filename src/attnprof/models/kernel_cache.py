"""The `kernel` variant over a model's KV cache: transformers' bool mask turned into flash-attn's key ranges.

Why a module of its own: transformers' static cache (the production `generate` loop) hands every layer the whole
preallocated cache and a bool mask, where a flash-attn kernel wants each sequence's cached length. `kernel_over_cache`
reads each sequence's key range from the mask on the device (no host sync: a CUDA graph can hold it), checks that the
mask is exactly that range (causal, bottom-right, within the model's sliding window), and calls the kernel repo's
`flash_attn_with_kvcache` through one custom op (`attnprof::kvcache_attention`), so torch.compile keeps the whole
step in one graph at any batch size. Model features ride along: logit soft-capping, a sliding window (transformers'
`sliding_window` w keeps keys i - w < j <= i, flash-attn's `window_size=(w - 1, ...)`), attention sinks (`s_aux`).
"""

from __future__ import annotations

import torch


def kernel_over_cache(module, name: str, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      mask: torch.Tensor, scale: float, *, softcap: float = 0.0, window_left: int = -1,
                      s_aux: torch.Tensor | None = None, fp8=None) -> torch.Tensor:
    """Attention of query `[B, Hq, Sq, D]` over the cache key/value `[B, Hkv, Sk, D]` under the bool `mask`
    `[B, 1, Sq, Sk]`: each sequence's valid keys are one range [leftpad, seqlen) (the union of its rows), the queries
    its last Sq positions, causal bottom-right, and `window_left` >= 0 keeps keys j >= i - window_left of query i.
    `fp8` (`workload.Fp8KV`, from `models.fp8_cache`): the FP8 cache behind key/value, read as stored with its
    descales instead. Returns `[B, Sq, Hq, D]`.

    The whole mask must be that form (left padding and a sliding window are; a hole or another per-query pattern is
    not). In eager calls it is checked first and a mask that is not refused with a ValueError. Inside a compiled graph
    nothing can be raised from a value on the device (a CUDA graph replays without the host), so the same check runs
    on the device and the rows of a sequence whose mask is not one range come out NaN: never a silent wrong answer,
    and the serve loops' finiteness checks turn it into an error row. Any batch size compiles to one graph: raising
    here would break the graph in every layer, recompile the cache update per layer past dynamo's limit and run the
    step unfused (0.25x SDPA at batch 16 on the H200)."""
    sq = query.shape[2]
    if mask.shape[1] != 1:
        raise ValueError(f"{name}: a per-head mask is not a KV-cache range")
    leftpad, seqlen, bad = cache_ranges(mask[:, 0], sq, window_left)
    if not torch.compiler.is_compiling() and bool(bad.any()):
        raise ValueError(f"{name}: this mask is not one causal key range per sequence (a KV cache with left "
                         "padding); flash_attn_with_kvcache cannot express it (try sdpa)")
    if fp8 is not None:
        key, value = fp8.k, fp8.v
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))  # [B, S, H, D] views; the kernel takes strides
    descales = (fp8.k_descale, fp8.v_descale) if fp8 is not None else (None, None)
    fmt = str(fp8.fmt).removeprefix("torch.") if fp8 is not None and fp8.fmt is not None else ""
    out = _kvcache_call(module, q, k, v, seqlen, leftpad, scale, softcap, window_left, s_aux,
                        *descales, kv_format=fmt)  # [B, Sq, Hq, D]
    if torch.compiler.is_compiling():
        out = torch.where(bad[:, None, None, None], torch.full_like(out, float("nan")), out)
    return out


def cache_ranges(mask: torch.Tensor, sq: int, window_left: int = -1) -> tuple[torch.Tensor, torch.Tensor,
                                                                              torch.Tensor]:
    """The key range [leftpad, seqlen) of each sequence from a bool mask `[B, Sq, Sk]` over a KV cache (int32 `[B]`
    each), and `[B]` bool: True where the mask is not that range, causal bottom-right for the last Sq queries, within
    `window_left` keys before each query when >= 0. The range is the union of the rows' keys (a window hides the
    start of the range from the later rows; without one, the last row sees the whole range)."""
    sk = mask.shape[-1]
    seen = mask.any(-2)  # [B, Sk]: keys some query sees
    pos = torch.arange(sk, device=mask.device)
    # min / max of the visible positions, not argmax: inductor's split reduction of an argmax over a 32k-key cache at
    # batch 1 failed an assertion on the H200 (decode30d.sh); an empty row gives leftpad Sk, seqlen 0 (no key)
    leftpad = torch.where(seen, pos, sk).amin(-1).to(torch.int32)
    seqlen = torch.where(seen, pos + 1, 0).amax(-1).to(torch.int32)
    last = seqlen[:, None] - sq + torch.arange(sq, device=mask.device)[None, :]  # [B, Sq] query positions
    expect = (pos >= leftpad[:, None, None]) & (pos <= last[:, :, None])  # [B, Sq, Sk]
    if window_left >= 0:
        expect &= pos >= last[:, :, None] - window_left
    bad = (expect != mask.expand_as(expect)).any(-1).any(-1)
    return leftpad, seqlen, bad


_CACHE_MODULES: list = []  # the kernel modules `_kvcache_op` calls, by index (a custom op takes no module object)


def register_cache_kernel(module) -> int:
    """Make `module.flash_attn_with_kvcache` callable through `attnprof::kvcache_attention`; its index. Call it
    outside torch.compile: a list appended inside a compiled region is only appended after the graph ran."""
    if module not in _CACHE_MODULES:
        _CACHE_MODULES.append(module)
    return _CACHE_MODULES.index(module)


def _kvcache_call(module, q, k, v, seqlen, leftpad, scale, softcap=0.0, window_left=-1, s_aux=None, k_descale=None,
                  v_descale=None, kv_format: str = ""):
    """`module.flash_attn_with_kvcache` as one opaque op of torch.compile's graph (`attnprof::kvcache_attention`):
    dynamo does not trace into the kernel's launcher, so there is no graph break per layer and inductor's CUDA graph
    takes the launches with the rest of the step. (Traced through, the launcher failed to compile in inductor on the
    H200; disabled, it broke the graph at every layer: 21.0 ms/token.)"""
    try:
        index = _CACHE_MODULES.index(module)
    except ValueError:
        raise RuntimeError("kernel_over_cache: register_cache_kernel(module) first, outside torch.compile") from None
    return _kvcache_op(q, k, v, seqlen, leftpad, float(scale), index, float(softcap or 0.0), int(window_left), s_aux,
                       k_descale, v_descale, kv_format)


@torch.library.custom_op("attnprof::kvcache_attention", mutates_args=())
def _kvcache_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seqlen: torch.Tensor, leftpad: torch.Tensor,
                scale: float, module: int, softcap: float, window_left: int,
                s_aux: torch.Tensor | None, k_descale: torch.Tensor | None = None,
                v_descale: torch.Tensor | None = None, kv_format: str = "") -> torch.Tensor:
    """`kv_format` (e.g. "float8_e4m3fn"): k/v are that format's bytes as uint8, viewed as it here, outside the graph."""
    if kv_format:
        k, v = k.view(getattr(torch, kv_format)), v.view(getattr(torch, kv_format))
    features = {}  # only what is asked: a kernel repo without these arguments still serves plain models
    if softcap:
        features["softcap"] = softcap
    if window_left >= 0:
        features["window_size"] = (window_left, -1)
    if s_aux is not None:
        features["s_aux"] = s_aux
    if k_descale is not None:  # an FP8 cache (k, v in e4m3/e5m2)
        features["k_descale"], features["v_descale"] = k_descale, v_descale
    out = _CACHE_MODULES[module].flash_attn_with_kvcache(q, k, v, cache_seqlens=seqlen, cache_leftpad=leftpad,
                                                         softmax_scale=scale, causal=True, **features)
    out = out[0] if isinstance(out, tuple) else out
    return out.contiguous()  # fresh from the kernel; contiguous as the fake below says


@_kvcache_op.register_fake
def _(q, k, v, seqlen, leftpad, scale, module, softcap, window_left, s_aux, k_descale=None, v_descale=None,
      kv_format=""):
    return q.new_empty(q.shape)  # [B, Sq, Hq, D], contiguous
