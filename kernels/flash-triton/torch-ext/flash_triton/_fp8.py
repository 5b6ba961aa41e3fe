"""FP8 prefill: `flash_attn_func` with e4m3 q, k, v and FlashAttention-3's descales; the Triton program, and the
entry point that picks between it and the warp-specialized Gluon program of `_gluon_fp8.py` (sm_90: the default
where it runs, `fp8_attention(program=...)`).

The inputs hold x / descale in float8_e4m3fn, one fp32 descale per (sequence, kv head) (`[B, Hkv]`, the query's
too, as FlashAttention-3 takes them) or one per tensor; the output is bf16 (or fp16). Both products run on the FP8
tensor cores: S = Q·Kᵀ with the query and key descales folded into the logit scale, and P·V with P quantized to e4m3
as FlashAttention-3 does (P is in [0, 1] after the running max is subtracted, so no scale is needed), fp32
accumulation, the value descale applied once at the end. The row sums l use P before quantization.

Triton's interpreter casts fp32 to FP8 wrongly (`_decode._quantize` says how), so on the CPU (`EXACT_P`) P is
rounded in fp32 first; on the GPU the hardware conversion rounds to nearest even by itself.

A FlashAttention-2 loop over 128 x 64 tiles with one warpgroup (4 warps) and three stages: of the tile configs
`benchmarks/kernel_fp8_prefill_bench.py --explore` timed on an H100 (docs/results/kernel-fp8-prefill), it and 128 x
128 with 8 warps were the fastest, 1.02-1.08x the bf16 kernel at 8k-16k, against 0.85-0.86x for 128 x 64 with 8
warps. The key slices every row sees whole run without masks, the diagonal ones with the causal mask on the scores;
only a sequence's last, partial slice bounds its loads. The second product's B operand is Vᵀ: on sm_90 an FP8 wgmma
takes only K-major operands, so V is read with the keys contiguous (`v_keys_contiguous`: a `[B, S, H, D]`-contiguous
v is transposed once per call; read as it is, every slice of V would go through registers into a transposed
shared-memory tile, unpipelined, as the first program did at 0.43x the bf16 kernel's speed on an H100).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ._checks import FP8_MAX, descale_problem, descale_strides, device_problem, keys_contiguous, tensor_problem
from ._config import INTERPRETED
from ._decode import _quantize

FP8_HEAD_DIMS = (64, 128)
OUT_DTYPES = (torch.bfloat16, torch.float16)
_LOG2E = math.log2(math.e)


@triton.jit
def _p_fp8(p, EXACT_P: tl.constexpr):
    """P (in [0, 1]) in e4m3 for the P·V product."""
    if EXACT_P:
        return _quantize(p, 1.0, tl.float8e4nv, 448.0, 3, -6)
    return p.to(tl.float8e4nv)


@triton.jit
def _fp8_step(acc, l_i, m_i, q, k_base, v_base, start, offs_m, offs_n, offs_d, stride_ks, stride_vs, stride_vd,
              scale, SQ, SK, MASKED: tl.constexpr, CAUSAL: tl.constexpr, EXACT_P: tl.constexpr,
              LOAD_MASK: tl.constexpr):
    """One BLOCK_N slice of keys. MASKED: the slice may hold keys past SK or past a row's causal diagonal (the
    unmasked loop takes only slices every row sees whole, with no bounds checks). LOAD_MASK: it may hold keys past
    SK, so its loads are bounded too (a mask along the keys, V's contiguous dim, keeps Triton from pipelining the Vᵀ
    load: only the last slice of a sequence pays that)."""
    n = start + offs_n
    if LOAD_MASK:
        k = tl.load(k_base + n.to(tl.int64)[:, None] * stride_ks + offs_d[None, :], mask=n[:, None] < SK, other=0.0)
        # V read as Vᵀ `[D, BLOCK_N]` with the keys contiguous: the K-major operand the sm_90 FP8 wgmma takes
        vt = tl.load(v_base + offs_d[:, None] * stride_vd + n.to(tl.int64)[None, :] * stride_vs,
                     mask=n[None, :] < SK, other=0.0)
    else:
        k = tl.load(k_base + n.to(tl.int64)[:, None] * stride_ks + offs_d[None, :])
        vt = tl.load(v_base + offs_d[:, None] * stride_vd + n.to(tl.int64)[None, :] * stride_vs)
    s = tl.dot(q, tl.trans(k)) * scale
    if MASKED:
        keep = n[None, :] < SK
        if CAUSAL:
            keep = keep & (n[None, :] <= offs_m[:, None] + SK - SQ)
        s = tl.where(keep, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with nothing visible yet: exp2 gives 0
    else:
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_use = m_new
    p = tl.math.exp2(s - m_use[:, None])
    alpha = tl.math.exp2(m_i - m_use)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = tl.dot(_p_fp8(p, EXACT_P), tl.trans(vt), acc * alpha[:, None])
    return acc, l_i, m_new


@triton.jit
def attention_fwd_fp8(Q, K, V, O, QD, KD, VD, qk_scale,
                      stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
                      stride_vb, stride_vs, stride_vh, stride_vd, stride_ob, stride_os, stride_oh,
                      stride_qdb, stride_qdh, stride_kdb, stride_kdh, stride_vdb, stride_vdh,
                      H, GROUPS, SQ, SK,
                      HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
                      EXACT_P: tl.constexpr):
    """grid = (cdiv(Sq, BLOCK_M), B * Hq). q/k e4m3 `[B, S, H, D]` (last dim contiguous), v e4m3 `[B, S, H, D]` read
    through its strides (the fast layout has the keys contiguous, stride_vs = 1), out `[B, Sq, Hq, D]`, descales fp32
    at D[b·stride_db + hk·stride_dh] (strides 0: one per tensor). Causal is bottom-right aligned."""
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    hk = h // GROUPS
    qd = tl.load(QD + b * stride_qdb + hk * stride_qdh)
    kd = tl.load(KD + b * stride_kdb + hk * stride_kdh)
    vd = tl.load(VD + b * stride_vdb + hk * stride_vdh)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(Q + b.to(tl.int64) * stride_qb + offs_m.to(tl.int64)[:, None] * stride_qs + h * stride_qh
                + offs_d[None, :], mask=offs_m[:, None] < SQ, other=0.0)
    scale = qk_scale * qd * kd  # log2(e) · softmax scale · both descales
    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    hi = SK
    full = SK // BLOCK_N * BLOCK_N  # key slices every row sees whole
    if CAUSAL:  # the last key any row of this tile sees; the slices below the tile's first row's diagonal
        hi = tl.maximum(tl.minimum(SK, (pid_m + 1) * BLOCK_M + SK - SQ), 0)
        full = tl.minimum(full, tl.maximum(pid_m * BLOCK_M + SK - SQ + 1, 0) // BLOCK_N * BLOCK_N)
    k_base = K + b.to(tl.int64) * stride_kb + hk * stride_kh
    v_base = V + b.to(tl.int64) * stride_vb + hk * stride_vh
    inside = tl.maximum(full, tl.minimum(hi, SK // BLOCK_N * BLOCK_N))  # diagonal slices within SK: loads unmasked
    for start in range(0, full, BLOCK_N):
        acc, l_i, m_i = _fp8_step(acc, l_i, m_i, q, k_base, v_base, start, offs_m, offs_n, offs_d, stride_ks,
                                  stride_vs, stride_vd, scale, SQ, SK, False, CAUSAL, EXACT_P, False)
    for start in range(full, inside, BLOCK_N):
        acc, l_i, m_i = _fp8_step(acc, l_i, m_i, q, k_base, v_base, start, offs_m, offs_n, offs_d, stride_ks,
                                  stride_vs, stride_vd, scale, SQ, SK, True, CAUSAL, EXACT_P, False)
    for start in range(inside, hi, BLOCK_N):
        acc, l_i, m_i = _fp8_step(acc, l_i, m_i, q, k_base, v_base, start, offs_m, offs_n, offs_d, stride_ks,
                                  stride_vs, stride_vd, scale, SQ, SK, True, CAUSAL, EXACT_P, True)
    out = acc * (vd / tl.where(l_i == 0.0, 1.0, l_i))[:, None]
    tl.store(O + b.to(tl.int64) * stride_ob + offs_m.to(tl.int64)[:, None] * stride_os + h * stride_oh
             + offs_d[None, :], out.to(O.dtype.element_ty), mask=offs_m[:, None] < SQ)


def fp8_problem(q, k, v, q_descale, k_descale, v_descale, out_dtype) -> str | None:
    """None when the FP8 prefill can take these tensors, else why not."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if name == "v" and keys_contiguous(t):
            t = t.transpose(1, 3)  # v with the keys contiguous (the layout the kernel reads) is taken as it is
        if problem := tensor_problem(name, t, 4, "[B, S, H, D]", fp8_ok=True):
            return problem
    if not q.dtype == k.dtype == v.dtype == torch.float8_e4m3fn:
        return (f"FP8 prefill takes q, k, v all float8_e4m3fn, got {q.dtype}, {k.dtype}, {v.dtype} (e5m2 and mixed "
                "formats are not built)")
    if k.shape != v.shape or q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3]:
        return f"q {tuple(q.shape)} and k/v {tuple(k.shape)}/{tuple(v.shape)} do not fit [B, S, H, D] together"
    d, hq, hkv = q.shape[3], q.shape[2], k.shape[2]
    if d not in FP8_HEAD_DIMS:
        return f"head dim {d}: the FP8 prefill is built for head dims {', '.join(map(str, FP8_HEAD_DIMS))}"
    if hkv == 0 or hq % hkv:
        return f"query heads ({hq}) must be a multiple of kv heads ({hkv}) for GQA"
    if len({t.device for t in (q, k, v)}) > 1:
        return f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}"
    for name, t in (("q_descale", q_descale), ("k_descale", k_descale), ("v_descale", v_descale)):
        if problem := descale_problem(name, t, q.dtype, q.shape[0], hkv, q.device):
            return problem
    if out_dtype not in OUT_DTYPES:
        return f"out_dtype must be bfloat16 or float16, got {out_dtype}"
    return device_problem(q)


@triton.jit
def _transpose_keys(V, VT, stride_vb, stride_vs, stride_vh, S, H, HEAD_DIM: tl.constexpr, BLOCK_S: tl.constexpr):
    """grid = (cdiv(S, BLOCK_S), B * H): v `[B, S, H, D]` (last dim contiguous) into vt `[B, H, D, S]` contiguous, a
    `[BLOCK_S, D]` tile at a time (read along D, written along S)."""
    s0 = tl.program_id(0) * BLOCK_S
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    offs_s = s0 + tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, HEAD_DIM)
    ok = offs_s < S
    tile = tl.load(V + b.to(tl.int64) * stride_vb + offs_s.to(tl.int64)[:, None] * stride_vs + h * stride_vh
                   + offs_d[None, :], mask=ok[:, None])
    tl.store(VT + bh.to(tl.int64) * HEAD_DIM * S + offs_d[:, None] * S + offs_s[None, :], tl.trans(tile),
             mask=ok[None, :])


def v_keys_contiguous(v: torch.Tensor) -> torch.Tensor:
    """v `[B, S, H, D]` with the keys contiguous (stride 1 along S): the layout the second product reads, Vᵀ as the
    sm_90 FP8 wgmma takes its B operand (K-major; a 16-bit one may be either). A v with a contiguous head dim is
    transposed once per call by `_transpose_keys` (one read and one write of an FP8 v; torch's permuted `.contiguous()`
    took 280 µs for 32 MiB on an H100, ~12x a copy's time); a caller that keeps v so
    (`v.transpose(1, 3).contiguous().transpose(1, 3)`) skips it. FlashAttention-3 transposes V in shared memory."""
    b, s, h, d = v.shape
    if keys_contiguous(v) or s <= 1 or v.numel() == 0:
        return v
    vt = torch.empty((b, h, d, s), dtype=v.dtype, device=v.device)
    _transpose_keys[(triton.cdiv(s, 64), b * h)](v, vt, v.stride(0), v.stride(1), v.stride(2), s, h, HEAD_DIM=d,
                                               BLOCK_S=64, num_warps=4)
    return vt.permute(0, 3, 1, 2)


def _gluon_problem(q, k, v, causal) -> str | None:
    """Why the Gluon FP8 program (`_gluon_fp8.py`, sm_90) cannot take these (checked) inputs, None when it can;
    imported here, on first use, so that a Triton without Gluon still loads this package."""
    try:
        from ._gluon_fp8 import gluon_fp8_supported
    except ImportError as e:
        return f"the Gluon FP8 program cannot be loaded with Triton {triton.__version__} ({e})"
    return gluon_fp8_supported(q, k, v, bool(causal))


# The Gluon FP8 program's default: one score exponential in 4 on the FMA pipes. In FP8 the tensor cores take half
# bf16's time per key block and the exponentials (MUFU) the same, so they bound the loop; on an H100 (TUNING.md step
# 29, docs/results/kernel-fp8-prefill/fp8-prefill-exp-poly.log) causal head dim 128 went 1.08 / 1.01 / 1.08x -> 1.14 /
# 1.13 / 1.29x the bf16 kernel at 4k / 8k / 16k (one in 2: 1.07 / 1.07 / 1.18x), within the same oracle bound
FP8_EXP_POLY = 4


def fp8_attention(q, k, v, softmax_scale=None, causal=False, q_descale=None, k_descale=None, v_descale=None,
                  out_dtype=torch.bfloat16, *, block_m: int = 128, block_n: int = 64, num_warps: int = 4,
                  num_stages: int = 3, program: str = "auto", exp_poly: int | None = None, pingpong: bool = False,
                  v_wait_early: bool = False):
    """Attention of e4m3 q `[B, Sq, Hq, D]` over e4m3 k/v `[B, Sk, Hkv, D]` with descales; `[B, Sq, Hq, D]` in
    `out_dtype`. ValueError with the reason for anything it does not take. `program`: "triton" (this module's
    program, the tile arguments apply), "gluon" (the warp-specialized sm_90 program of `_gluon_fp8.py`, FlashAttention-3
    style; ValueError with the reason where it cannot run) or "auto" (that one where it can run, else the Triton
    program; the default: on an H100 the Gluon program passed its CUDA oracle tests and ran 1.13-1.29x the bf16 kernel
    at 4k-16k causal head dim 128 with `FP8_EXP_POLY`, where this one ran 1.00-1.03x, docs/results/kernel-fp8-prefill). The tile
    arguments apply to the Triton program only. `exp_poly` (0, 2, 4: one score exponential in that many on the FMA
    pipes) applies to the Gluon program only; None (the default) is `FP8_EXP_POLY` there and nothing on the Triton
    program; 2 or 4 given is refused where the Gluon program does not run (0, off, means nothing there).
    `pingpong`: the Gluon program's two consumers issue their matmuls in turns (`Config.pingpong`'s schedule);
    `v_wait_early`: the Gluon program waits for each key block's values at the end of its softmax
    (`Config.v_wait_early`'s schedule); each refused where that program does not run."""
    if program not in ("triton", "gluon", "auto"):
        raise ValueError(f"flash-triton flash_attn_func (FP8): program must be 'triton', 'gluon' or 'auto', got "
                         f"{program!r}")
    if exp_poly not in (None, 0, 2, 4):
        raise ValueError(f"flash-triton flash_attn_func (FP8): exp_poly is 0, 2 or 4, got {exp_poly}")
    if problem := fp8_problem(q, k, v, q_descale, k_descale, v_descale, out_dtype):
        raise ValueError(f"flash-triton flash_attn_func (FP8): {problem}")
    why = "program='triton' was asked for" if program == "triton" else _gluon_problem(q, k, v, causal)
    gluon = why is None
    if exp_poly and not gluon:
        raise ValueError(f"flash-triton flash_attn_func (FP8): exp_poly is an option of the Gluon FP8 program, which "
                         f"does not run here: {why}")
    for name, on in (("pingpong", pingpong), ("v_wait_early", v_wait_early)):
        if on and not gluon:
            raise ValueError(f"flash-triton flash_attn_func (FP8): {name} is an option of the Gluon FP8 program, "
                             f"which does not run here: {why}")
    if program == "gluon" and not gluon:
        raise ValueError(f"flash-triton flash_attn_func (FP8): {why}")
    b, sq, hq, d = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    out = torch.empty((b, sq, hq, d), dtype=out_dtype, device=q.device)
    if b * sq * hq == 0:
        return out
    if sk == 0:
        return out.zero_()
    scale = d ** -0.5 if softmax_scale is None else float(softmax_scale)
    if gluon:  # it transposes v itself (`_gluon_fp8.permuted_vt`)
        from ._gluon_fp8 import gluon_fp8_attention

        gluon_fp8_attention(q, k, v, out, q_descale, k_descale, v_descale, scale, bool(causal),
                            exp_poly=FP8_EXP_POLY if exp_poly is None else exp_poly, pingpong=bool(pingpong),
                            v_wait_early=bool(v_wait_early))
        return out
    descales = (q_descale, k_descale, v_descale)
    one = torch.ones(1, dtype=torch.float32, device=q.device) if any(t is None for t in descales) else None
    grid = (triton.cdiv(sq, block_m), b * hq)
    vt = v_keys_contiguous(v)
    attention_fwd_fp8[grid](q, k, vt, out, *(one if t is None else t for t in descales),
                            scale * _LOG2E, *q.stride()[:3], *k.stride()[:3], *vt.stride(),
                            *out.stride()[:3],
                            *(s for t in descales for s in descale_strides(t)),
                            hq, hq // hkv, sq, sk, HEAD_DIM=d, BLOCK_M=block_m, BLOCK_N=block_n, CAUSAL=bool(causal),
                            EXACT_P=INTERPRETED, num_warps=num_warps, num_stages=num_stages)
    return out


__all__ = ["FP8_HEAD_DIMS", "FP8_MAX", "fp8_attention", "fp8_problem", "v_keys_contiguous"]
