"""The Triton program: a FlashAttention-2-style forward over `[B, S, H, D]` tensors.

One program computes a `[BLOCK_M, D]` tile of the output for one (batch, query head): the Q tile stays in
registers while K/V tiles stream past it, with an online softmax (running max `m_i`, running sum `l_i`) so the
`[Sq, Sk]` score matrix never exists in memory.

The key range of a Q tile is split in two loops, as in the Triton tutorial:
  1. blocks every row of the tile sees entirely (no mask, no bounds check: the fast path);
  2. the blocks across the causal diagonal and the ragged end of Sk (mask applied).
Causal is bottom-right aligned: query i sees key j when j <= i + (Sk - Sq). A row that sees no key (Sq > Sk)
keeps m_i = -inf and l_i = 0 and is written as zeros. The softmax runs in base 2 with log2(e) folded into the
scale (one FMA + exp2 per score). Causal programs are launched heaviest-first (the tiles at the bottom of the
triangle) so the short tiles fill the tail of the grid.

`POLY_EXP` computes half of the unmasked loop's exponentials with a polynomial on the FMA pipes (`_exp2_poly`).
`OVERLAP` runs the unmasked loop software-pipelined by hand (`_attend_overlap`); `WARP_SPECIALIZE` asks Triton to split each key loop into producer (loads) and consumer (matmul/softmax) warps
(`tl.range(..., warp_specialize=True)`); whether that pays on Hopper with Triton 3.6 is measured in TUNING.md.

`VARLEN` is the same program over packed sequences (`flash_attn_varlen_func`): tensors `[total, H, D]`, sequence b
is rows `cu_seqlens[b] : cu_seqlens[b+1]` (queries and keys each have their own), the grid's first axis covers the
longest query sequence and a tile past its own sequence's end does no work. Everything else (causal diagonal
bottom-right per sequence, the masked tail, rows that see no key) is the dense program's, with per-sequence lengths.

Loads use TMA descriptors over the 2-D view `[B*S, H*D]` (varlen: `[total, H*D]`; `HEADS_IN_ROWS`: `[B*H*S, D]`, for
`[B, S, H, D]` views of `[B, H, S, D]` tensors) when `USE_TMA` (Hopper+), plain pointers (any strides) otherwise.
A TMA tile that runs past the end of one sequence reads the next sequence's (or head's) first rows: those keys are masked to
-inf (probability exactly 0), those values are zeroed (0 · inf would be NaN) and those queries are never stored,
so nothing of the next batch reaches this one, finite or not. The output is always stored with a row mask.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _cols_mask(rows_ok, offs_d, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr):
    """`rows_ok` as a tile mask; with a padded head dim (BLOCK_D > D: 80, 96) also the D valid columns. Decided at
    compile time, so head dims 64/128/256 keep their unmasked columns (and their vectorized loads)."""
    if BLOCK_D == HEAD_DIM:
        return rows_ok[:, None]
    else:
        return rows_ok[:, None] & (offs_d < HEAD_DIM)[None, :]


@triton.jit
def _load_kv(desc, base, row0, col, start_n, stride_s, limit,
             BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, BOUNDED: tl.constexpr, USE_TMA: tl.constexpr,
             BLOCK_D: tl.constexpr):
    """A `[BLOCK_N, BLOCK_D]` tile of K or V starting at key `start_n` (columns past D read as 0)."""
    if USE_TMA:
        tile = desc.load([row0 + start_n, col])
    else:
        offs_n = start_n + tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, BLOCK_D)
        ptrs = base + offs_n[:, None] * stride_s + offs_d[None, :]
        if BOUNDED:
            tile = tl.load(ptrs, mask=_cols_mask(offs_n < limit, offs_d, HEAD_DIM, BLOCK_D), other=0.0)
        elif BLOCK_D == HEAD_DIM:
            tile = tl.load(ptrs)
        else:
            tile = tl.load(ptrs, mask=(offs_d < HEAD_DIM)[None, :], other=0.0)
    return tile


@triton.jit
def _tanh(x):
    """tanh from exp2 (no libdevice call, so the interpreter runs it too): sign(x) (1 - e^-2|x|) / (1 + e^-2|x|).
    With `tanh.approx.f32` (one SFU op, as the Gluon program uses) the compiled decode program at batch 1 runs 1.9x
    slower on the GPU (`docs/results/kernel-features/`), so both Triton programs keep this form."""
    e = tl.math.exp2(tl.abs(x) * -2.8853900817779268)  # e^(-2|x|) = 2^(-2 log2(e) |x|)
    t = (1.0 - e) / (1.0 + e)
    return tl.where(x < 0, -t, t)


@triton.jit
def _scores(qk, qk_scale, softcap_in, softcap_out, SOFTCAP: tl.constexpr):
    """Raw q·kᵀ to base-2 logits: scale (log2(e) folded in) or, with `SOFTCAP`, cap·tanh(scale·qk / cap) (flash-attn's
    and Gemma 2's soft-capping: softcap_in = scale / cap, softcap_out = cap·log2(e))."""
    if SOFTCAP:
        return _tanh(qk * softcap_in) * softcap_out
    else:
        return qk * qk_scale


@triton.jit
def _exp2_poly(x):
    """2^x on the FMA/ALU pipes instead of the special-function unit (FlashAttention-4's trick): 2^floor(x) built
    in the exponent bits, 2^frac(x) from a degree-3 minimax polynomial (relative error ~1e-4, below bf16's 4e-3).
    For x <= 0 (scores minus the running max); x < -126 is clamped to give ~0 instead of a wrapped exponent."""
    x = tl.maximum(x, -126.0)
    xi = tl.floor(x)
    f = x - xi
    p = 1.0 + f * (0.695146143436431884765625 + f * (0.227564394474029541015625 + f * 0.077119089663028717041015625))
    bits = p.to(tl.int32, bitcast=True) + (xi.to(tl.int32) << 23)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _exp2_split(x, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, POLY_EXP: tl.constexpr):
    """exp2 of a score tile; with POLY_EXP, every other column goes to `_exp2_poly` so the special-function unit
    and the FMA pipes share the softmax's exponentials."""
    if POLY_EXP:
        xa, xb = tl.split(tl.reshape(x, [BLOCK_M, BLOCK_N // 2, 2]))
        return tl.reshape(tl.join(tl.math.exp2(xa), _exp2_poly(xb)), [BLOCK_M, BLOCK_N])
    else:
        return tl.math.exp2(x)


@triton.jit
def _attend(acc, l_i, m_i, q, desc_k, desc_v, k_base, v_base, kv_row0, kv_col, stride_ks, stride_vs,
            lo, hi, offs_m, diag, SK, qk_scale,
            BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
            USE_TMA: tl.constexpr, WARP_SPECIALIZE: tl.constexpr, BLOCK_M: tl.constexpr, POLY_EXP: tl.constexpr,
            BOUNDED: tl.constexpr = False, LAZY_RESCALE: tl.constexpr = False, BLOCK_D: tl.constexpr = 128,
            softcap_in=1.0, softcap_out=1.0, win_left=0, win_right=0,
            SOFTCAP: tl.constexpr = False, WINDOW: tl.constexpr = False):
    """Fold the key blocks [lo, hi) into (acc, l_i, m_i). `MASKED` applies the causal mask, `BOUNDED` (masked
    blocks only) also the end of Sk: only the one block that crosses Sk needs it. `WINDOW` (masked blocks only) keeps
    key j for row i when i + diag - win_left <= j <= i + diag + win_right; `SOFTCAP` caps the logits (`_scores`), on
    the masked and the unmasked blocks (these then fold base-2 logits: scale 1)."""
    offs_n = tl.arange(0, BLOCK_N)
    if SOFTCAP:
        unmasked_scale = 1.0
    else:
        unmasked_scale = qk_scale
    for start_n in tl.range(lo, hi, BLOCK_N, warp_specialize=WARP_SPECIALIZE):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        k = _load_kv(desc_k, k_base, kv_row0, kv_col, start_n, stride_ks, SK, BLOCK_N, HEAD_DIM, BOUNDED, USE_TMA, BLOCK_D)
        qk = tl.dot(q, tl.trans(k))  # (BLOCK_M, BLOCK_N) fp32
        if SOFTCAP and not MASKED:
            qk = _scores(qk, qk_scale, softcap_in, softcap_out, SOFTCAP)
        if MASKED:
            cols = start_n + offs_n
            if BOUNDED:
                keep = cols[None, :] < SK
                if CAUSAL:
                    keep = keep & (cols[None, :] <= offs_m[:, None] + diag)
            else:
                keep = cols[None, :] <= offs_m[:, None] + diag
            if WINDOW:
                keep = keep & (cols[None, :] >= offs_m[:, None] + diag - win_left)
                keep = keep & (cols[None, :] <= offs_m[:, None] + diag + win_right)
            qk = tl.where(keep, _scores(qk, qk_scale, softcap_in, softcap_out, SOFTCAP), float("-inf"))
            m_new = tl.maximum(m_i, tl.max(qk, 1))
            # A row with nothing visible yet keeps m = -inf; subtract 0 instead so exp2 gives 0, not NaN.
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
            p = tl.math.exp2(qk - m_use[:, None])
            alpha = tl.math.exp2(m_i - m_use)
        elif LAZY_RESCALE:
            # FlashAttention-4's conditional rescale: keep a stale running max until some row's max grew by more
            # than 8 (p <= 2^8 then, harmless in fp32 sums and bf16 probabilities), and skip `acc *= alpha`, the
            # largest FMA-pipe item of the loop, on the blocks that don't move it. One block-wide max per block.
            m_blk = tl.max(qk, 1) * unmasked_scale
            if tl.max(m_blk - m_i, 0) > 8.0:
                m_new = tl.maximum(m_i, m_blk)
                alpha = tl.math.exp2(m_i - m_new)
                acc = acc * alpha[:, None]
                l_i = l_i * alpha
                m_i = m_new
            p = _exp2_split(qk * unmasked_scale - m_i[:, None], BLOCK_M, BLOCK_N, POLY_EXP)
            m_new = m_i
        else:
            m_new = tl.maximum(m_i, tl.max(qk, 1) * unmasked_scale)
            p = _exp2_split(qk * unmasked_scale - m_new[:, None], BLOCK_M, BLOCK_N, POLY_EXP)
            alpha = tl.math.exp2(m_i - m_new)
        if MASKED or not LAZY_RESCALE:
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None]
        else:  # lazy: the state was rescaled above, only when the running max moved
            l_i = l_i + tl.sum(p, 1)
        v = _load_kv(desc_v, v_base, kv_row0, kv_col, start_n, stride_vs, SK, BLOCK_N, HEAD_DIM, BOUNDED, USE_TMA, BLOCK_D)
        if BOUNDED:
            if USE_TMA:  # rows past Sk are the next batch's: p is 0 there, but 0 * inf is NaN, so zero them
                v = tl.where((start_n + offs_n)[:, None] < SK, v, 0.0)
        acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _fold_unmasked(acc, l_i, m_i, qk, v, qk_scale):
    """One unmasked online-softmax step: fold the scores `qk` of a key block and its values `v` into the state."""
    m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
    p = tl.math.exp2(qk * qk_scale - m_new[:, None])
    alpha = tl.math.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
    return acc, l_i, m_new


@triton.jit
def _attend_overlap(acc, l_i, m_i, q, desc_k, desc_v, k_base, v_base, kv_row0, kv_col, stride_ks, stride_vs,
                    lo, hi, SK, qk_scale,
                    BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, USE_TMA: tl.constexpr, BLOCK_D: tl.constexpr):
    """The unmasked loop of `_attend`, software-pipelined by hand (FlashAttention-3's intra-warpgroup overlap):
    the scores of block j+1 are issued before the softmax of block j, so the tensor cores can work on the next
    QKᵀ while the same warps run exp2 on this block. Needs hi > lo (at least one block)."""
    k = _load_kv(desc_k, k_base, kv_row0, kv_col, lo, stride_ks, SK, BLOCK_N, HEAD_DIM, False, USE_TMA, BLOCK_D)
    qk = tl.dot(q, tl.trans(k))
    for start_n in tl.range(lo, hi - BLOCK_N, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        k_next = _load_kv(desc_k, k_base, kv_row0, kv_col, start_n + BLOCK_N, stride_ks, SK, BLOCK_N, HEAD_DIM,
                          False, USE_TMA, BLOCK_D)
        qk_next = tl.dot(q, tl.trans(k_next))
        v = _load_kv(desc_v, v_base, kv_row0, kv_col, start_n, stride_vs, SK, BLOCK_N, HEAD_DIM, False, USE_TMA, BLOCK_D)
        acc, l_i, m_i = _fold_unmasked(acc, l_i, m_i, qk, v, qk_scale)
        qk = qk_next
    v = _load_kv(desc_v, v_base, kv_row0, kv_col, hi - BLOCK_N, stride_vs, SK, BLOCK_N, HEAD_DIM, False, USE_TMA, BLOCK_D)
    return _fold_unmasked(acc, l_i, m_i, qk, v, qk_scale)


@triton.jit
def attention_fwd(Q, K, V, O, desc_q, desc_k, desc_v, qk_scale,
                  stride_qb, stride_qs, stride_qh,
                  stride_kb, stride_ks, stride_kh,
                  stride_vb, stride_vs, stride_vh,
                  stride_ob, stride_os, stride_oh,
                  H, GROUPS, SQ, SK, CuSeqQ, CuSeqK, Sinks, softcap_in, softcap_out, win_left, win_right,
                  HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  CAUSAL: tl.constexpr, USE_TMA: tl.constexpr, WARP_SPECIALIZE: tl.constexpr = False,
                  OVERLAP: tl.constexpr = False, POLY_EXP: tl.constexpr = False,
                  LAZY_RESCALE: tl.constexpr = False, VARLEN: tl.constexpr = False,
                  HEADS_IN_ROWS: tl.constexpr = False, BLOCK_D: tl.constexpr = 128,
                  SOFTCAP: tl.constexpr = False, WINDOW: tl.constexpr = False, SINKS: tl.constexpr = False):
    """grid = (cdiv(Sq, BLOCK_M), B * H). Tensors `[B, S, H, D]`, last dim contiguous. With `VARLEN`: tensors
    `[total, H, D]` (the batch strides unused), `CuSeqQ`/`CuSeqK` the `[B + 1]` cumulative lengths, SQ the longest
    query sequence (the grid), SK unused. With `HEADS_IN_ROWS` (dense only) the TMA descriptors are `[B*H*S, D]`
    views of `[B, H, S, D]` tensors (handed over as `[B, S, H, D]` views): a head's rows are consecutive there.

    Model features, flash-attn's semantics (`_features.py` turns the entry points' arguments into these): `SOFTCAP`
    caps the logits, `WINDOW` keeps keys [i + diag - win_left, i + diag + win_right] of row i (the host passes a
    bound past every key for an unbounded side), `SINKS` adds exp(Sinks[h]) to each row's softmax denominator
    (gpt-oss's per-head sink logit, fp32 `[H]`). With a window the key blocks of a tile run through one masked loop
    over the blocks the window and the diagonal leave; without one (plain, soft-capped, sinks) through the plain
    path's loops (the unmasked fast loop caps too)."""
    if CAUSAL:
        start_m = tl.num_programs(0) - 1 - tl.program_id(0)  # heaviest tiles first
    else:
        start_m = tl.program_id(0)
    off_bh = tl.program_id(1)
    b = off_bh // H
    h = off_bh % H
    hk = h // GROUPS  # GQA: query head h reads kv head h // (Hq / Hkv)
    m0 = start_m * BLOCK_M
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)  # the head dim padded to a power of two (80, 96 -> 128); = D otherwise

    if VARLEN:  # this sequence's rows of the packed tensors, and its own lengths
        q_row0 = tl.load(CuSeqQ + b)
        sq = tl.load(CuSeqQ + b + 1) - q_row0
        kv_row0 = tl.load(CuSeqK + b)
        sk = tl.load(CuSeqK + b + 1) - kv_row0
        q_base = Q + q_row0.to(tl.int64) * stride_qs + h.to(tl.int64) * stride_qh
        o_base = O + q_row0.to(tl.int64) * stride_os + h.to(tl.int64) * stride_oh
        k_base = K + kv_row0.to(tl.int64) * stride_ks + hk.to(tl.int64) * stride_kh
        v_base = V + kv_row0.to(tl.int64) * stride_vs + hk.to(tl.int64) * stride_vh
    else:
        sq = SQ
        sk = SK
        q_row0 = b * SQ
        kv_row0 = b * SK
        q_base = Q + b.to(tl.int64) * stride_qb + h.to(tl.int64) * stride_qh
        o_base = O + b.to(tl.int64) * stride_ob + h.to(tl.int64) * stride_oh
        k_base = K + b.to(tl.int64) * stride_kb + hk.to(tl.int64) * stride_kh
        v_base = V + b.to(tl.int64) * stride_vb + hk.to(tl.int64) * stride_vh
    kv_col = hk * HEAD_DIM
    q_col = h * HEAD_DIM
    if HEADS_IN_ROWS:  # the TMA rows of this (batch, head); a tile past Sk reads the next head's rows (masked below)
        q_row0 = (b * H + h) * SQ
        kv_row0 = (b * (H // GROUPS) + hk) * SK
        q_col = 0
        kv_col = 0
    if USE_TMA:
        q = desc_q.load([q_row0 + m0, q_col])
    else:
        q_ptrs = q_base + offs_m[:, None] * stride_qs + offs_d[None, :]
        q = tl.load(q_ptrs, mask=_cols_mask(offs_m < sq, offs_d, HEAD_DIM, BLOCK_D), other=0.0)

    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    diag = sk - sq  # bottom-right alignment: row i sees keys j <= i + diag
    if CAUSAL:
        # keys [0, full) are visible to every row of this tile; [full, end) cross the diagonal
        full = tl.minimum(tl.maximum(m0 + diag + 1, 0), sk) // BLOCK_N * BLOCK_N
        end = tl.minimum(tl.maximum(m0 + BLOCK_M + diag, 0), sk)
    else:
        full = sk // BLOCK_N * BLOCK_N
        end = sk
    if VARLEN:  # a tile past the end of its (shorter) sequence: no key block, nothing stored
        full = tl.where(m0 < sq, full, 0)
        end = tl.where(m0 < sq, end, 0)
    if WINDOW:
        # every block this tile's rows may see, all masked: [row 0's window start, the last row's last key]
        lo = tl.maximum(m0 + diag - win_left, 0) // BLOCK_N * BLOCK_N
        hi = tl.minimum(tl.maximum(m0 + BLOCK_M + diag + win_right, 0), end)  # end: Sk, or the causal limit
        acc, l_i, m_i = _attend(acc, l_i, m_i, q, desc_k, desc_v, k_base, v_base, kv_row0, kv_col,
                                stride_ks, stride_vs, lo, tl.maximum(hi, lo), offs_m, diag, sk, qk_scale,
                                BLOCK_N, HEAD_DIM, True, CAUSAL, USE_TMA, WARP_SPECIALIZE, BLOCK_M, False, True,
                                False, BLOCK_D, softcap_in, softcap_out, win_left, win_right, SOFTCAP, WINDOW)
    else:  # plain or soft-capped: the unmasked fast loop, then the masked blocks (`_attend` caps in both)
        if OVERLAP and not SOFTCAP:
            if full > 0:
                acc, l_i, m_i = _attend_overlap(acc, l_i, m_i, q, desc_k, desc_v, k_base, v_base, kv_row0, kv_col,
                                                stride_ks, stride_vs, 0, full, sk, qk_scale, BLOCK_N, HEAD_DIM, USE_TMA, BLOCK_D)
        else:
            acc, l_i, m_i = _attend(acc, l_i, m_i, q, desc_k, desc_v, k_base, v_base, kv_row0, kv_col,
                                    stride_ks, stride_vs, 0, full, offs_m, diag, sk, qk_scale,
                                    BLOCK_N, HEAD_DIM, False, CAUSAL, USE_TMA, WARP_SPECIALIZE, BLOCK_M, POLY_EXP,
                                    False, LAZY_RESCALE, BLOCK_D, softcap_in, softcap_out, 0, 0, SOFTCAP)
        # the masked blocks: the causal diagonal inside Sk, then the one block that crosses Sk (if Sk is ragged)
        ragged = sk // BLOCK_N * BLOCK_N  # >= full
        if CAUSAL:
            acc, l_i, m_i = _attend(acc, l_i, m_i, q, desc_k, desc_v, k_base, v_base, kv_row0, kv_col,
                                    stride_ks, stride_vs, full, tl.minimum(end, ragged), offs_m, diag, sk, qk_scale,
                                    BLOCK_N, HEAD_DIM, True, CAUSAL, USE_TMA, WARP_SPECIALIZE, BLOCK_M, False, False,
                                    False, BLOCK_D, softcap_in, softcap_out, 0, 0, SOFTCAP)
        acc, l_i, m_i = _attend(acc, l_i, m_i, q, desc_k, desc_v, k_base, v_base, kv_row0, kv_col,
                                stride_ks, stride_vs, ragged, end, offs_m, diag, sk, qk_scale,
                                BLOCK_N, HEAD_DIM, True, CAUSAL, USE_TMA, WARP_SPECIALIZE, BLOCK_M, False, True, False,
                                BLOCK_D, softcap_in, softcap_out, 0, 0, SOFTCAP)

    if SINKS:  # the sink's logit joins each row's softmax denominator (a row that saw no key: exactly 0 out)
        sink = tl.load(Sinks + h).to(tl.float32) * 1.4426950408889634
        m_new = tl.maximum(m_i, sink)
        alpha = tl.math.exp2(m_i - m_new)
        acc = acc * alpha[:, None]
        l_i = l_i * alpha + tl.math.exp2(sink - m_new)
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)  # rows that saw no key: acc is 0, output 0
    out = acc / l_safe[:, None]
    o_ptrs = o_base + offs_m[:, None] * stride_os + offs_d[None, :]
    tl.store(o_ptrs, out.to(O.dtype.element_ty), mask=_cols_mask(offs_m < sq, offs_d, HEAD_DIM, BLOCK_D))
