"""One bug per function; see the package docstring. Written in the plain style a user would write them."""

from __future__ import annotations

import torch


def _attend(q, k, v, *, causal, scale, attn_mask=None, diag_shift=0, top_left=False, kv_map="interleave",
            masked_fill_value=float("-inf"), guard_empty_rows=True, bool_as_additive=False):
    """Reference-style attention with knobs for the bugs. Computes in float32 for half inputs."""
    b, hq, sq, d = q.shape
    hkv, sk = k.shape[1], k.shape[2]
    g = hq // hkv
    if kv_map == "interleave":  # query head h reads kv head h // g (correct)
        k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    else:  # "tile": query head h reads kv head h % hkv (wrong)
        k, v = k.repeat(1, g, 1, 1), v.repeat(1, g, 1, 1)
    qf, kf, vf = q.float(), k.float(), v.float()
    scores = qf @ kf.transpose(-2, -1) * scale  # (B, Hq, Sq, Sk)
    keep = torch.ones(sq, sk, dtype=torch.bool, device=q.device)
    if causal:
        offset = 0 if top_left else sk - sq
        keep = keep.tril(diagonal=offset + diag_shift)
    keep = keep.expand(b, 1, sq, sk)
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool and not bool_as_additive:
            keep = keep & attn_mask
        else:
            scores = scores + attn_mask.float()
    scores = scores.masked_fill(~keep, masked_fill_value)
    probs = torch.softmax(scores, dim=-1)
    if guard_empty_rows:
        probs = probs.masked_fill(~keep.any(-1, keepdim=True), 0.0)
    return (probs @ vf).to(q.dtype)


def correct(q, k, v, *, causal, scale, attn_mask=None):
    """Control: the same code with no bug (must pass)."""
    return _attend(q, k, v, causal=causal, scale=scale, attn_mask=attn_mask)


def scale_off_1pct(q, k, v, *, causal, scale, attn_mask=None):
    """Softmax scale 1% too large."""
    return _attend(q, k, v, causal=causal, scale=scale * 1.01, attn_mask=attn_mask)


def off_by_1e6(q, k, v, *, causal, scale, attn_mask=None):
    """Every output one part in a million too large (a normaliser or constant rounded wrong): an fp32-sized bug."""
    out = _attend(q, k, v, causal=causal, scale=scale, attn_mask=attn_mask)
    return out * (1 + 1e-6)


def scale_1_over_d(q, k, v, *, causal, scale, attn_mask=None):
    """Scale 1/D instead of 1/sqrt(D)."""
    return _attend(q, k, v, causal=causal, scale=scale * scale, attn_mask=attn_mask)


def causal_off_by_one(q, k, v, *, causal, scale, attn_mask=None):
    """Causal diagonal one too far: each query also sees the next key."""
    if attn_mask is not None:  # the mask carries the causal rule: shift it too, as a buggy kernel would
        attn_mask = attn_mask | torch.roll(attn_mask, 1, dims=-1) & attn_mask.any(-1, keepdim=True)
    return _attend(q, k, v, causal=causal, scale=scale, attn_mask=attn_mask, diag_shift=1)


def causal_top_left(q, k, v, *, causal, scale, attn_mask=None):
    """Causal aligned top-left (is_causal=True semantics) where Sq != Sk."""
    return _attend(q, k, v, causal=causal, scale=scale, attn_mask=attn_mask, top_left=True)


def padded_rows_nan(q, k, v, *, causal, scale, attn_mask=None):
    """Rows with no visible key come out NaN (softmax over all -inf, no guard)."""
    return _attend(q, k, v, causal=causal, scale=scale, attn_mask=attn_mask, guard_empty_rows=False)


def padded_rows_mean(q, k, v, *, causal, scale, attn_mask=None):
    """Masked scores filled with finfo.min: rows with no visible key come out as the mean of V."""
    return _attend(q, k, v, causal=causal, scale=scale, attn_mask=attn_mask, guard_empty_rows=False,
                   masked_fill_value=torch.finfo(torch.float32).min)


def padding_ignored(q, k, v, *, causal, scale, attn_mask=None):
    """The padding mask is dropped; only the causal rule is applied (rebuilt from the shapes)."""
    return _attend(q, k, v, causal=causal or attn_mask is not None, scale=scale)


def bool_mask_as_bias(q, k, v, *, causal, scale, attn_mask=None):
    """A boolean mask added as a 0/1 bias instead of masking (the raw cuDNN op's trap)."""
    return _attend(q, k, v, causal=causal, scale=scale, attn_mask=attn_mask, bool_as_additive=True)


def gqa_tiled(q, k, v, *, causal, scale, attn_mask=None):
    """GQA heads mapped wrongly: query head h reads kv head h % Hkv."""
    return _attend(q, k, v, causal=causal, scale=scale, attn_mask=attn_mask, kv_map="tile")


def _blockwise(q, k, v, *, causal, scale, attn_mask, acc_dtype, block=16):
    """Online-softmax over key blocks (FlashAttention's loop) with the running max, sum and output in acc_dtype."""
    b, hq, sq, d = q.shape
    hkv, sk = k.shape[1], k.shape[2]
    g = hq // hkv
    k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    keep = torch.ones(sq, sk, dtype=torch.bool, device=q.device)
    if causal:
        keep = keep.tril(diagonal=sk - sq)
    keep = keep.expand(b, 1, sq, sk)
    if attn_mask is not None:
        keep = keep & attn_mask
    m = torch.full((b, hq, sq, 1), float("-inf"), dtype=acc_dtype, device=q.device)
    l = torch.zeros((b, hq, sq, 1), dtype=acc_dtype, device=q.device)
    acc = torch.zeros((b, hq, sq, d), dtype=acc_dtype, device=q.device)
    for j in range(0, sk, block):
        s = (q.float() @ k[:, :, j:j + block].float().transpose(-2, -1) * scale)  # (B, Hq, Sq, blk) in fp32
        s = s.masked_fill(~keep[..., j:j + block], float("-inf")).to(acc_dtype)
        m_new = torch.maximum(m, s.amax(-1, keepdim=True))
        safe = torch.where(m_new == float("-inf"), torch.zeros_like(m_new), m_new)
        p = torch.exp(s - safe)
        alpha = torch.exp(m - safe)
        l = l * alpha + p.sum(-1, keepdim=True)
        acc = acc * alpha + (p @ v[:, :, j:j + block].to(acc_dtype))
        m = m_new
    out = acc / torch.where(l == 0, torch.ones_like(l), l)
    return out.to(q.dtype)


def blockwise_fp32(q, k, v, *, causal, scale, attn_mask=None):
    """Control: FlashAttention's blockwise loop with fp32 accumulators (must pass)."""
    return _blockwise(q, k, v, causal=causal, scale=scale, attn_mask=attn_mask, acc_dtype=torch.float32)


def half_accumulator(q, k, v, *, causal, scale, attn_mask=None):
    """Blockwise loop with the running max, sum and output accumulated in the input's half dtype (fp16 for fp32)."""
    acc = q.dtype if q.dtype in (torch.float16, torch.bfloat16) else torch.float16
    return _blockwise(q, k, v, causal=causal, scale=scale, attn_mask=attn_mask, acc_dtype=acc)


def last_key_dropped(q, k, v, *, causal, scale, attn_mask=None):
    """Loop bound off by one: the last key is never read."""
    keep = torch.ones(k.shape[2], dtype=torch.bool, device=q.device)
    keep[-1] = False
    mask = keep.expand(q.shape[0], 1, q.shape[2], k.shape[2])
    if attn_mask is not None:
        mask = mask & attn_mask
    return _attend(q, k, v, causal=causal, scale=scale, attn_mask=mask)


# --- bad input, not bad numbers: these must end with exit 2 -------------------------------------------------------
def wrong_layout(q, k, v, *, causal, scale, attn_mask=None):
    """Returns [B, Sq, H, D] instead of [B, H, Sq, D]."""
    return correct(q, k, v, causal=causal, scale=scale, attn_mask=attn_mask).transpose(1, 2)


def wrong_signature(q, k):
    """Takes two tensors: not an attention function."""
    return q


# --- a crash, not bad numbers: the GQA call convention ---------------------------------------------------------------
def needs_hq_heads(q, k, v, *, causal, scale, attn_mask=None):
    """Assumes k and v have as many heads as q (no repeat_kv): raises on a GQA call, fine without GQA."""
    scores = (q @ k.transpose(-1, -2)) * scale  # [B, Hq, Sq, Sk]: needs k [B, Hq, Sk, D]
    if causal:
        sq, sk = scores.shape[-2:]
        scores = scores.masked_fill(~torch.ones(sq, sk, dtype=torch.bool).tril(sk - sq), float("-inf"))
    return torch.softmax(scores, -1) @ v


def _from_fp8(kv_cache, k_factor=1.0, v_descale=True):
    """The dequantised keys/values of an FP8 cache (`workload.Fp8KV`), the key descale times `k_factor`, the value
    descale applied or not."""
    kd = kv_cache.k_descale[:, :, None, None] * k_factor
    vd = kv_cache.v_descale[:, :, None, None] if v_descale else 1.0
    return kv_cache.k.float() * kd, kv_cache.v.float() * vd


def fp8_correct(q, k, v, *, causal, scale, attn_mask=None, kv_cache=None):
    """Control for the FP8 mutants: reads the FP8 cache as stored, descales right (must pass)."""
    if kv_cache is not None:
        k, v = (t.to(q.dtype) for t in _from_fp8(kv_cache))
    return _attend(q, k, v, causal=causal, scale=scale, attn_mask=attn_mask)


def fp8_k_descale_2x(q, k, v, *, causal, scale, attn_mask=None, kv_cache=None):
    """An FP8 cache's key descale off by 2x (a per-tensor scale applied twice, a power of two lost)."""
    if kv_cache is not None:
        k, v = (t.to(q.dtype) for t in _from_fp8(kv_cache, k_factor=2.0))
    return _attend(q, k, v, causal=causal, scale=scale, attn_mask=attn_mask)


def fp8_v_descale_ignored(q, k, v, *, causal, scale, attn_mask=None, kv_cache=None):
    """An FP8 cache's value descale never applied (the output off by that factor)."""
    if kv_cache is not None:
        k, v = (t.to(q.dtype) for t in _from_fp8(kv_cache, v_descale=False))
    return _attend(q, k, v, causal=causal, scale=scale, attn_mask=attn_mask)


def _fp8_attention(q8, k8, v8, descales, causal, scale, factors=(1.0, 1.0, 1.0)):
    """FP8 attention over e4m3 q, k, v `[B, H, S, D]` with FlashAttention-3's descales `[B, Hkv]` (each times its
    factor; 0 means "not applied"), P rounded to e4m3 as FP8 kernels do; bf16 out."""
    from attnprof.variants.naive import plain_fp8_attention
    from attnprof.workload import Inputs

    def deq(x8, d, factor):
        d = d.repeat_interleave(x8.shape[1] // d.shape[1], dim=1)[:, :, None, None]
        return x8.float() * (d * factor if factor else 1.0)

    q, k, v = (deq(x, d, f).to(torch.bfloat16) for x, d, f in zip((q8, k8, v8), descales, factors))
    return plain_fp8_attention(Inputs(q, k, v, causal, scale))


def fp8_attn_correct(q, k, v, *, causal, scale, q_descale, k_descale, v_descale):
    """Control for the FP8-attention mutants: e4m3 q, k, v with their descales, as FlashAttention-3 (must pass)."""
    return _fp8_attention(q, k, v, (q_descale, k_descale, v_descale), causal, scale)


def fp8_attn_q_descale_2x(q, k, v, *, causal, scale, q_descale, k_descale, v_descale):
    """FP8 attention with the query descale applied twice (the logits off by 2x)."""
    return _fp8_attention(q, k, v, (q_descale, k_descale, v_descale), causal, scale, factors=(2.0, 1.0, 1.0))


def fp8_attn_scale_off_1pct(q, k, v, *, causal, scale, q_descale, k_descale, v_descale):
    """FP8 attention with the softmax scale 1 % off (a descale folded into it slightly wrong)."""
    return _fp8_attention(q, k, v, (q_descale, k_descale, v_descale), causal, scale * 1.01)


def fp8_attn_v_descale_ignored(q, k, v, *, causal, scale, q_descale, k_descale, v_descale):
    """FP8 attention that never applies the value descale (the output off by that factor)."""
    return _fp8_attention(q, k, v, (q_descale, k_descale, v_descale), causal, scale, factors=(1.0, 1.0, 0.0))


MUTANTS = ("scale_off_1pct", "off_by_1e6", "scale_1_over_d", "causal_off_by_one", "causal_top_left", "padded_rows_nan",
           "padded_rows_mean", "padding_ignored", "bool_mask_as_bias", "gqa_tiled", "half_accumulator",
           "last_key_dropped")
SHAPE_ERRORS = ("wrong_layout", "wrong_signature")
FP8_MUTANTS = ("fp8_k_descale_2x", "fp8_v_descale_ignored")  # with --kv-dtype fp8; fp8_correct is their control
FP8_ATTENTION_MUTANTS = ("fp8_attn_q_descale_2x", "fp8_attn_v_descale_ignored", "fp8_attn_scale_off_1pct")  # --dtype fp8; fp8_attn_correct
