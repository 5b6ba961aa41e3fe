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

import math

import torch

from ._checks import common_problem, device_problem, index_problem, refuse_unsupported, tensor_problem
from ._config import block_d
from ._decode import kvcache_fwd, kvcache_reduce
from ._splits import DEFAULT, DecodeConfig, counters, plan


def kvcache_problem(q, k_cache, v_cache, k, v, cache_seqlens, cache_batch_idx, cache_leftpad, block_table):
    """None when the call is well formed, else why not (shapes, dtypes, devices only)."""
    for name, t, layout in (("q", q, "[B, Sq, Hq, D]"), ("k_cache", k_cache, "[B_cache, S_cache, Hkv, D]"),
                            ("v_cache", v_cache, "[B_cache, S_cache, Hkv, D]")):
        if problem := tensor_problem(name, t, 4, layout):
            return problem
    if k_cache.shape != v_cache.shape:
        return f"k_cache and v_cache must have the same shape, got {tuple(k_cache.shape)} and {tuple(v_cache.shape)}"
    tensors = {"q": q, "k_cache": k_cache, "v_cache": v_cache}
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


def kvcache_attention(q, k_cache, v_cache, k=None, v=None, cache_seqlens=None, cache_batch_idx=None,
                      cache_leftpad=None, block_table=None, softmax_scale=None, causal=False, num_splits=0,
                      return_softmax_lse=False, *, config: DecodeConfig | None = None):
    """The launch behind `flash_attn_with_kvcache` (and `flash_attn_func` at decode shapes), with an optional
    explicit `config`. Returns out `[B, Sq, Hq, D]`, and LSE `[B, Hq, Sq]` fp32 when asked."""
    if not isinstance(num_splits, int) or num_splits < 0:
        raise ValueError(f"flash-triton flash_attn_with_kvcache: num_splits must be an int >= 0, got {num_splits!r}")
    if problem := kvcache_problem(q, k_cache, v_cache, k, v, cache_seqlens, cache_batch_idx, cache_leftpad,
                                  block_table):
        raise ValueError(f"flash-triton flash_attn_with_kvcache: {problem}")
    cfg = config or DEFAULT
    batch, sq, hq, d = q.shape
    hkv = k_cache.shape[2]
    groups = hq // hkv
    paged = block_table is not None
    page = k_cache.shape[1] if paged else 0
    capacity = block_table.shape[1] * page if paged else k_cache.shape[1]
    s_new = k.shape[1] if k is not None else 0
    out = torch.empty((batch, sq, hq, d), dtype=q.dtype, device=q.device)
    lse = torch.empty((batch, hq, sq), dtype=torch.float32, device=q.device) if return_softmax_lse else None
    if out.numel() == 0:
        return (out, lse) if return_softmax_lse else out
    p = plan(batch, hkv, sq * groups, capacity, q.device, cfg, num_splits)
    split = p.num_splits > 1
    tiles = batch * hkv * p.m_tiles
    width = block_d(d)  # the partials are as wide as the program's tiles (80, 96 -> 128)
    part_acc = torch.empty(tiles * p.num_splits * p.block_m * width, dtype=torch.float32, device=q.device) if split else None
    part_ml = torch.empty(tiles * p.num_splits * p.block_m * 2, dtype=torch.float32, device=q.device) if split else None
    count = counters(q.device, tiles) if split and cfg.fused_reduce else None
    seqlens = cache_seqlens if isinstance(cache_seqlens, torch.Tensor) else None
    seqlen_scalar = capacity if cache_seqlens is None else (0 if seqlens is not None else int(cache_seqlens))
    scale = (d ** -0.5 if softmax_scale is None else float(softmax_scale)) * math.log2(math.e)

    def strides(t, n=3):
        return t.stride()[:n] if t is not None else (0,) * n

    flags = dict(CAUSAL=bool(causal), APPEND=k is not None, HAS_SEQLENS=seqlens is not None,
                 HAS_LEFTPAD=cache_leftpad is not None, STORE_LSE=lse is not None)
    kvcache_fwd[(p.num_splits, batch * hkv, p.m_tiles)](
        q, k_cache, v_cache, k, v, out, lse, seqlens, cache_batch_idx, cache_leftpad, block_table,
        part_acc, part_ml, count, seqlen_scalar, scale,
        *strides(q), *strides(k_cache), *strides(v_cache), *strides(k), *strides(v), *strides(out),
        block_table.stride(0) if paged else 0,
        hq, hkv, groups, sq, s_new, capacity, p.split_len, p.num_splits,
        HEAD_DIM=d, BLOCK_M=p.block_m, BLOCK_N=cfg.block_n, PAGE_SIZE=page,
        HAS_BATCH_IDX=cache_batch_idx is not None, SPLIT=split, FUSED_REDUCE=cfg.fused_reduce, BLOCK_D=width, **flags,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    if split and not cfg.fused_reduce:
        kvcache_reduce[(batch * hkv, p.m_tiles)](
            out, lse, seqlens, cache_leftpad, part_acc, part_ml, seqlen_scalar, *strides(out),
            hq, hkv, groups, sq, s_new, capacity, p.split_len, p.num_splits,
            HEAD_DIM=d, BLOCK_M=p.block_m, BLOCK_D=width, **flags, num_warps=4,
        )
    return (out, lse) if return_softmax_lse else out


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
                            cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, block_table=None,
                            softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                            rotary_interleaved=True, alibi_slopes=None, num_splits=0, return_softmax_lse=False,
                            s_aux=None):
    """Attention of q `[B, Sq, Hq, D]` over a KV cache, appending `k`/`v` `[B, S_new, Hkv, D]` in place first.

    As flash-attn's `flash_attn_with_kvcache`: `cache_seqlens` (int or `[B]` int32) is each sequence's cached length
    before the append (None: the whole cache); the new keys land at positions cache_seqlens .. + S_new - 1 and the
    query attends to keys [cache_leftpad, cache_seqlens + S_new); causal is bottom-right aligned. Paged with
    `block_table` (`k_cache` `[num_blocks, page_size, Hkv, D]`). `num_splits` 0 picks the split count, n > 0 forces n.
    Returns out `[B, Sq, Hq, D]`, and `(out, softmax_lse [B, Hq, Sq])` with `return_softmax_lse`. Rotary
    embeddings, windows, softcap, ALiBi and sinks raise ValueError naming the argument.
    """
    refuse_unsupported("flash_attn_with_kvcache", window_size=window_size, softcap=softcap, alibi_slopes=alibi_slopes,
                       s_aux=s_aux, rotary_cos=rotary_cos, rotary_sin=rotary_sin)
    return kvcache_attention(q, k_cache, v_cache, k, v, cache_seqlens, cache_batch_idx, cache_leftpad, block_table,
                             softmax_scale, causal, num_splits, return_softmax_lse)
