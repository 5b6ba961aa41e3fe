"""FlexAttention, compiled: attention written as a `mask_mod` that Inductor turns into one Triton kernel.

The block mask is built once per workload (outside the timed step; it is the sparse description of which
blocks to skip) and the compiled `flex_attention` is shared by every call. Causal is bottom-right aligned.
"""

from __future__ import annotations

import functools

import torch

from attnprof.variants.base import Accepted, Rejected, Support, Variant
from attnprof.workload import Inputs, Workload


@functools.cache
def _compiled():
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


def _mask_mod(inputs: Inputs):
    q_len, kv_len = inputs.q.shape[2], inputs.k.shape[2]
    offset = kv_len - q_len
    valid = inputs.valid  # bool [B, 1, Sq, Sk] or None

    if valid is not None and inputs.attn_mask is not None:
        def from_tensor(b, h, q_idx, kv_idx):
            return valid[b, 0, q_idx, kv_idx]
        return from_tensor

    def causal(b, h, q_idx, kv_idx):
        return q_idx + offset >= kv_idx
    return causal


_BLOCK_MASKS: dict[tuple, object] = {}


def _block_mask(inputs: Inputs):
    from torch.nn.attention.flex_attention import create_block_mask

    b, _, sq, _ = inputs.q.shape
    sk = inputs.k.shape[2]
    key = (b, sq, sk, str(inputs.q.device), inputs.causal, id(inputs.valid) if inputs.attn_mask is not None else 0)
    if key not in _BLOCK_MASKS:
        if len(_BLOCK_MASKS) > 16:
            _BLOCK_MASKS.clear()
        per_batch = inputs.attn_mask is not None
        _BLOCK_MASKS[key] = create_block_mask(_mask_mod(inputs), B=b if per_batch else None, H=None,
                                              Q_LEN=sq, KV_LEN=sk, device=inputs.q.device)
    return _BLOCK_MASKS[key]


def flex_attention_call(inputs: Inputs) -> torch.Tensor:
    """`[B, H, S, D]` in and out; block mask cached per shape."""
    block_mask = _block_mask(inputs) if (inputs.causal or inputs.attn_mask is not None) else None
    gqa = inputs.k.shape[1] != inputs.q.shape[1]
    return _compiled()(inputs.q, inputs.k, inputs.v, block_mask=block_mask, scale=inputs.scale, enable_gqa=gqa)


def supports(workload: Workload) -> Support:
    if workload.mask == "additive":
        return Rejected("flex: an additive float mask would be a score_mod, not a block mask; not wired here")
    if workload.head_dim & (workload.head_dim - 1) and workload.device.startswith("cuda"):
        return Rejected(f"flex: head dim {workload.head_dim} is not a power of two (Triton block shapes need one)")
    return Accepted()


FLEX = Variant(name="flex", fn=flex_attention_call, supports=supports, family="extra", backend="flex",
               description="torch.compile(flex_attention) with a causal block mask")
