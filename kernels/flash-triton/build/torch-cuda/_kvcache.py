"""`flash_attn_with_kvcache`: decode and append over a dense or paged KV cache, flash-attn's signature.

What a serving loop calls every step: the new token's query (Sq = 1; more when appending a chunk or verifying
speculated tokens) against everything cached for its sequence, optionally writing the step's new keys/values into
the cache first (`k`, `v` at `cache_seqlens`). The cache is dense, `[B_cache, S_cache, Hkv, D]` (sequence b in row
`cache_batch_idx[b]`, else b), or paged, `[num_blocks, page_size, Hkv, D]` with `block_table [B, max_blocks]`
int32 naming the blocks of each sequence (any page size; transformers' continuous batching uses 256).
The work is the split-KV decode program in `_decode.py`; how it is launched is in `_splits.py`.

Nothing reads a device value on the host: the grid comes from shapes (the cache capacity), so the call can be
captured in a CUDA graph; lengths past the capacity are clipped on the device rather than checked here.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import torch

from ._checks import (FP8_FORMAT, FP8_MAX, common_problem, descale_problem, descale_strides, device_problem,
                      index_problem, keys_contiguous, refuse_unsupported, tensor_problem)
from ._config import block_d
from ._decode import kvcache_fwd, kvcache_reduce
from ._features import PLAIN, Features, effective, kernel_args, parse_features
from ._launch import launcher
from ._splits import DEFAULT, DEFAULT_FP8, DecodeConfig, counter_slot, one_on, plan


def v_keys(v_cache) -> bool:
    """v_cache an FP8 cache stored with the keys contiguous (`keys_contiguous`): the decode program's `V_KEYS`."""
    return keys_contiguous(v_cache) and v_cache.dtype in FP8_MAX


def kvcache_problem(q, k_cache, v_cache, k, v, cache_seqlens, cache_batch_idx, cache_leftpad, block_table,
                    k_descale=None, v_descale=None):
    """None when the call is well formed, else why not (shapes, dtypes, devices only). An FP8 dense v_cache may be
    stored with the keys contiguous (`v_keys`: stride 1 along S), read as Vᵀ tiles."""
    keys = v_keys(v_cache)
    for name, t, layout in (("q", q, "[B, Sq, Hq, D]"), ("k_cache", k_cache, "[B_cache, S_cache, Hkv, D]"),
                            ("v_cache", v_cache.transpose(1, 3) if keys else v_cache, "[B_cache, S_cache, Hkv, D]")):
        if problem := tensor_problem(name, t, 4, layout, fp8_ok=name != "q"):
            return problem
    if keys and (block_table is not None or k is not None):
        return ("a v_cache stored with the keys contiguous is read by the dense FP8 decode only: no block_table, no "
                "k/v to append")
    if k_cache.shape != v_cache.shape:
        return f"k_cache and v_cache must have the same shape, got {tuple(k_cache.shape)} and {tuple(v_cache.shape)}"
    fp8 = k_cache.dtype in FP8_MAX or v_cache.dtype in FP8_MAX
    if fp8 and k_cache.dtype != v_cache.dtype:
        return f"k_cache and v_cache must share one dtype, got {k_cache.dtype} and {v_cache.dtype}"
    # an FP8 cache: the query, the new keys/values and the output stay 16-bit (the caches join the dtype rule below
    # only when they are 16-bit too)
    tensors = {"q": q} if fp8 else {"q": q, "k_cache": k_cache, "v_cache": v_cache}
    batch = q.shape[0]
    if (k is None) != (v is None):
        return "pass both k and v (the new keys and values to append) or neither"
    if k is not None:
        for name, t in (("k", k), ("v", v)):
            if problem := tensor_problem(name, t, 4, "[B, S_new, Hkv, D]"):
                return problem
        if k.shape != v.shape or k.shape[0] != batch or k.shape[2:] != k_cache.shape[2:]:
            return (f"k and v must both be [B={batch}, S_new, Hkv={k_cache.shape[2]}, D={k_cache.shape[3]}], got "
                    f"{tuple(k.shape)} and {tuple(v.shape)}")
        if cache_seqlens is None:
            return "k/v given without cache_seqlens: say where in the cache each sequence's new keys go"
        tensors.update(k=k, v=v)
    if problem := common_problem(q, k_cache, tensors):
        return problem
    if fp8 and k_cache.device != q.device:
        return f"all tensors must be on one device, got q {q.device}, k_cache {k_cache.device}"
    for name, t in (("k_descale", k_descale), ("v_descale", v_descale)):
        if problem := descale_problem(name, t, k_cache.dtype, batch, k_cache.shape[2], q.device):
            return problem
    if block_table is not None:
        if problem := index_problem("block_table", block_table, batch, q.device, dims=2):
            return problem
        if cache_batch_idx is not None or cache_leftpad is not None:
            return "cache_batch_idx and cache_leftpad do not apply to a paged cache (block_table names the blocks)"
    elif k_cache.shape[0] != batch and cache_batch_idx is None:
        return f"k_cache has {k_cache.shape[0]} sequences for a batch of {batch}: pass cache_batch_idx to pick rows"
    if isinstance(cache_seqlens, torch.Tensor):
        if problem := index_problem("cache_seqlens", cache_seqlens, batch, q.device):
            return problem
    elif cache_seqlens is not None and not isinstance(cache_seqlens, int):
        return f"cache_seqlens must be an int or a [B] int32 tensor, got {type(cache_seqlens).__name__}"
    for name, t in (("cache_batch_idx", cache_batch_idx), ("cache_leftpad", cache_leftpad)):
        if t is not None and (problem := index_problem(name, t, batch, q.device)):
            return problem
    return device_problem(q)


@dataclass(frozen=True)
class _Call:
    """What one call signature decides (`_prepare`): the output's shape, the workspace, both launches' grids and
    their arguments that do not change from call to call, and `serial`, this call's key for the launchers (a small
    int hashes faster than the signature, and is never reused)."""

    out_shape: tuple
    lse_shape: tuple | None
    capacity: int  # key positions the cache holds per sequence
    workspace: int  # fp32 elements of the partials, accumulators then (m, l) pairs (0: one split, no merge)
    tiles: int  # merge counters (fused merge only)
    counted: bool
    fwd_grid: tuple
    fwd_tail: tuple  # the (m, l) pairs' offset, strides, head counts, lengths, split sizes: the arguments after the
    # model features
    fwd_meta: dict
    reduce_grid: tuple | None
    reduce_tail: tuple
    reduce_meta: dict
    features: Features = PLAIN
    serial: int = 0
    out_like_q: bool = False  # q is contiguous: `torch.empty_like(q)` makes the output (half the host time of
    # `torch.empty`'s argument parsing)
    one: torch.Tensor | None = None  # an FP8 cache: fp32 1.0 on the device, the descale of a missing one

    def descales(self, k_descale, v_descale) -> tuple:
        """The (KDescale, VDescale) launch arguments: None for a 16-bit cache, `one` for a missing descale."""
        if self.one is None:
            return None, None
        return (self.one if k_descale is None else k_descale), (self.one if v_descale is None else v_descale)


_SERIALS = itertools.count(1)


_CALLS: dict[tuple, _Call] = {}
_MAX_CALLS = 4096


def _meta(t):
    """What a tensor argument contributes to the call signature: everything Triton or the plan reads of it."""
    if not isinstance(t, torch.Tensor):
        return type(t)  # None, an int cache_seqlens (its value is a runtime argument), or refused by the checks
    return t.shape, t.stride(), t.dtype, t.device, t.data_ptr() % 16


def _int_class(n: int) -> tuple:
    """How Triton specializes an int argument: equal to 1, divisible by 16, 32 or 64 bits."""
    return n == 1, n % 16 == 0, -(2 ** 31) <= n < 2 ** 31


def kvcache_attention(q, k_cache, v_cache, k=None, v=None, cache_seqlens=None, cache_batch_idx=None,
                      cache_leftpad=None, block_table=None, softmax_scale=None, causal=False, num_splits=0,
                      return_softmax_lse=False, *, config: DecodeConfig | None = None, softcap=0.0,
                      window_size=(-1, -1), s_aux=None, q_descale=None, k_descale=None, v_descale=None):
    """The launch behind `flash_attn_with_kvcache` (and `flash_attn_func` at decode shapes), with an optional
    explicit `config`. Returns out `[B, Sq, Hq, D]`, and LSE `[B, Hq, Sq]` fp32 when asked.

    The checks and the plan run once per call signature (`_meta` of every tensor, the flags, the config) and are
    remembered; a repeat call allocates its output and workspace and launches through `_launch.launcher` (no Triton
    binder): host time per call is the point at decode, where every layer of every step makes one. `softcap`,
    `window_size` and `s_aux` as flash-attn computes them (`_features.py`). An FP8 cache (float8_e4m3fn or e5m2)
    takes `k_descale`/`v_descale` as flash-attn does: fp32 `[B, Hkv]` or one element (None: 1); the query stays
    fp16/bf16, so `q_descale` is refused."""
    # optional tensors: `x is None or _meta(x)` (True or a tuple) spares a call per absent argument
    key = (_meta(q), _meta(k_cache), _meta(v_cache), k is None or _meta(k), v is None or _meta(v),
           _meta(cache_seqlens), cache_batch_idx is None or _meta(cache_batch_idx),
           cache_leftpad is None or _meta(cache_leftpad), block_table is None or _meta(block_table), causal,
           num_splits, return_softmax_lse, config, softcap,
           window_size if type(window_size) is tuple else _window_key(window_size), s_aux is None or _meta(s_aux),
           k_descale is None or _meta(k_descale), v_descale is None or _meta(v_descale), q_descale is None)
    try:
        call = _CALLS.get(key)
    except TypeError:  # an unhashable argument: checked (and refused) the slow way
        call, key = None, None
    if call is None:
        call = _prepare(q, k_cache, v_cache, k, v, cache_seqlens, cache_batch_idx, cache_leftpad, block_table,
                        causal, num_splits, return_softmax_lse, config,
                        parse_features("flash_attn_with_kvcache", q, softcap, window_size, s_aux), q_descale,
                        k_descale, v_descale)
        if key is not None:
            if len(_CALLS) >= _MAX_CALLS:
                _CALLS.clear()
            _CALLS[key] = call
    out = torch.empty_like(q) if call.out_like_q else torch.empty(call.out_shape, dtype=q.dtype, device=q.device)
    lse = q.new_empty(call.lse_shape, dtype=torch.float32) if call.lse_shape else None
    if call.fwd_grid is None:  # nothing to compute (an empty batch or head dim)
        return (out, lse) if return_softmax_lse else out
    part = q.new_empty(call.workspace, dtype=torch.float32) if call.workspace else None
    count, count_off = counter_slot(q.device, call.tiles) if call.counted else (None, 0)
    if cache_seqlens is None:
        seqlens, seqlen_scalar = None, call.capacity
    elif isinstance(cache_seqlens, torch.Tensor):
        seqlens, seqlen_scalar = cache_seqlens, 0
    else:
        seqlens, seqlen_scalar = None, int(cache_seqlens)
    raw_scale = q.shape[-1] ** -0.5 if softmax_scale is None else float(softmax_scale)
    # the launchers' key: an int length is a runtime argument Triton specializes (== 1, % 16)
    key_fwd = None if key is None else (call.serial, _int_class(seqlen_scalar))
    cap_in, cap_out, win_left, win_right = kernel_args(call.features, raw_scale)
    _FWD(key_fwd, call.fwd_grid,
         (q, k_cache, v_cache, k, v, out, lse, seqlens, cache_batch_idx, cache_leftpad, block_table, part, count,
          seqlen_scalar, raw_scale * _LOG2E, s_aux, cap_in, cap_out, win_left, win_right, *call.descales(k_descale,
          v_descale), count_off, *call.fwd_tail),
         call.fwd_meta)
    if call.reduce_grid is not None:
        _REDUCE(key_fwd, call.reduce_grid,
                (out, lse, seqlens, cache_leftpad, part, seqlen_scalar, s_aux, win_left, *call.reduce_tail),
                call.reduce_meta)
    return (out, lse) if return_softmax_lse else out


_FWD = launcher(kvcache_fwd)
_REDUCE = launcher(kvcache_reduce)


_LOG2E = math.log2(math.e)


def _window_key(window_size):
    """`window_size` as it keys a call (a list is taken as its tuple; anything else is refused by `_prepare`)."""
    return tuple(window_size) if isinstance(window_size, (tuple, list)) else window_size


def _prepare(q, k_cache, v_cache, k, v, cache_seqlens, cache_batch_idx, cache_leftpad, block_table, causal,
             num_splits, return_softmax_lse, config, f: Features, q_descale=None, k_descale=None,
             v_descale=None) -> _Call:
    """Check the call (ValueError with the reason) and decide everything about its launches from shapes."""
    if not isinstance(num_splits, int) or num_splits < 0:
        raise ValueError(f"flash-triton flash_attn_with_kvcache: num_splits must be an int >= 0, got {num_splits!r}")
    if q_descale is not None:
        raise ValueError("flash-triton flash_attn_with_kvcache: q_descale is not supported (the query is fp16/bf16; "
                         "an FP8 KV cache takes k_descale and v_descale)")
    if problem := kvcache_problem(q, k_cache, v_cache, k, v, cache_seqlens, cache_batch_idx, cache_leftpad,
                                  block_table, k_descale, v_descale):
        raise ValueError(f"flash-triton flash_attn_with_kvcache: {problem}")
    batch, sq, hq, d = q.shape
    hkv = k_cache.shape[2]
    groups = hq // hkv
    paged = block_table is not None
    page = k_cache.shape[1] if paged else 0
    cfg = (config or (DEFAULT_FP8 if k_cache.dtype in FP8_MAX else DEFAULT)).for_head_dim(d, page)
    capacity = block_table.shape[1] * page if paged else k_cache.shape[1]
    f = effective(f, sq, capacity, bool(causal))  # every key position is < capacity
    s_new = k.shape[1] if k is not None else 0
    out_shape = (batch, sq, hq, d)
    lse_shape = (batch, hq, sq) if return_softmax_lse else None
    if batch * sq * hq * d == 0:
        return _Call(out_shape, lse_shape, capacity, 0, 0, False, None, (), {}, None, (), {}, f, next(_SERIALS))
    p = plan(batch, hkv, sq * groups, capacity, q.device, cfg, num_splits)
    split = p.num_splits > 1
    tiles = batch * hkv * p.m_tiles
    width = block_d(d)  # the partials are as wide as the program's tiles (80, 96 -> 128)

    def strides(t, n=3):
        return tuple(t.stride()[:n]) if t is not None else (0,) * n

    # the output is allocated per call with `out_shape`: contiguous, so its strides are known here
    out_strides = (sq * hq * d, hq * d, d)
    heads = (hq, hkv, groups, sq, s_new, capacity, p.split_len, p.num_splits)
    flags = dict(CAUSAL=bool(causal), APPEND=k is not None, HAS_SEQLENS=isinstance(cache_seqlens, torch.Tensor),
                 HAS_LEFTPAD=cache_leftpad is not None, STORE_LSE=return_softmax_lse)
    part_acc = tiles * p.num_splits * p.block_m * width if split else 0  # the accumulators; then the (m, l) pairs
    fp8 = k_cache.dtype in FP8_MAX
    fwd_tail = (part_acc, *descale_strides(k_descale), *descale_strides(v_descale), *strides(q), *strides(k_cache),
                *strides(v_cache, 4), *strides(k), *strides(v), *out_strides, block_table.stride(0) if paged else 0,
                *heads)
    fwd_meta = dict(HEAD_DIM=d, BLOCK_M=p.block_m, BLOCK_N=cfg.block_n, PAGE_SIZE=page,
                    HAS_BATCH_IDX=cache_batch_idx is not None, SPLIT=split, FUSED_REDUCE=cfg.fused_reduce,
                    BLOCK_D=width, PREFETCH=cfg.prefetch_merge, MERGE_GROUP=cfg.merge_group, **flags, **f.meta(),
                    **(dict(DESCALE=True, **FP8_FORMAT[k_cache.dtype]) if fp8 else {}),
                    **(dict(V_KEYS=True) if v_keys(v_cache) else {}),
                    num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    two_launch = split and not cfg.fused_reduce
    return _Call(out_shape, lse_shape, capacity,
                 workspace=part_acc + tiles * p.num_splits * p.block_m * 2 if split else 0,
                 tiles=tiles, counted=split and cfg.fused_reduce,
                 fwd_grid=(p.num_splits, batch * hkv, p.m_tiles), fwd_tail=fwd_tail, fwd_meta=fwd_meta,
                 reduce_grid=(batch * hkv, p.m_tiles) if two_launch else None,
                 reduce_tail=(part_acc, *out_strides, *heads),
                 reduce_meta=dict(HEAD_DIM=d, BLOCK_M=p.block_m, BLOCK_D=width, PREFETCH=cfg.prefetch_merge,
                                  MERGE_GROUP=cfg.merge_group, **flags,
                                  WINDOW=fwd_meta["WINDOW"], SINKS=fwd_meta["SINKS"], num_warps=4),
                 features=f, serial=next(_SERIALS), out_like_q=q.stride() == (*out_strides, 1),
                 one=one_on(q.device) if fp8 else None)


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
                            cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, block_table=None,
                            softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                            rotary_interleaved=True, alibi_slopes=None, num_splits=0, return_softmax_lse=False,
                            s_aux=None, q_descale=None, k_descale=None, v_descale=None):
    """Attention of q `[B, Sq, Hq, D]` over a KV cache, appending `k`/`v` `[B, S_new, Hkv, D]` in place first.

    As flash-attn's `flash_attn_with_kvcache`: `cache_seqlens` (int or `[B]` int32) is each sequence's cached length
    before the append (None: the whole cache); the new keys land at positions cache_seqlens .. + S_new - 1 and the
    query attends to keys [cache_leftpad, cache_seqlens + S_new); causal is bottom-right aligned. Paged with
    `block_table` (`k_cache` `[num_blocks, page_size, Hkv, D]`). `num_splits` 0 picks the split count, n > 0 forces n.
    Returns out `[B, Sq, Hq, D]`, and `(out, softmax_lse [B, Hq, Sq])` with `return_softmax_lse`. `softcap`,
    `window_size` and `s_aux` (sinks) as flash-attn computes them (`_features.py`); rotary embeddings and ALiBi
    raise ValueError naming the argument. An FP8 cache (float8_e4m3fn or float8_e5m2, FlashAttention-3's
    convention): `k_descale`/`v_descale` fp32 `[B, Hkv]` or one element (the cache holds x / descale), the query,
    the appended `k`/`v` and the output fp16/bf16; appended keys/values are quantized into the cache.
    """
    if alibi_slopes is not None or rotary_cos is not None or rotary_sin is not None:
        refuse_unsupported("flash_attn_with_kvcache", alibi_slopes=alibi_slopes, rotary_cos=rotary_cos,
                           rotary_sin=rotary_sin)
    return kvcache_attention(q, k_cache, v_cache, k, v, cache_seqlens, cache_batch_idx, cache_leftpad, block_table,
                             softmax_scale, causal, num_splits, return_softmax_lse, softcap=softcap,
                             window_size=window_size, s_aux=s_aux, q_descale=q_descale, k_descale=k_descale,
                             v_descale=v_descale)
