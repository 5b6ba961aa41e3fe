"""Rebuild a recorded SDPA call: the same shapes, dtypes, strides, mask kind, scale, GQA and causal flag, as `Inputs`.

The watcher keeps each call's envelope, not its tensors. To time the call again on other backends, `replay` makes
new tensors that look the same to SDPA's dispatcher and to the kernels: q, k and v with the recorded memory layout
(a `[B, S, H, D]` projection seen through `.transpose(1, 2)` stays that, a KV cache slice keeps its row stride), a
boolean or additive mask of the recorded shape and dtype, the recorded scale, and `enable_gqa` whenever the heads
differ (as the recorded call had to). The values are random normal; a mask keeps the causal rule (bottom-right
aligned), which is all transformers' masks say for an unpadded batch.

`at_length(record, kv_len)` is the same call at another KV length (and, for a prefill, the same query length): the
"first call at a new length" the timing needs, since a plan-building backend (cuDNN) pays per new length.
"""

from __future__ import annotations

import torch

from attnprof.audit.phases import effective_sq, shape_class
from attnprof.dispatch.watch import DispatchRecord
from attnprof.workload import DTYPES, Inputs, Workload, dtype_name


def _storage_view(shape: tuple, stride: tuple, dtype: torch.dtype, device: str, gen: torch.Generator) -> torch.Tensor:
    """A random tensor with exactly this shape and stride (over a storage just big enough for it)."""
    size = 1 + sum((n - 1) * s for n, s in zip(shape, stride, strict=True) if n > 0)
    base = torch.randn(size, generator=gen).to(device=device, dtype=dtype)
    return base.as_strided(shape, stride)


def _dense_like(shape: tuple, old_shape: tuple, old_stride: tuple) -> tuple:
    """Strides for `shape` with the recorded dimension order (outermost = largest stride) and no gaps: a tensor
    made contiguous as `[B, S, H, D]` and transposed stays that kind of view at any length."""
    order = sorted(range(len(old_shape)), key=lambda i: (-old_stride[i], i))
    stride = [0] * len(shape)
    step = 1
    for i in reversed(order):
        stride[i] = step
        step *= shape[i]
    return tuple(stride)


def _is_dense(shape: tuple, stride: tuple) -> bool:
    """No gaps: the strides are a permutation of a contiguous layout (size-1 dimensions do not count)."""
    dims = sorted((s, n) for n, s in zip(shape, stride, strict=True) if n > 1)
    step = 1
    for s, n in dims:
        if s != step:
            return False
        step *= n
    return True


def _strides_for(shape: tuple, old_shape: tuple, old_stride: tuple) -> tuple:
    if tuple(shape) == tuple(old_shape):
        return tuple(old_stride)
    if _is_dense(old_shape, old_stride):
        return _dense_like(shape, old_shape, old_stride)
    return tuple(old_stride)  # a slice of a larger buffer (a static cache): keep its row strides


def replay_shapes(rec: DispatchRecord, kv_len: int | None = None) -> tuple[tuple, tuple, tuple, tuple | None]:
    """(q, k, v, mask) shapes of the recorded call, at `kv_len` keys when given (a prefill's queries follow)."""
    q, k, v = tuple(rec.q_shape), tuple(rec.k_shape), tuple(rec.v_shape or rec.k_shape)
    m = tuple(rec.mask_shape) if rec.mask_shape is not None else None
    if kv_len is None or kv_len == k[2]:
        return q, k, v, m
    sq_eff = effective_sq(rec)
    new_sq = q[2]
    if shape_class(sq_eff, k[2]) == "prefill":  # Sq = Sk: the queries grow with the keys
        new_sq = kv_len * (q[2] // sq_eff)
        sq_eff = kv_len
    q = (q[0], q[1], new_sq, q[3])
    k = (k[0], k[1], kv_len, k[3])
    v = (v[0], v[1], kv_len, v[3])
    if m is not None:
        m = (m[0], m[1], sq_eff if m[2] > 1 or sq_eff == 1 else m[2], kv_len)
    return q, k, v, m


def replay(rec: DispatchRecord, *, kv_len: int | None = None, device: str | None = None,
           seed: int = 0) -> tuple[Workload, Inputs]:
    """The recorded call (at `kv_len` keys when given) as a `Workload` and the `Inputs` a variant runs.

    q `[B, Hq, Sq, D]`, k/v `[B, Hkv, Sk, D]` with the recorded strides (or their layout at a new length)."""
    device = device or rec.device
    q_shape, k_shape, v_shape, m_shape = replay_shapes(rec, kv_len)
    dtypes = [DTYPES[dtype_name(d)] for d in (rec.dtypes or (rec.dtype,) * 3)]
    gen = torch.Generator().manual_seed(seed)
    q = _storage_view(q_shape, _strides_for(q_shape, rec.q_shape, rec.strides.get("q", ())), dtypes[0], device, gen)
    k = _storage_view(k_shape, _strides_for(k_shape, rec.k_shape, rec.strides.get("k", ())), dtypes[1], device, gen)
    v = _storage_view(v_shape, _strides_for(v_shape, rec.v_shape or rec.k_shape, rec.strides.get("v", ())),
                      dtypes[2], device, gen)
    sq, sk = q_shape[2], k_shape[2]
    causal = rec.causal or rec.mask.startswith("causal-bias") or rec.mask in ("bool", "additive")
    keep = None
    if causal:  # bottom-right aligned: query i sees key j when j <= i + (Sk - Sq)
        rows = m_shape[2] if m_shape is not None else sq
        keep = torch.ones(rows, sk, dtype=torch.bool, device=device).tril(diagonal=sk - rows)
    attn_mask = None
    if rec.mask in ("bool", "additive") and m_shape is not None:
        valid = keep.expand(m_shape).contiguous()
        attn_mask = valid
        if rec.mask == "additive":
            mdt = DTYPES[dtype_name(rec.mask_dtype)] if rec.mask_dtype else dtypes[0]
            attn_mask = torch.zeros(m_shape, dtype=mdt, device=device).masked_fill_(~valid, float("-inf"))
        keep = valid
    elif keep is not None:
        keep = keep.expand(q_shape[0], 1, sq, sk) if keep.shape[0] == sq else None
    scale = rec.scale if rec.scale is not None else q_shape[3] ** -0.5
    inputs = Inputs(q=q, k=k, v=v, causal=causal and attn_mask is None, scale=float(scale), attn_mask=attn_mask,
                    valid=keep)
    mask_kind = rec.mask if rec.mask in ("bool", "additive") and attn_mask is not None else "none"
    heads, kv_heads = q_shape[1], k_shape[1]
    if heads % kv_heads:  # not a GQA grouping the Workload can describe: keep the call, describe it as MHA
        kv_heads = heads
    workload = Workload(batch=q_shape[0], heads=heads, kv_heads=kv_heads, seq=sq, kv_seq=sk, head_dim=q_shape[3],
                        dtype=dtype_name(rec.dtype), causal=causal, mask=mask_kind, device=device,
                        transposed=not q.is_contiguous())
    return workload, inputs
