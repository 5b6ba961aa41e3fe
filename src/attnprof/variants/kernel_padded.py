"""A padded batch through a flash-attn kernel's varlen form: unpad, `flash_attn_varlen_func`, scatter back.

flash-attn kernels take no mask. What a padding mask says (each sequence's real keys are one range [k0, k1), left
or right padded, with or without the causal rule) is what `cu_seqlens` say, so the `kernel` variant runs padded
workloads (`pad-left`, `pad-right`, and `bool`: the causal rule as a tensor) through `flash_attn_varlen_func`
instead of refusing them. The rows of one sequence fall in three groups, by what they see under the workload's rule
(query i sees key j when k0 <= j < k1 and, causal, j <= i + Sk - Sq, bottom-right as everywhere):

- rows before q0 = k0 - (Sk - Sq) see no key: zeros, as the oracle's (FlashAttention's convention);
- rows [q0, q1), q1 = k1 - (Sk - Sq), see a causal prefix of the range: one causal varlen call over them and the
  range (bottom-right per sequence: j <= i + k1 - q1, which is the workload's rule);
- rows from q1 on (right padding's padded queries) see the whole range: a second, non-causal call.

Without the causal rule every row sees the whole range: one non-causal call. A mask of any other form (a hole, a
per-head mask, a sliding window) raises ValueError naming it: never a silently different answer.
Layout: `[B, H, S, D]` in and out; packed `[total, H, D]` (flash-attn's) in between.
"""

from __future__ import annotations

import torch

PADDED_MASKS = ("pad-left", "pad-right", "bool")  # key-range masks; "additive" is a float tensor: not taken


def key_ranges(mask: torch.Tensor, causal_shape: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """(k0, k1, causal) of a bool mask `[B, 1, Sq, Sk]` (True = attend): each sequence's key range [k0, k1) (int64
    `[B]`) and whether the causal rule is in it; ValueError when the mask is not that form."""
    if mask.dtype != torch.bool or mask.dim() != 4 or mask.shape[1] != 1:
        raise ValueError(f"kernel: flash_attn_varlen_func takes a padding mask as key ranges; got a {mask.dtype} mask "
                         f"of shape {tuple(mask.shape)} (a bool [B, 1, Sq, Sk] one is needed)")
    sq, sk = causal_shape
    m = mask[:, 0].expand(mask.shape[0], sq, sk)  # [B, Sq, Sk]
    keys = m.any(1)  # [B, Sk]: the keys some query sees
    has = keys.any(-1)
    k0 = torch.where(has, keys.int().argmax(-1), 0).long()
    k1 = torch.where(has, sk - keys.flip(-1).int().argmax(-1), 0).long()
    pos = torch.arange(sk, device=mask.device)
    span = (pos >= k0[:, None]) & (pos < k1[:, None])  # [B, Sk]
    tril = torch.ones(sq, sk, dtype=torch.bool, device=mask.device).tril(sk - sq)
    if torch.equal(m, span[:, None, :] & tril):
        return k0, k1, True
    if torch.equal(m, span[:, None, :].expand_as(m)):
        return k0, k1, False
    raise ValueError("kernel: this mask is not one key range per sequence (left or right padding, causal "
                     "bottom-right or not); flash_attn_varlen_func cannot express it (try sdpa or flex)")


def _call(module, q, k, v, rows: torch.Tensor, keys: torch.Tensor, scale: float, causal: bool) -> torch.Tensor:
    """One varlen call over the rows `[B, Sq]` and keys `[B, Sk]` selected per sequence; `[total_q, Hq, D]`."""
    cu_q = torch.nn.functional.pad(rows.sum(1).cumsum(0), (1, 0)).to(torch.int32)  # [B + 1]
    cu_k = torch.nn.functional.pad(keys.sum(1).cumsum(0), (1, 0)).to(torch.int32)
    out = module.flash_attn_varlen_func(q[rows], k[keys], v[keys], cu_q, cu_k, int(rows.sum(1).max()),
                                        int(keys.sum(1).max()), softmax_scale=scale, causal=causal)
    return out[0] if isinstance(out, tuple) else out


def padded_attention(module, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                     scale: float) -> torch.Tensor:
    """q `[B, Hq, Sq, D]`, k/v `[B, Hkv, Sk, D]`, a key-range bool mask → `[B, Hq, Sq, D]` (see the module docstring)."""
    b, _, sq, _ = q.shape
    sk = k.shape[2]
    k0, k1, causal = key_ranges(mask, (sq, sk))
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))  # [B, S, H, D]; boolean indexing packs them [total, H, D]
    pos_k = torch.arange(sk, device=q.device)
    keys = (pos_k >= k0[:, None]) & (pos_k < k1[:, None])  # [B, Sk]
    out = torch.zeros_like(qt)  # [B, Sq, Hq, D]: rows that see no key stay zeros
    pos_q = torch.arange(sq, device=q.device)[None, :]
    if causal:
        q1 = (k1 - (sk - sq)).clamp(0, sq)[:, None]
        q0 = torch.minimum((k0 - (sk - sq)).clamp(min=0)[:, None], q1)
        groups = (((pos_q >= q0) & (pos_q < q1), True), ((pos_q >= q1) & (k1 > k0)[:, None], False))
    else:
        groups = (((pos_q >= 0) & (k1 > k0)[:, None], False),)
    for rows, rule in groups:
        if bool(rows.any()):
            out[rows] = _call(module, qt, kt, vt, rows, keys, scale, rule)
    return out.transpose(1, 2)  # [B, Sq, Hq, D] -> [B, Hq, Sq, D]
