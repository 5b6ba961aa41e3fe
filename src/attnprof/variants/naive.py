"""Stage one of the tutorial: attention written out by hand, with the out-of-place `masked_fill`.

Q·Kᵀ, scale, causal mask built inside the step (as the tutorial does: `ones().triu()` every call), `masked_fill`
(out of place: PyTorch copies the whole `[B, H, Sq, Sk]` score tensor first, the tutorial's sixth kernel),
softmax, ·V. GQA without copies: the query heads of one kv head are folded into the row dimension.
"""

from __future__ import annotations

import dataclasses

import torch

from attnprof.variants.base import Variant
from attnprof.workload import Inputs


def eager_attention(inputs: Inputs, *, inplace: bool) -> torch.Tensor:
    """The tutorial's eager attention. `inplace` picks `masked_fill_` over `masked_fill`."""
    q, k, v = inputs.q, inputs.k, inputs.v
    b, hq, sq, d = q.shape
    hkv, sk = k.shape[1], k.shape[2]
    g = hq // hkv
    qg = q.reshape(b, hkv, g * sq, d)  # (B, Hkv, G*Sq, D): the G query heads of a kv head, stacked
    scores = torch.matmul(qg, k.transpose(-2, -1))  # (B, Hkv, G*Sq, Sk)
    scores = scores * inputs.scale
    scores = scores.view(b, hkv, g, sq, sk)  # (B, Hkv, G, Sq, Sk)
    if inputs.causal:
        # built every step, as in the tutorial; bottom-right aligned (query i sees keys j <= i + Sk - Sq)
        hidden = torch.ones(sq, sk, dtype=torch.bool, device=q.device).triu(diagonal=sk - sq + 1)
        scores = scores.masked_fill_(hidden, float("-inf")) if inplace else scores.masked_fill(hidden, float("-inf"))
    if inputs.attn_mask is not None:
        mask = inputs.attn_mask[:, :, None]  # (B, 1, 1, Sq, Sk) broadcast over heads
        if mask.dtype == torch.bool:
            scores = scores.masked_fill_(~mask, float("-inf")) if inplace else scores.masked_fill(~mask, float("-inf"))
        else:
            scores = scores.add_(mask) if inplace else scores + mask
    probs = torch.softmax(scores, dim=-1).view(b, hkv, g * sq, sk)
    out = torch.matmul(probs, v)  # (B, Hkv, G*Sq, D)
    return out.view(b, hq, sq, d)


def plain_attention(inputs: Inputs) -> torch.Tensor:
    """Plain PyTorch as a model writes it, the numerics gate's baseline: k, v `[B, Hkv, Sk, D]` repeated to the
    query heads (query head h reads kv head h // G, transformers' `repeat_kv`), then `eager_attention`."""
    g = inputs.q.shape[1] // inputs.k.shape[1]
    if g == 1:
        return eager_attention(inputs, inplace=False)
    k, v = (t.repeat_interleave(g, dim=1) for t in (inputs.k, inputs.v))  # (B, Hq, Sk, D)
    return eager_attention(dataclasses.replace(inputs, k=k, v=v), inplace=False)


def plain_fp8_attention(inputs: Inputs) -> torch.Tensor:
    """Plain FP8 attention, the gate's baseline for `dtype="fp8"`: FlashAttention-3's arithmetic written out on the
    dequantised q, k, v (exact in fp32): QKᵀ and softmax in fp32, the unnormalised probabilities P = exp(s - rowmax)
    rounded to e4m3 for the P·V product (the one rounding FP8 attention adds beyond its inputs), the row sums from
    P before rounding, fp32 accumulation, the output in the inputs' dtype."""
    fmt = inputs.fp8_qkv.fmt if inputs.fp8_qkv is not None else torch.float8_e4m3fn
    g = inputs.q.shape[1] // inputs.k.shape[1]
    q, k, v = inputs.q.float(), *(t.float().repeat_interleave(g, dim=1) for t in (inputs.k, inputs.v))
    s = torch.matmul(q, k.transpose(-2, -1)) * inputs.scale
    keep = _keep(inputs)
    if keep is not None:
        s = s.masked_fill(~keep, float("-inf"))
    m = s.amax(dim=-1, keepdim=True)
    p = torch.exp(s - torch.where(torch.isinf(m), 0.0, m))
    row_sum = p.sum(dim=-1, keepdim=True)
    out = torch.matmul(p.to(fmt).float(), v) / torch.where(row_sum == 0, 1.0, row_sum)
    return out.to(inputs.q.dtype)


def _keep(inputs: Inputs) -> torch.Tensor | None:
    """Boolean `[B or 1, 1, Sq, Sk]` of the keys each query sees (None: all): `Inputs.keep`, else the causal rule
    (bottom-right aligned) of inputs made without `valid`."""
    keep = inputs.keep()
    if keep is not None:
        return keep
    if inputs.causal:
        sq, sk = inputs.q.shape[2], inputs.k.shape[2]
        return torch.ones(sq, sk, dtype=torch.bool, device=inputs.q.device).tril(sk - sq)[None, None]
    return None


def naive_attention(inputs: Inputs) -> torch.Tensor:
    return eager_attention(inputs, inplace=False)


NAIVE = Variant(
    name="naive",
    fn=naive_attention,
    description="QKᵀ, scale, out-of-place masked_fill (mask built each step), softmax, ·V",
    family="naive",
)
