"""The oracle: attention in float64, the definition of correct for every variant on every device.

Computed on the inputs' device (float64 runs everywhere, and on a GPU it keeps big references fast) in chunks of
batch × heads × query rows so the score matrices stay under ~512 MiB at any size. Rows that see no key at all come
out as zeros, the convention of FlashAttention and of every fused SDPA backend.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from attnprof.variants.base import Variant
from attnprof.workload import Inputs

_CHUNK_BYTES = 512 * 2**20


@dataclass(frozen=True)
class Chunk:
    """One block of the fp64 computation: batch `b`, query heads `heads`, query rows `rows`."""

    b: int
    heads: slice
    rows: slice
    scores: torch.Tensor  # (h, r, Sk): scale · q·kᵀ
    probs: torch.Tensor  # (h, r, Sk): softmax of scores (+ additive mask, hidden keys at -inf); 0 on dead rows
    v: torch.Tensor  # (h, Sk, D): the kv head each query head reads


def fp64_chunks(inputs: Inputs, budget_bytes: int = _CHUNK_BYTES) -> Iterator[Chunk]:
    """The oracle's blocks in float64, each `[h, r, Sk]` within `budget_bytes`: shared by the reference and by
    the numerics that need the probabilities themselves (the scale direction)."""
    q, k, v = (t.detach().to(torch.float64) for t in (inputs.q, inputs.k, inputs.v))
    b, hq, sq, _ = q.shape
    hkv, sk = k.shape[1], k.shape[2]
    groups = hq // hkv
    keep = inputs.keep()  # bool [B, 1, Sq, Sk] or None
    additive = inputs.attn_mask if inputs.attn_mask is not None and inputs.attn_mask.is_floating_point() else None
    rows = max(1, min(sq, budget_bytes // (sk * 8)))  # query rows per chunk: one head's scores within budget
    heads_per_chunk = max(1, min(hq, budget_bytes // (rows * sk * 8)))
    for bi in range(b):
        for h0 in range(0, hq, heads_per_chunk):
            h1 = min(hq, h0 + heads_per_chunk)
            kv_idx = torch.arange(h0, h1, device=q.device) // groups  # query head h reads kv head h // G
            kc, vc = k[bi, kv_idx], v[bi, kv_idx]  # (h, Sk, D)
            for r0 in range(0, sq, rows):
                r1 = min(sq, r0 + rows)
                scores = torch.matmul(q[bi, h0:h1, r0:r1], kc.transpose(-2, -1)) * inputs.scale  # (h, r, Sk)
                logits = scores if additive is None else scores + additive[bi, :, r0:r1].to(torch.float64)
                if keep is not None:
                    logits = logits.masked_fill(~keep[bi, :, r0:r1], float("-inf"))
                probs = torch.nan_to_num(torch.softmax(logits, dim=-1), nan=0.0)  # rows with no visible key → 0
                yield Chunk(bi, slice(h0, h1), slice(r0, r1), scores, probs, vc)


def reference_attention(inputs: Inputs) -> torch.Tensor:
    """fp64 `[B, Hq, Sq, D]` on the inputs' device."""
    b, hq, sq, d = inputs.q.shape
    out = torch.empty(b, hq, sq, d, dtype=torch.float64, device=inputs.q.device)
    for c in fp64_chunks(inputs):
        out[c.b, c.heads, c.rows] = torch.matmul(c.probs, c.v)
    return out


REFERENCE = Variant(
    name="reference",
    fn=reference_attention,
    description="float64 oracle (chunked); the definition of correct",
    family="reference",
    fp8_attention="fp64 on the dequantised q, k, v (the oracle FP8 attention is gated against)",
)
