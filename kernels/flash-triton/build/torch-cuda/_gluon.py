"""The Hopper path: the same attention forward written in Gluon (Triton's explicit dialect), FlashAttention-3 style.

Why a second program: in the Triton kernel (`_kernel.py`) the compiler waits on each wgmma right where its result
is used, so within one warpgroup the softmax of a key block never overlaps a matmul (TUNING.md, step 3 read the
SASS: `WARPGROUP.DEPBAR.LE gsb0, 0x0` straight after every QKᵀ). Here the schedule is written out by hand:

    S_j  = Q Kⱼᵀ              issued async
    O   += P_{j-1} V_{j-1}    issued async, behind S_j
    wait until only one wgmma is in flight      -> S_j is ready, P_{j-1} V_{j-1} may still run
    softmax(S_j) -> P_j, alpha_j                 runs on the FMA/SFU pipes while the tensor cores do P V
    wait for P_{j-1} V_{j-1}; O *= alpha_j; refill that K/V stage by TMA

(FlashAttention-3's intra-warpgroup overlap; the softmax of block j overlaps the second matmul of block j-1).
K/V stream through a ring of `STAGES` shared-memory buffers filled by TMA, one mbarrier per buffer and operand.

Scope, checked by the caller (`gluon_supported`): sm_90, fp16/bf16, head dim 64/128, Sq a multiple of BLOCK_M,
Sk a multiple of BLOCK_N, and for causal Sq <= Sk (every row then sees key 0, so no row is empty and no tile
crosses into the next batch of the `[B*S, H*D]` TMA view). Everything else takes the Triton kernel.
"""

from __future__ import annotations

import functools

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

# Triton 3.6 (the H200's) names the TMA copies async_copy_*; later releases renamed them async_load / async_store.
_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
_tma_store = getattr(tma, "async_store", None) or tma.async_copy_shared_to_global
_cta_barrier = getattr(gl, "barrier", None) or gl.thread_barrier  # bar.sync of the whole CTA (renamed likewise)


@functools.lru_cache(maxsize=None)
def _smem_layout(block: int, d: int, bf16: bool):
    """The shared-memory layout of a `[block, d]` TMA tile (computed once per shape: it is on every launch's host path)."""
    return gl.NVMMASharedLayout.get_default_for([block, d], gl.bfloat16 if bf16 else gl.float16)


def tma_desc(t: torch.Tensor, block: int, heads_in_rows: bool):
    """A Gluon TMA descriptor of a `[B, S, H, D]` tensor as the 2-D view `[B*S, H*D]` or, for a view of a contiguous
    `[B, H, S, D]` tensor, `[B*H*S, D]`; tiles `[block, D]`. Packed `[total, H, D]` tensors pass as `[1, total, H, D]`.
    A head dim that is not a power of two (80, 96) gets tiles 128 wide over the `[B*H*S, D]` view: the columns past
    D lie outside the tensor, so TMA loads them as zeros (the programs then compute on a zero-padded 128-wide head)
    and a TMA store drops them. In `[B*S, H*D]` they would be the next head's columns: refused."""
    d = t.shape[-1]
    box = 1 << (d - 1).bit_length()  # `_config.block_d`: this module is also compiled standalone, by path
    layout = _smem_layout(block, box, t.dtype == torch.bfloat16)
    if heads_in_rows:
        return TensorDescriptor(t, [t.shape[0] * t.shape[2] * t.shape[1], d], [d, 1], [block, box], layout)
    if box != d:
        raise ValueError(f"a head dim of {d} is padded to {box} only in the [B*H*S, D] view (here the padding "
                         "columns would be the next head's)")
    rows, heads = t.shape[0] * t.shape[1], t.shape[2]
    return TensorDescriptor(t, [rows, heads * d], [heads * d, 1], [block, d], layout)


@gluon.jit
def _scores(s, j, full, offs_m, offs_n, diag, CAUSAL: gl.constexpr, BLOCK_N: gl.constexpr,
            WINDOW: gl.constexpr = False, m0=0, win_left=0, win_right=0, ROWS: gl.constexpr = 64):
    """Key block j's raw scores with the causal mask applied when the block crosses the diagonal and, with `WINDOW`,
    a sliding window's edges where the block crosses one for the `ROWS` rows from m0 (`_window_scores`)."""
    if CAUSAL:
        if j * BLOCK_N >= full:
            cols = j * BLOCK_N + offs_n
            s = gl.where(cols[None, :] <= offs_m[:, None] + diag, s, float("-inf"))
    if WINDOW:
        lo = j * BLOCK_N
        s = _window_scores(s, lo, lo, m0, offs_m, offs_n, diag, win_left, win_right, ROWS, BLOCK_N)
    return s


@gluon.jit
def _p_operand(p, dtype: gl.constexpr, p_layout: gl.constexpr, ALU_PACK: gl.constexpr = False):
    """P as the P·V wgmma's register operand. `ALU_PACK` (bf16 only, `Config.p_pack_alu`, the varlen program: TUNING.md
    step 21): each pair of fp32 probabilities rounded to bf16 on the integer pipe (add 0x8000 to the bits, keep the high
    halves with one PRMT: round half away from zero; p is never negative, inf and NaN stay inf and NaN) instead of one
    F2FP."""
    if ALU_PACK:
        q = gl.inline_asm_elementwise(
            "{ .reg .b32 a, b; add.u32 a, $1, 32768; add.u32 b, $2, 32768; prmt.b32 $0, a, b, 0x7632; }",
            "=r,r,r", [p.to(gl.int32, bitcast=True)], dtype=gl.bfloat16, is_pure=True, pack=2)
    else:
        q = p.to(dtype)
    return gl.convert_layout(q, p_layout)


def _exp2_poly_asm(pack: int) -> str:
    """PTX for `pack` exponentials 2^x: the first pack - 1 on the special-function unit (`ex2.approx`), the last on
    the FMA/ALU pipes (FlashAttention-4's trick, 8 SASS instructions, no conversion unit): j = round(x) by the
    1.5·2^23 shift, 2^(x - j) from a degree-3 minimax polynomial on [-1/2, 1/2] (relative error 1.0e-4, bf16's
    rounding is 3.9e-3), then j added to the exponent bits. x is clamped at -127 (-inf, a masked score, gives
    exactly 0; NaN stays NaN); from -126 up the result is a normal float, and `CAP_BOUND`'s exponents lie in
    [-116, 44]."""
    body = [f"ex2.approx.ftz.f32 ${i}, ${pack + i};" for i in range(pack - 1)]
    body += [f"max.NaN.f32 px, ${2 * pack - 1}, 0fC2FE0000;",  # -127
             "add.rn.f32 pr, px, 0f4B400000;", "sub.rn.f32 pj, pr, 0f4B400000;",  # pr's low bits: j = round(x)
             "sub.rn.f32 pf, px, pj;",
             "fma.rn.f32 pp, pf, 0f3D6150AE, 0f3E7805FF;", "fma.rn.f32 pp, pp, pf, 0f3F317AFD;",
             "fma.rn.f32 pp, pp, pf, 0f3F800000;",
             "mov.b32 pb, pr;", "mov.b32 pq, pp;", "shl.b32 pb, pb, 23;", "add.s32 pq, pq, pb;",
             f"mov.b32 ${pack - 1}, pq;"]
    return "\n".join(["{", ".reg .f32 px, pr, pj, pf, pp;", ".reg .b32 pb, pq;", *body, "}"])


_EXP2_POLY_2 = gl.constexpr(_exp2_poly_asm(2))
_EXP2_POLY_4 = gl.constexpr(_exp2_poly_asm(4))


@gluon.jit
def _exp2(x, POLY: gl.constexpr = 0):
    """2^x, every one on the special-function unit, or with POLY = N (2, 4) one in N as a polynomial on the FMA pipes
    (`_exp2_poly_asm`)."""
    if POLY == 2:
        return gl.inline_asm_elementwise(_EXP2_POLY_2, "=f,=f,f,f", [x], dtype=gl.float32, is_pure=True, pack=2)
    elif POLY == 4:
        return gl.inline_asm_elementwise(_EXP2_POLY_4, "=f,=f,=f,=f,f,f,f,f", [x], dtype=gl.float32, is_pure=True,
                                         pack=4)
    else:
        return gl.exp2(x)


@gluon.jit
def _softmax_first(s, qk_scale, dtype: gl.constexpr, p_layout: gl.constexpr, SAFE: gl.constexpr = False,
                   ALU_PACK: gl.constexpr = False, POLY: gl.constexpr = 0):
    """The first key block of a tile: running max, running sum, and P as the next wgmma's register operand
    (`_p_operand`). `SAFE`: a row may see no key of the block (a sliding window, a sequence end): its max is -inf and
    p must come out 0, not NaN. `POLY`: as `_exp2` (the scores' exponentials)."""
    m_i = gl.max(s, axis=1) * qk_scale
    if SAFE:
        p = _exp2(s * qk_scale - gl.where(m_i == float("-inf"), 0.0, m_i)[:, None], POLY)
    else:
        p = _exp2(s * qk_scale - m_i[:, None], POLY)
    return _p_operand(p, dtype, p_layout, ALU_PACK), m_i, gl.sum(p, axis=1)


@gluon.jit
def _softmax_next(s, m_i, l_i, qk_scale, dtype: gl.constexpr, p_layout: gl.constexpr, SAFE: gl.constexpr = False,
                  ALU_PACK: gl.constexpr = False, POLY: gl.constexpr = 0):
    """A later key block: the online-softmax update; alpha rescales the accumulator once its P·V is done. `POLY`: as
    `_exp2` (the scores' exponentials; alpha's, one per row, stay on the special-function unit)."""
    m_new = gl.maximum(m_i, gl.max(s, axis=1) * qk_scale)
    if SAFE:
        m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
        p = _exp2(s * qk_scale - m_use[:, None], POLY)
        alpha = gl.exp2(m_i - m_use)
    else:
        p = _exp2(s * qk_scale - m_new[:, None], POLY)
        alpha = gl.exp2(m_i - m_new)
    return _p_operand(p, dtype, p_layout, ALU_PACK), m_new, l_i * alpha + gl.sum(p, axis=1), alpha


@gluon.jit
def _window_scores(s, lo, start, m0, offs_m, offs_n, diag, win_left, win_right, ROWS: gl.constexpr,
                   BLOCK_N: gl.constexpr):
    """The scores of the key block whose keys are lo ... lo + BLOCK_N - 1, loaded from key `start` (lo, unless the
    varlen program shifted a block that would cross the sequence end: `key_block_start`), with a sliding window's
    edges (flash-attn's: key j kept for row i when i + diag - win_left <= j <= i + diag + win_right) when the block
    crosses one for some of the `ROWS` rows from m0."""
    if (lo < m0 + ROWS - 1 + diag - win_left) | (lo + BLOCK_N - 1 > m0 + diag + win_right):
        rel = (start + offs_n)[None, :] - (offs_m[:, None] + diag)
        s = gl.where((rel >= -win_left) & (rel <= win_right), s, float("-inf"))
    return s


@gluon.jit
def _sink_rescale(acc, m_i, l_i, sink, rows_o: gl.constexpr):
    """The sink's logit `sink` (log2 units) joins each row's softmax denominator after the last key block (gpt-oss);
    a row that saw no key (m = -inf, l = 0) stays 0."""
    m_new = gl.maximum(m_i, sink)
    alpha = gl.exp2(m_i - m_new)
    return acc * gl.convert_layout(alpha, rows_o)[:, None], l_i * alpha + gl.exp2(sink - m_new)


@gluon.jit
def _tma_fill(desc, bar, buf, row, col, pred=True):
    """One TMA load of `desc`'s block at (row, col) into `buf`, completing `bar`'s expected transaction (no-op when
    `pred` is false)."""
    mbarrier.expect(bar, desc.block_type.nbytes, pred=pred)
    _tma_load(desc, [row, col], bar, buf, pred=pred)


@gluon.jit
def _load_kv(desc_k, desc_v, k_smem, v_smem, k_bar, v_bar, slot, block, kv_row, kv_col, pred,
             BLOCK_N: gl.constexpr):
    """TMA loads of key block `block` into ring buffer `slot` (no-ops when `pred` is false): both barriers' expected
    bytes, then both loads. Triton puts a warpgroup barrier between any two of these single-thread operations; in
    this order the one-warpgroup key loop pays one fewer a block than with each expect beside its load (TUNING.md
    step 31)."""
    row = kv_row + block * BLOCK_N
    mbarrier.expect(k_bar.index(slot), desc_k.block_type.nbytes, pred=pred)
    mbarrier.expect(v_bar.index(slot), desc_v.block_type.nbytes, pred=pred)
    _tma_load(desc_k, [row, kv_col], k_bar.index(slot), k_smem.index(slot), pred=pred)
    _tma_load(desc_v, [row, kv_col], v_bar.index(slot), v_smem.index(slot), pred=pred)


@gluon.jit
def tile_order(n_m, l2_heads, CAUSAL: gl.constexpr, LPT: gl.constexpr):
    """(start_m, off_bh): this program's query block and (batch, head). Grid (n_m, B * H) by default, head-major,
    a causal head's heaviest block first. `LPT` (grid (n_m * B * H,)): FlashAttention's SingleTileLPTScheduler
    order -- the (batch, head)s in sections of `l2_heads` (as many heads' K/V as fit in L2, `_config.l2_heads`), and
    within a section every head's heaviest query block before any head's next one, so the lightest tiles of all
    heads end the launch (longest processing time first) instead of each head's."""
    if LPT:
        tile = gl.program_id(0)
        n_bh = gl.num_programs(0) // n_m
        span = l2_heads * n_m
        section = tile // span
        within = tile % span
        if section < n_bh // l2_heads:
            width = l2_heads
        else:  # the last, partial section
            width = n_bh % l2_heads
        block = within // width
        off_bh = section * l2_heads + within % width
        if CAUSAL:
            start_m = n_m - 1 - block
        else:
            start_m = block
    else:
        if CAUSAL:
            start_m = gl.num_programs(0) - 1 - gl.program_id(0)
        else:
            start_m = gl.program_id(0)
        off_bh = gl.program_id(1)
    return start_m, off_bh


@gluon.jit
def _globaltimer(dep):
    """The GPU's global nanosecond timer (`%globaltimer`); `dep` only orders the read (a timeline's stamps)."""
    return gl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,r", [dep], dtype=gl.int64, is_pure=False, pack=1)


@gluon.jit
def _smid(dep):
    """The SM this program runs on (`%smid`)."""
    return gl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r,r", [dep], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _program_tile(H, GROUPS, SQ, SK, L2_HEADS, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, CAUSAL: gl.constexpr,
                  HEADS_IN_ROWS: gl.constexpr, LPT: gl.constexpr):
    """(m0, q_row, kv_row, q_col, kv_col, h) of this program's tile (`tile_order`; Sq a multiple of BLOCK_M); the TMA
    coordinates in `[B*S, H*D]` (a head is a column block) or, with `HEADS_IN_ROWS`, `[B*H*S, D]` (a head's rows are
    consecutive)."""
    start_m, off_bh = tile_order(SQ // BLOCK_M, L2_HEADS, CAUSAL, LPT)
    b = off_bh // H
    h = off_bh % H
    hk = h // GROUPS  # GQA
    m0 = start_m * BLOCK_M
    if HEADS_IN_ROWS:
        return m0, (b * H + h) * SQ + m0, (b * (H // GROUPS) + hk) * SK, 0, 0, h
    else:
        return m0, b * SQ + m0, b * SK, h * HEAD_DIM, hk * HEAD_DIM, h


@gluon.jit
def attention_fwd_sm90(desc_q, desc_k, desc_v, desc_o, qk_scale, H, GROUPS, SQ, SK, L2_HEADS, Sinks, win_left,
                       win_right, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                       STAGES: gl.constexpr, CAUSAL: gl.constexpr, num_warps: gl.constexpr,
                       HEADS_IN_ROWS: gl.constexpr = False, LPT: gl.constexpr = False, WINDOW: gl.constexpr = False,
                       SINKS: gl.constexpr = False, EXP_POLY: gl.constexpr = 0, V_WAIT_EARLY: gl.constexpr = False):
    """grid = (Sq / BLOCK_M, B * H), with `LPT` (Sq / BLOCK_M * B * H,) (`tile_order`); BLOCK_M = 16 * num_warps
    (one warpgroup per 64 rows). The descriptors are 2-D views `[B*S, H*D]` of `[B, S, H, D]` tensors, or with
    `HEADS_IN_ROWS` `[B*H*S, D]` of `[B, H, S, D]` ones (`[B, S, H, D]` views of them: what a transpose of PyTorch's
    own layout hands over, read without a copy). `WINDOW`: a sliding window (win_left, win_right; a bound past every
    key for an unbounded side), the tile walks only the key blocks its rows' windows reach; `SINKS`: the sink logits
    Sinks `[H]` (any float dtype) join each row's denominator. Sq <= Sk whenever either is on (every row sees a key).
    `EXP_POLY`: one score exponential in that many (2, 4) as a polynomial on the FMA pipes (`_exp2`, `Config.exp_poly`).
    `V_WAIT_EARLY`: each block's values waited for at the end of its softmax (`_v_wait_early`, `Config.v_wait_early`)."""
    dtype: gl.constexpr = desc_q.dtype
    m0, q_row, kv_row, q_col, kv_col, h = _program_tile(H, GROUPS, SQ, SK, L2_HEADS, HEAD_DIM, BLOCK_M, CAUSAL,
                                                        HEADS_IN_ROWS, LPT)

    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, HEAD_DIM, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    rows_o: gl.constexpr = gl.SliceLayout(1, o_layout)

    q_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, HEAD_DIM], desc_q.layout)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], desc_k.layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], desc_v.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_bar = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_bar = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_bar.index(i), count=1)
        mbarrier.init(v_bar.index(i), count=1)

    diag = SK - SQ  # bottom-right causal: row i sees keys j <= i + diag
    if CAUSAL:
        end = gl.minimum(m0 + BLOCK_M + diag, SK)
        full = gl.minimum(m0 + diag + 1, SK) // BLOCK_N * BLOCK_N  # blocks below: no mask needed
    else:
        end = SK
        full = SK
    if WINDOW:  # the key blocks from the first row's window start to the last row's window end
        end = gl.minimum(end, m0 + BLOCK_M + diag + win_right)
        first = gl.maximum(m0 + diag - win_left, 0) // BLOCK_N
    else:
        first = 0
    n_blocks = gl.cdiv(end, BLOCK_N) - first

    mbarrier.expect(q_bar, desc_q.block_type.nbytes)
    _tma_load(desc_q, [q_row, q_col], q_bar, q_smem)
    for i in gl.static_range(STAGES):
        _load_kv(desc_k, desc_v, k_smem, v_smem, k_bar, v_bar, i, first + i, kv_row, kv_col, i < n_blocks, BLOCK_N)

    offs_m = m0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout))
    offs_n = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    zero_s = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)

    # block 0: scores, then the first softmax (no running state to rescale yet)
    mbarrier.wait(q_bar, 0)
    mbarrier.wait(k_bar.index(0), 0)
    s = warpgroup_mma(q_smem, k_smem.index(0).permute((1, 0)), zero_s, use_acc=False, is_async=True)
    s = warpgroup_mma_wait(0, deps=[s])
    s = _scores(s, first, full, offs_m, offs_n, diag, CAUSAL, BLOCK_N, WINDOW, m0, win_left, win_right, BLOCK_M)
    p_op, m_i, l_i = _softmax_first(s, qk_scale, dtype, p_layout, WINDOW, POLY=EXP_POLY)
    if V_WAIT_EARLY:
        _v_wait_early(v_bar, 0, STAGES)
    acc = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, o_layout)

    for j in range(1, n_blocks):
        slot = j % STAGES
        prev = (j - 1) % STAGES
        mbarrier.wait(k_bar.index(slot), (j // STAGES) & 1)
        s = warpgroup_mma(q_smem, k_smem.index(slot).permute((1, 0)), zero_s, use_acc=False, is_async=True)
        if not V_WAIT_EARLY:
            mbarrier.wait(v_bar.index(prev), ((j - 1) // STAGES) & 1)
        acc = warpgroup_mma(p_op, v_smem.index(prev), acc, is_async=True)
        s = warpgroup_mma_wait(1, deps=[s])  # S_j done; P_{j-1} V_{j-1} may still run under the softmax
        s = _scores(s, first + j, full, offs_m, offs_n, diag, CAUSAL, BLOCK_N, WINDOW, m0, win_left, win_right,
                    BLOCK_M)
        p_op, m_i, l_i, alpha = _softmax_next(s, m_i, l_i, qk_scale, dtype, p_layout, WINDOW, POLY=EXP_POLY)
        acc = _pv_wait(acc, v_bar, j, STAGES, V_WAIT_EARLY)
        acc = acc * gl.convert_layout(alpha, rows_o)[:, None]
        if num_warps > 4:  # another warpgroup may still read this stage
            _cta_barrier()
        nxt = j - 1 + STAGES
        _load_kv(desc_k, desc_v, k_smem, v_smem, k_bar, v_bar, prev, first + nxt, kv_row, kv_col, nxt < n_blocks,
                 BLOCK_N)

    last = (n_blocks - 1) % STAGES
    if not V_WAIT_EARLY:  # (with it, waited for at the end of the last block's softmax)
        mbarrier.wait(v_bar.index(last), ((n_blocks - 1) // STAGES) & 1)
    acc = warpgroup_mma(p_op, v_smem.index(last), acc, is_async=True)
    acc = warpgroup_mma_wait(0, deps=[acc])
    if SINKS:
        acc, l_i = _sink_rescale(acc, m_i, l_i, gl.load(Sinks + h).to(gl.float32) * 1.4426950408889634, rows_o)

    mbarrier.invalidate(q_bar)
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(k_bar.index(i))
        mbarrier.invalidate(v_bar.index(i))
    out = acc / gl.convert_layout(l_i, rows_o)[:, None]
    q_smem.store(out.to(dtype))  # Q's buffer is free: every QKᵀ has completed
    fence_async_shared()
    _tma_store(desc_o, [q_row, q_col], q_smem)
    tma.store_wait(0)


# -----------------------------------------------------------------------------------------------------------------
# Warp-specialized form: a 128-row Q tile split between two independent consumer warpgroups that share every K/V
# stage (half the shared-memory traffic per row of the 64-row program) and a one-warp TMA producer. The consumers
# synchronize only through mbarriers (no CTA-wide barrier in their loop), so they drift apart and one's softmax
# runs under the other's matmuls, as two 64-row CTAs on one SM do, but from one K/V load.
# -----------------------------------------------------------------------------------------------------------------
@gluon.jit
def key_block_start(j, sk, BLOCK_N: gl.constexpr):
    """The first key of block j of a sequence of `sk` keys: j * BLOCK_N, except that a block that would cross the
    sequence's end starts at sk - BLOCK_N instead (when the sequence has that many keys), so it never reads the next
    sequence's rows (whose inf/NaN would reach P·V as 0·inf). The producer loads from it; the varlen consumers mask
    the keys of such a block that the block before already saw."""
    return gl.minimum(j * BLOCK_N, gl.maximum(sk - BLOCK_N, 0))


@gluon.jit
def _ws_producer(desc_q, desc_k, desc_v, q_smem, k_smem, v_smem, q_bar, k_bar, v_bar, k_empty, v_empty,
                 q_row, kv_row, q_col, kv_col, first, n_blocks, sk,
                 HALF_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, CONSUMERS: gl.constexpr = 2):
    """TMA loads of the Q tile (`CONSUMERS` slices of HALF_M rows) and `n_blocks` key blocks from block `first` (a sliding window's first block, else 0)
    of a sequence of `sk` keys starting at row `kv_row` (`key_block_start`: the last block stays inside the
    sequence). A stage's K and V are refilled separately, each
    as soon as both consumers released it (`k_empty` after their QKᵀ, `v_empty` after their P·V: TUNING.md step 13;
    under `JOINT_RELEASE` both are the same barriers, which the consumers arrive on once, after P·V)."""
    mbarrier.expect(q_bar, CONSUMERS * desc_q.block_type.nbytes)
    for c in gl.static_range(CONSUMERS):  # one 64-row slice of the Q tile per consumer warpgroup
        _tma_load(desc_q, [q_row + c * HALF_M, q_col], q_bar, q_smem.index(c))
    for j in range(n_blocks):
        slot = j % STAGES
        row = kv_row + key_block_start(first + j, sk, BLOCK_N)
        if j >= STAGES:  # both consumers are done with the keys of the block that used this stage last
            mbarrier.wait(k_empty.index(slot), ((j // STAGES) - 1) & 1)
        _tma_fill(desc_k, k_bar.index(slot), k_smem.index(slot), row, kv_col)
        if j >= STAGES:  # ... and with its values
            mbarrier.wait(v_empty.index(slot), ((j // STAGES) - 1) & 1)
        _tma_fill(desc_v, v_bar.index(slot), v_smem.index(slot), row, kv_col)


@gluon.jit
def _ws_first_scores(q_tile, k_smem, q_bar, k_bar, m0, diag, n_blocks, s_layout: gl.constexpr,
                     HALF_M: gl.constexpr, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr):
    """A dense warp-specialized consumer's start (`_ws_consumer`, `_gluon_fp8._fp8_consumer`): the raw scores of key
    block 0 (S = Q·K₀ᵀ, waited for), `full` (the keys every row of this half sees whole: blocks before it need no
    causal mask), the row and column offsets of the score tile, and the zero accumulator each later QKᵀ starts from."""
    if CAUSAL:
        full = gl.minimum(m0 + diag + 1, n_blocks * BLOCK_N) // BLOCK_N * BLOCK_N
    else:
        full = n_blocks * BLOCK_N
    offs_m = m0 + gl.arange(0, HALF_M, layout=gl.SliceLayout(1, s_layout))
    offs_n = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    zero_s = gl.zeros([HALF_M, BLOCK_N], gl.float32, s_layout)
    mbarrier.wait(q_bar, 0)
    mbarrier.wait(k_bar.index(0), 0)
    s = warpgroup_mma(q_tile, k_smem.index(0).permute((1, 0)), zero_s, use_acc=False, is_async=True)
    s = warpgroup_mma_wait(0, deps=[s])
    return s, full, offs_m, offs_n, zero_s


@gluon.jit
def _take_turn(turn, phase, SECOND: gl.constexpr):
    """Wait until this consumer (the first or the `SECOND` of the ping-pong's two) may issue: `turn[SECOND]` has
    completed phase `phase` (`Config.pingpong`, `_turns`)."""
    mbarrier.wait(turn.index(1 if SECOND else 0), phase)


@gluon.jit
def _pass_turn(turn, SECOND: gl.constexpr):
    """Hand the turn to the other consumer (from the `SECOND` to the first, or back); the second's first call, before
    any product, gives the first its first turn."""
    mbarrier.arrive(turn.index(0 if SECOND else 1), count=1)


@gluon.jit
def _v_wait_early(v_bar, ring, STAGES: gl.constexpr):
    """Wait for the values of key block `ring` (its stage and phase in the K/V ring) at the end of its softmax, before
    the wait for the accumulator, instead of just before its P·V is issued (`Config.v_wait_early`). Why: ptxas
    schedules a `wgmma.wait_group` as early as its basic block allows, and in the programs' key loops that put the
    wait for P_{j-1}·V_{j-1} above every exponential of S_j (TUNING.md steps 30-31): the softmax ran after that
    product, not under it. An mbarrier wait is a loop, so it ends the basic block: the accumulator's wait after it
    cannot rise above the exponentials. Waiting for the values earlier costs nothing where the producer loads them
    with the block's keys (it does)."""
    mbarrier.wait(v_bar.index(ring % STAGES), (ring // STAGES) & 1)


@gluon.jit
def _pv_wait(acc, v_bar, ring, STAGES: gl.constexpr, V_WAIT_EARLY: gl.constexpr):
    """The wait for P_{j-1}·V_{j-1} (the accumulator `acc`) at the end of key block `ring`'s softmax; with
    `V_WAIT_EARLY` block `ring`'s values are waited for just before it (`_v_wait_early`), which is what keeps the
    softmax's exponentials ahead of it in the machine code."""
    if V_WAIT_EARLY:
        _v_wait_early(v_bar, ring, STAGES)
    return warpgroup_mma_wait(0, deps=[acc])


@gluon.jit
def _ws_issue(ring, q_tile, k_smem, v_smem, k_bar, v_bar, k_empty, zero_s, p_op, acc, STAGES: gl.constexpr,
              JOINT_RELEASE: gl.constexpr, turn=None, turn_phase=0, PINGPONG: gl.constexpr = False,
              SECOND: gl.constexpr = False, V_WAIT_EARLY: gl.constexpr = False):
    """The start of a warp-specialized consumer's key block at `ring` (its stage and phase in the K/V ring): S issued,
    P·V of the block before behind it, S waited for (that P·V may still run), the stage's keys released unless
    `JOINT_RELEASE`. (S, the in-flight accumulator, the previous block's stage); the caller masks, runs the softmax,
    waits for the accumulator and releases that stage's values (`_ws_step`, the varlen program's loop). `PINGPONG`:
    both matmuls are issued in this warpgroup's turn (`turn[SECOND]` completing phase `turn_phase`), which passes
    to the other consumer (`turn[not SECOND]`) as soon as they are issued, so that its matmuls run under this one's softmax
    (FlashAttention-3's warpgroup ping-pong, `Config.pingpong`). `V_WAIT_EARLY`: the previous block's values were
    waited for at the end of its softmax (`_ws_step`), not here."""
    slot = ring % STAGES
    prev = (ring - 1) % STAGES
    mbarrier.wait(k_bar.index(slot), (ring // STAGES) & 1)
    if PINGPONG:
        _take_turn(turn, turn_phase, SECOND)
    s = warpgroup_mma(q_tile, k_smem.index(slot).permute((1, 0)), zero_s, use_acc=False, is_async=True)
    if not V_WAIT_EARLY:
        mbarrier.wait(v_bar.index(prev), ((ring - 1) // STAGES) & 1)
    acc = warpgroup_mma(p_op, v_smem.index(prev), acc, is_async=True)
    if PINGPONG:
        _pass_turn(turn, SECOND)
    s = warpgroup_mma_wait(1, deps=[s])  # S done; the previous block's P V may still run under the softmax
    if not JOINT_RELEASE:
        mbarrier.arrive(k_empty.index(slot), count=1)  # ... and with this block's keys
    return s, acc, prev


@gluon.jit
def _ws_step(j, ring, q_tile, k_smem, v_smem, k_bar, v_bar, k_empty, v_empty, zero_s, p_op, m_i, l_i, acc, qk_scale,
             full, offs_m, offs_n, diag, rows_o: gl.constexpr, p_layout: gl.constexpr, BLOCK_N: gl.constexpr,
             STAGES: gl.constexpr, CAUSAL: gl.constexpr, JOINT_RELEASE: gl.constexpr, EXP_POLY: gl.constexpr,
             q_empty=None, q_done=False, RELEASE_Q: gl.constexpr = False, turn=None,
             PINGPONG: gl.constexpr = False, SECOND: gl.constexpr = False, turn_base=0,
             WINDOW: gl.constexpr = False, first=0, m0=0, win_left=0, win_right=0, HALF_M: gl.constexpr = 64,
             V_WAIT_EARLY: gl.constexpr = False):
    """Key block j of `_ws_consumer`'s loop: S_j issued, P_{j-1}·V_{j-1} behind it, the softmax of S_j under that
    matmul, then the rescale. `ring`: the block's number in the K/V ring (its stage and phase; j in a program of one
    tile, the key blocks of the tiles before plus j in the persistent one). `CAUSAL`: the block is tested against
    `full` and masked where it crosses the diagonal. `RELEASE_Q` (persistent): once S_j is done, `q_empty` is
    arrived on if `q_done` (this was the tile's last QKᵀ: the producer may load the next tile's Q). `PINGPONG`: the
    matmuls issued in this warpgroup's turn (`_ws_issue`; the turn of block j completes phase (turn_base + j - 1) & 1,
    `turn_base` the loop steps of the tiles before in the persistent program). `WINDOW` (persistent): j counts from
    the tile's first key block `first`; a block that crosses a window edge of the `HALF_M` rows from m0 is masked
    (`_window_scores`) and the softmax is safe for rows that see none of its keys. `V_WAIT_EARLY`: this block's
    values waited for after its softmax, before the accumulator is (`_v_wait_early`), not before its P·V is issued."""
    dtype: gl.constexpr = q_tile.dtype
    s, acc, prev = _ws_issue(ring, q_tile, k_smem, v_smem, k_bar, v_bar, k_empty, zero_s, p_op, acc, STAGES,
                             JOINT_RELEASE, turn, (turn_base + j - 1) & 1, PINGPONG, SECOND, V_WAIT_EARLY)
    if RELEASE_Q:
        mbarrier.arrive(q_empty, count=1, pred=q_done)  # (a constant True where the caller peeled the last block)
    s = _scores(s, first + j, full, offs_m, offs_n, diag, CAUSAL, BLOCK_N, WINDOW, m0, win_left, win_right, HALF_M)
    p_op, m_i, l_i, alpha = _softmax_next(s, m_i, l_i, qk_scale, dtype, p_layout, WINDOW, POLY=EXP_POLY)
    acc = _pv_wait(acc, v_bar, ring, STAGES, V_WAIT_EARLY)
    mbarrier.arrive(v_empty.index(prev), count=1)  # ... and with block j-1's values
    acc = acc * gl.convert_layout(alpha, rows_o)[:, None]
    return p_op, m_i, l_i, acc


@gluon.jit
def _ws_consumer(desc_o, q_tile, k_smem, v_smem, q_bar, k_bar, v_bar, k_empty, v_empty, qk_scale,
                 o_row, q_col, m0, diag, n_blocks, sink,
                 HEAD_DIM: gl.constexpr, HALF_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                 CAUSAL: gl.constexpr, JOINT_RELEASE: gl.constexpr, SINKS: gl.constexpr, EXP_POLY: gl.constexpr = 0,
                 SPLIT_MASK: gl.constexpr = False, turn=None, PINGPONG: gl.constexpr = False,
                 SECOND: gl.constexpr = False, V_WAIT_EARLY: gl.constexpr = False):
    """64 rows of the tile (rows m0 ...), one warpgroup: the schedule of `attention_fwd_sm90`, with the stage
    released to the producer (`k_empty`, `v_empty`: `_ws_producer`) instead of refilled. Both halves walk the same
    `n_blocks` (the lower half's last blocks are fully masked for the upper half: probabilities 0, running max
    unchanged). `SINKS`: the sink's logit `sink` (log2 units) joins each row's denominator after the last block
    (gpt-oss; every row here sees a key, so the running max is finite). `SPLIT_MASK` (causal): the key loop in two,
    the blocks before `full` with no mask test, then the diagonal ones (`Config.split_mask`). `PINGPONG`: the two
    consumers issue each key block's matmuls in turns (`_ws_issue`); the `SECOND` hands the first its first turn.
    `V_WAIT_EARLY`: each block's values waited for at the end of its softmax (`_v_wait_early`)."""
    dtype: gl.constexpr = q_tile.dtype
    if PINGPONG and SECOND:
        _pass_turn(turn, True)
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, HEAD_DIM, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    rows_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    s, full, offs_m, offs_n, zero_s = _ws_first_scores(q_tile, k_smem, q_bar, k_bar, m0, diag, n_blocks, s_layout,
                                                       HALF_M, BLOCK_N, CAUSAL)
    if not JOINT_RELEASE:
        mbarrier.arrive(k_empty.index(0), count=1)  # this warpgroup is done with block 0's keys
    s = _scores(s, 0, full, offs_m, offs_n, diag, CAUSAL, BLOCK_N)
    p_op, m_i, l_i = _softmax_first(s, qk_scale, dtype, p_layout, POLY=EXP_POLY)
    if V_WAIT_EARLY:
        _v_wait_early(v_bar, 0, STAGES)
    acc = gl.zeros([HALF_M, HEAD_DIM], gl.float32, o_layout)

    if SPLIT_MASK:  # the blocks every row of this half sees whole, with no mask test, then the diagonal's (a
        # constexpr alone: `SPLIT_MASK and CAUSAL` would not fold, and both forms would be compiled)
        n_plain = gl.maximum(gl.minimum(full // BLOCK_N, n_blocks), 1)
        for j in range(1, n_plain):
            p_op, m_i, l_i, acc = _ws_step(j, j, q_tile, k_smem, v_smem, k_bar, v_bar, k_empty, v_empty, zero_s, p_op,
                                           m_i, l_i, acc, qk_scale, full, offs_m, offs_n, diag, rows_o, p_layout,
                                           BLOCK_N, STAGES, False, JOINT_RELEASE, EXP_POLY, turn=turn,
                                           PINGPONG=PINGPONG, SECOND=SECOND, V_WAIT_EARLY=V_WAIT_EARLY)
        for j in range(n_plain, n_blocks):  # none when not causal (`full` is every key then)
            p_op, m_i, l_i, acc = _ws_step(j, j, q_tile, k_smem, v_smem, k_bar, v_bar, k_empty, v_empty, zero_s, p_op,
                                           m_i, l_i, acc, qk_scale, full, offs_m, offs_n, diag, rows_o, p_layout,
                                           BLOCK_N, STAGES, CAUSAL, JOINT_RELEASE, EXP_POLY, turn=turn,
                                           PINGPONG=PINGPONG, SECOND=SECOND, V_WAIT_EARLY=V_WAIT_EARLY)
    else:  # one loop; under CAUSAL each block is tested against `full` and the diagonal's masked
        for j in range(1, n_blocks):
            p_op, m_i, l_i, acc = _ws_step(j, j, q_tile, k_smem, v_smem, k_bar, v_bar, k_empty, v_empty, zero_s, p_op,
                                           m_i, l_i, acc, qk_scale, full, offs_m, offs_n, diag, rows_o, p_layout,
                                           BLOCK_N, STAGES, CAUSAL, JOINT_RELEASE, EXP_POLY, turn=turn,
                                           PINGPONG=PINGPONG, SECOND=SECOND, V_WAIT_EARLY=V_WAIT_EARLY)

    last = (n_blocks - 1) % STAGES
    if not V_WAIT_EARLY:  # (with it, waited for at the end of the last block's softmax)
        mbarrier.wait(v_bar.index(last), ((n_blocks - 1) // STAGES) & 1)
    acc = warpgroup_mma(p_op, v_smem.index(last), acc, is_async=True)
    acc = warpgroup_mma_wait(0, deps=[acc])
    if SINKS:
        acc, l_i = _sink_rescale(acc, m_i, l_i, sink, rows_o)
    out = acc / gl.convert_layout(l_i, rows_o)[:, None]
    q_tile.store(out.to(dtype))  # this half's Q buffer is free: all its QKᵀ are done
    fence_async_shared()
    _tma_store(desc_o, [o_row, q_col], q_tile)
    tma.store_wait(0)


@gluon.jit
def _ws_buffers(desc_q, desc_k, desc_v, HALF_M: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr,
                STAGES: gl.constexpr, JOINT_RELEASE: gl.constexpr, CONSUMERS: gl.constexpr = 2):
    """Shared memory and barriers of the warp-specialized programs (dense and varlen): the Q slices (one per consumer
    warpgroup, `CONSUMERS`), the K/V stages, their `full` barriers (one TMA transaction each) and their `empty`
    barriers (one arrival per consumer warpgroup; a single set for K and V under `JOINT_RELEASE`)."""
    dtype: gl.constexpr = desc_q.dtype
    q_smem = gl.allocate_shared_memory(dtype, [CONSUMERS, HALF_M, HEAD_DIM], desc_q.layout)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], desc_k.layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], desc_v.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_bar = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_bar = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_bar.index(i), count=1)
        mbarrier.init(v_bar.index(i), count=1)
        mbarrier.init(k_empty.index(i), count=CONSUMERS)
    if JOINT_RELEASE:
        v_empty = k_empty
    else:
        v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(STAGES):
            mbarrier.init(v_empty.index(i), count=CONSUMERS)
    return q_smem, k_smem, v_smem, q_bar, k_bar, v_bar, k_empty, v_empty


@gluon.jit
def _turns():
    """The ping-pong's two barriers (`Config.pingpong`): turn[c] completes a phase when consumer c may issue."""
    turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    mbarrier.init(turn.index(0), count=1)
    mbarrier.init(turn.index(1), count=1)
    return turn


@gluon.jit
def attention_fwd_sm90_ws(desc_q, desc_k, desc_v, desc_o, qk_scale, H, GROUPS, SQ, SK, Sinks, L2_HEADS, Timeline,
                          HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                          STAGES: gl.constexpr, CAUSAL: gl.constexpr, num_warps: gl.constexpr,
                          HEADS_IN_ROWS: gl.constexpr = False, JOINT_RELEASE: gl.constexpr = False,
                          SINKS: gl.constexpr = False, LPT: gl.constexpr = False, EXP_POLY: gl.constexpr = 0,
                          TIMELINE: gl.constexpr = False, SPLIT_MASK: gl.constexpr = False,
                          PINGPONG: gl.constexpr = False, V_WAIT_EARLY: gl.constexpr = False):
    """grid = (Sq / BLOCK_M, B * H), with `LPT` (Sq / BLOCK_M * B * H,) (`tile_order`); BLOCK_M = 128 (two consumer
    warpgroups of 64 rows), num_warps = 4 (the default
    partition is consumer 0; consumer 1 and the producer are worker partitions). desc_q/desc_o tiles are 64 rows.
    `HEADS_IN_ROWS`: as in `attention_fwd_sm90`. `JOINT_RELEASE`: a K/V stage is released once, after P·V (kept to
    measure against; TUNING.md step 13). `SINKS`: attention sinks (Sinks `[H]`, any float
    dtype; None without), the one model feature this program computes (`_features.py`). `EXP_POLY`: as in
    `attention_fwd_sm90`. `TIMELINE`: each program writes Timeline[4 * pid ...] (int64; pid = the launch's linear
    program id) = the global timer (ns) at its start and after its consumers are done, its SM, its key blocks (a
    diagnostic of the schedule: `attention(..., timeline=)`; None and off otherwise). `SPLIT_MASK`: as in
    `_ws_consumer`. `PINGPONG`: the consumers issue their matmuls in turns (`_ws_issue`, `Config.pingpong`).
    `V_WAIT_EARLY`: each block's values waited for at the end of its softmax (`_v_wait_early`, `Config.v_wait_early`)."""
    HALF_M: gl.constexpr = BLOCK_M // 2
    if TIMELINE:
        pid = gl.program_id(0) + gl.program_id(1) * gl.num_programs(0)
        t_start = _globaltimer(pid)
    m0, q_row, kv_row, q_col, kv_col, h = _program_tile(H, GROUPS, SQ, SK, L2_HEADS, HEAD_DIM, BLOCK_M, CAUSAL,
                                                        HEADS_IN_ROWS, LPT)
    if SINKS:  # the sink's logit (unscaled, natural units) in the softmax's log2 units
        sink = gl.load(Sinks + h).to(gl.float32) * 1.4426950408889634
    else:
        sink = qk_scale  # not read
    diag = SK - SQ
    if CAUSAL:
        end = gl.minimum(m0 + BLOCK_M + diag, SK)
    else:
        end = SK
    n_blocks = gl.cdiv(end, BLOCK_N)
    # setmaxnreg budget (64K registers, 3 warpgroups): the consumers take what the producer warp does not need
    CONSUMER_REGS: gl.constexpr = 232 if BLOCK_N * HEAD_DIM > 8192 or HEAD_DIM > 128 else 168
    q_smem, k_smem, v_smem, q_bar, k_bar, v_bar, k_empty, v_empty = _ws_buffers(
        desc_q, desc_k, desc_v, HALF_M, HEAD_DIM, BLOCK_N, STAGES, JOINT_RELEASE)
    if PINGPONG:  # turn[c]: consumer c may issue its next block's matmuls
        turn = _turns()
    else:
        turn = k_empty  # not read
    gl.warp_specialize([
        (_ws_consumer, (desc_o, q_smem.index(0), k_smem, v_smem, q_bar, k_bar, v_bar, k_empty, v_empty, qk_scale,
                        q_row, q_col, m0, diag, n_blocks, sink, HEAD_DIM, HALF_M, BLOCK_N, STAGES, CAUSAL,
                        JOINT_RELEASE, SINKS, EXP_POLY, SPLIT_MASK, turn, PINGPONG, False, V_WAIT_EARLY)),
        (_ws_consumer, (desc_o, q_smem.index(1), k_smem, v_smem, q_bar, k_bar, v_bar, k_empty, v_empty, qk_scale,
                        q_row + HALF_M, q_col, m0 + HALF_M, diag, n_blocks, sink, HEAD_DIM, HALF_M, BLOCK_N,
                        STAGES, CAUSAL, JOINT_RELEASE, SINKS, EXP_POLY, SPLIT_MASK, turn, PINGPONG, True,
                        V_WAIT_EARLY)),
        (_ws_producer, (desc_q, desc_k, desc_v, q_smem, k_smem, v_smem, q_bar, k_bar, v_bar, k_empty, v_empty,
                        q_row, kv_row, q_col, kv_col, 0, n_blocks, SK, HALF_M, BLOCK_N, STAGES)),
    ], [4, 1], [CONSUMER_REGS, 24])
    if TIMELINE:  # after the partitions joined
        rec = Timeline + pid * 4
        gl.store(rec, t_start)
        gl.store(rec + 1, _globaltimer(n_blocks))
        gl.store(rec + 2, _smid(n_blocks).to(gl.int64))
        gl.store(rec + 3, n_blocks.to(gl.int64))


# -----------------------------------------------------------------------------------------------------------------
# Persistent form of the warp-specialized program: one CTA per SM walks the tiles the host's plan gives it
# (`_plan.lpt_plan`: longest first, balanced across the CTAs, in sections of heads whose K/V fit in L2), so no tile
# waits on a new CTA's start and each tile's prologue runs under the last one's end: the producer loads the next
# tile's K/V stages while the consumers finish this one, and its Q as soon as both consumers' last QKᵀ of this tile is
# done (they release Q then, and store O from registers instead of staging it in Q's buffer). The key loop is the
# dense program's (`_ws_step`, K and V released apart), on a ring counter of key blocks across tiles. The plan:
# Plan[p], Plan[p + 1] bound CTA p's entries in Plan[grid + 1:], each a tile `off_bh * n_m + start_m`.
# -----------------------------------------------------------------------------------------------------------------
@gluon.jit
def _plan_tile(Plan, i, n_m, SK, SQ, H, GROUPS, HEAD_DIM: gl.constexpr, CAUSAL: gl.constexpr,
               BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEADS_IN_ROWS: gl.constexpr, win_left=0, win_right=0,
               WINDOW: gl.constexpr = False):
    """(q_row, kv_row, q_col, kv_col, m0, n_blocks, tile, first, h) of the plan's entry i: TMA coordinates in
    `[B*S, H*D]` (a head is a column block) or, with `HEADS_IN_ROWS`, `[B*H*S, D]` (as `_program_tile`; the key rows
    from block 0); `tile` its number, `off_bh * n_m + start_m`; the tile walks `n_blocks` key blocks from block
    `first` (`WINDOW`: from the first row's window start to the last row's window end, as `attention_fwd_sm90`; else
    0); h its query head."""
    tile = gl.load(Plan + gl.num_programs(0) + 1 + i)
    off_bh = tile // n_m
    b = off_bh // H
    h = off_bh % H
    hk = h // GROUPS
    m0 = (tile % n_m) * BLOCK_M
    if CAUSAL:
        end = gl.minimum(m0 + BLOCK_M + SK - SQ, SK)
    else:
        end = SK
    if WINDOW:
        end = gl.minimum(end, m0 + BLOCK_M + SK - SQ + win_right)
        first = gl.maximum(m0 + SK - SQ - win_left, 0) // BLOCK_N
    else:
        first = 0
    n_blocks = gl.cdiv(end, BLOCK_N) - first
    if HEADS_IN_ROWS:
        return (b * H + h) * SQ + m0, (b * (H // GROUPS) + hk) * SK, 0, 0, m0, n_blocks, tile, first, h
    else:
        return b * SQ + m0, b * SK, h * HEAD_DIM, hk * HEAD_DIM, m0, n_blocks, tile, first, h


@gluon.jit
def _wsp_producer(desc_q, desc_k, desc_v, q_smem, k_smem, v_smem, q_bar, q_empty, k_bar, v_bar, k_empty, v_empty,
                  Plan, n_m, SQ, SK, H, GROUPS, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr,
                  BLOCK_N: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr, HEADS_IN_ROWS: gl.constexpr,
                  win_left=0, win_right=0, WINDOW: gl.constexpr = False):
    HALF_M: gl.constexpr = BLOCK_M // 2
    lo = gl.load(Plan + gl.program_id(0))
    hi = gl.load(Plan + gl.program_id(0) + 1)
    ring = 0
    for i in range(lo, hi):
        q_row, kv_row, q_col, kv_col, m0, n_blocks, tile, first, h = _plan_tile(
            Plan, i, n_m, SK, SQ, H, GROUPS, HEAD_DIM, CAUSAL, BLOCK_M, BLOCK_N, HEADS_IN_ROWS, win_left, win_right,
            WINDOW)
        kv_row = kv_row + first * BLOCK_N
        if i > lo:  # both consumers are past their last QKᵀ of the previous tile
            mbarrier.wait(q_empty, (i - lo - 1) & 1)
        mbarrier.expect(q_bar, 2 * desc_q.block_type.nbytes)
        _tma_load(desc_q, [q_row, q_col], q_bar, q_smem.index(0))
        _tma_load(desc_q, [q_row + HALF_M, q_col], q_bar, q_smem.index(1))
        for j in range(n_blocks):
            r = ring + j
            slot = r % STAGES
            if r >= STAGES:  # as `_ws_producer`: K and V of a stage refilled apart, each once both consumers let go
                mbarrier.wait(k_empty.index(slot), ((r // STAGES) - 1) & 1)
            _tma_fill(desc_k, k_bar.index(slot), k_smem.index(slot), kv_row + j * BLOCK_N, kv_col)
            if r >= STAGES:
                mbarrier.wait(v_empty.index(slot), ((r // STAGES) - 1) & 1)
            _tma_fill(desc_v, v_bar.index(slot), v_smem.index(slot), kv_row + j * BLOCK_N, kv_col)
        ring += n_blocks


@gluon.jit
def _wsp_consumer(O, stride_os, q_tile, k_smem, v_smem, q_bar, q_empty, k_bar, v_bar, k_empty, v_empty, qk_scale,
                  Plan, n_m, SQ, SK, H, GROUPS, Timeline, HALF: gl.constexpr, HEAD_DIM: gl.constexpr,
                  BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr,
                  TIMELINE: gl.constexpr, HEADS_IN_ROWS: gl.constexpr, turn=None, PINGPONG: gl.constexpr = False,
                  Sinks=None, win_left=0, win_right=0, WINDOW: gl.constexpr = False, SINKS: gl.constexpr = False,
                  V_WAIT_EARLY: gl.constexpr = False):
    """Rows HALF * 64 ... of each of this CTA's tiles: `_ws_consumer`'s schedule tile after tile. `TIMELINE` (consumer
    0 writes it): Timeline[4 * tile ...] = the global timer before the tile's Q is waited for and after its O is
    stored, the SM, the key blocks (`attention_fwd_sm90_ws`'s records, one per tile instead of one per program).
    `PINGPONG`: the key loops' products in turns (`_ws_issue`), the turns counted across tiles (both consumers walk
    the same tiles, each of n_blocks - 1 loop steps). `WINDOW`, `SINKS`: as `attention_fwd_sm90` (each tile walks the
    key blocks its rows' windows reach, `_plan_tile`; the sink joins each row's denominator after the tile's last
    block)."""
    HALF_M: gl.constexpr = BLOCK_M // 2
    dtype: gl.constexpr = q_tile.dtype
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, HEAD_DIM, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    rows_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    offs_n = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    zero_s = gl.zeros([HALF_M, BLOCK_N], gl.float32, s_layout)
    diag = SK - SQ
    lo = gl.load(Plan + gl.program_id(0))
    hi = gl.load(Plan + gl.program_id(0) + 1)
    if PINGPONG and HALF == 1:
        _pass_turn(turn, True)
    ring = 0
    for i in range(lo, hi):
        q_row, kv_row, q_col, kv_col, m0, n_blocks, tile, first, h = _plan_tile(
            Plan, i, n_m, SK, SQ, H, GROUPS, HEAD_DIM, CAUSAL, BLOCK_M, BLOCK_N, HEADS_IN_ROWS, win_left, win_right,
            WINDOW)
        m0 = m0 + HALF * HALF_M
        if CAUSAL:
            full = gl.minimum(m0 + diag + 1, (first + n_blocks) * BLOCK_N) // BLOCK_N * BLOCK_N
        else:
            full = (first + n_blocks) * BLOCK_N
        offs_m = m0 + gl.arange(0, HALF_M, layout=gl.SliceLayout(1, s_layout))
        slot = ring % STAGES
        if TIMELINE:
            t_start = _globaltimer(tile)
        mbarrier.wait(q_bar, (i - lo) & 1)
        mbarrier.wait(k_bar.index(slot), (ring // STAGES) & 1)
        s = warpgroup_mma(q_tile, k_smem.index(slot).permute((1, 0)), zero_s, use_acc=False, is_async=True)
        s = warpgroup_mma_wait(0, deps=[s])
        mbarrier.arrive(k_empty.index(slot), count=1)
        mbarrier.arrive(q_empty, count=1, pred=n_blocks == 1)  # that was this tile's last QKᵀ
        s = _scores(s, first, full, offs_m, offs_n, diag, CAUSAL, BLOCK_N, WINDOW, m0, win_left, win_right, HALF_M)
        p_op, m_i, l_i = _softmax_first(s, qk_scale, dtype, p_layout, WINDOW)
        if V_WAIT_EARLY:
            _v_wait_early(v_bar, ring, STAGES)
        acc = gl.zeros([HALF_M, HEAD_DIM], gl.float32, o_layout)
        # the key loop without its last block, then that block, which releases Q after its QKᵀ: a Q release
        # inside the loop (predicated on the last block) would put a warpgroup barrier before every block's arrive.
        # The last block as a loop of at most one step, not under `if n_blocks > 1`: the values merging after that
        # `if` made ptxas 12.8 (Triton 3.6's) serialize every wgmma of the program (C7513; TUNING.md step 31)
        for j in range(1, n_blocks - 1):
            p_op, m_i, l_i, acc = _ws_step(j, ring + j, q_tile, k_smem, v_smem, k_bar, v_bar, k_empty, v_empty,
                                           zero_s, p_op, m_i, l_i, acc, qk_scale, full, offs_m, offs_n, diag, rows_o,
                                           p_layout, BLOCK_N, STAGES, CAUSAL, False, 0, turn=turn, PINGPONG=PINGPONG,
                                           SECOND=HALF == 1, turn_base=ring - (i - lo), WINDOW=WINDOW, first=first,
                                           m0=m0, win_left=win_left, win_right=win_right, HALF_M=HALF_M,
                                           V_WAIT_EARLY=V_WAIT_EARLY)
        for j in range(gl.maximum(n_blocks - 1, 1), n_blocks):
            p_op, m_i, l_i, acc = _ws_step(j, ring + j, q_tile, k_smem, v_smem, k_bar, v_bar, k_empty, v_empty,
                                           zero_s, p_op, m_i, l_i, acc, qk_scale, full, offs_m, offs_n, diag, rows_o,
                                           p_layout, BLOCK_N, STAGES, CAUSAL, False, 0, q_empty=q_empty, q_done=True,
                                           RELEASE_Q=True, turn=turn, PINGPONG=PINGPONG, SECOND=HALF == 1,
                                           turn_base=ring - (i - lo), WINDOW=WINDOW, first=first, m0=m0,
                                           win_left=win_left, win_right=win_right, HALF_M=HALF_M,
                                           V_WAIT_EARLY=V_WAIT_EARLY)
        last = ring + n_blocks - 1
        if not V_WAIT_EARLY:  # (with it, waited for at the end of the last block's softmax)
            mbarrier.wait(v_bar.index(last % STAGES), (last // STAGES) & 1)
        acc = warpgroup_mma(p_op, v_smem.index(last % STAGES), acc, is_async=True)
        acc = warpgroup_mma_wait(0, deps=[acc])
        mbarrier.arrive(v_empty.index(last % STAGES), count=1)
        if SINKS:  # the sink's logit (natural units) in the softmax's log2 units
            acc, l_i = _sink_rescale(acc, m_i, l_i, gl.load(Sinks + h).to(gl.float32) * 1.4426950408889634, rows_o)
        out = (acc / gl.convert_layout(l_i, rows_o)[:, None]).to(dtype)
        rows = q_row + HALF * HALF_M + gl.arange(0, HALF_M, layout=rows_o)
        cols = q_col + gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, o_layout))
        gl.store(O + rows.to(gl.int64)[:, None] * stride_os + cols[None, :], out)
        if TIMELINE and HALF == 0:
            rec = Timeline + tile * 4
            gl.store(rec, t_start)
            gl.store(rec + 1, _globaltimer(n_blocks))
            gl.store(rec + 2, _smid(n_blocks).to(gl.int64))
            gl.store(rec + 3, n_blocks.to(gl.int64))
        ring += n_blocks


@gluon.jit
def attention_fwd_sm90_wsp(desc_q, desc_k, desc_v, O, stride_os, qk_scale, H, GROUPS, SQ, SK, Plan, Timeline,
                           Sinks, win_left, win_right,
                           HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                           STAGES: gl.constexpr, CAUSAL: gl.constexpr, num_warps: gl.constexpr,
                           TIMELINE: gl.constexpr = False, HEADS_IN_ROWS: gl.constexpr = False,
                           PINGPONG: gl.constexpr = False, WINDOW: gl.constexpr = False,
                           SINKS: gl.constexpr = False, V_WAIT_EARLY: gl.constexpr = False):
    """grid = (CTAs,) with the plan `Plan` (int32, `_plan.lpt_plan` for that many CTAs); O is `[B*Sq, H*D]` with row
    stride `stride_os`, or with `HEADS_IN_ROWS` (q, k, v and O `[B, S, H, D]` views of `[B, H, S, D]` tensors, the
    descriptors over `[B*H*S, D]`) `[B*H*Sq, D]`; Sq a multiple of BLOCK_M, Sk of BLOCK_N (`gluon_unsupported`).
    `TIMELINE`: a record per tile in `Timeline` (`_wsp_consumer`; None and off otherwise). `PINGPONG`: as
    `attention_fwd_sm90_ws`. `WINDOW` (win_left, win_right; None without) and `SINKS` (Sinks `[H]`; None without): as
    `attention_fwd_sm90`, the plan made for the window's key blocks (`_plan.lpt_plan`). `V_WAIT_EARLY`: as
    `attention_fwd_sm90_ws`."""
    HALF_M: gl.constexpr = BLOCK_M // 2
    n_m = SQ // BLOCK_M
    # the consumers take 232 registers at every head dim: the tile loop's state (plan, ring, turn and window
    # counters) spilled at head dim 64 under the dense program's 168 (40 bytes of stack, 168 with a window)
    CONSUMER_REGS: gl.constexpr = 232
    q_smem, k_smem, v_smem, q_bar, k_bar, v_bar, k_empty, v_empty = _ws_buffers(
        desc_q, desc_k, desc_v, HALF_M, HEAD_DIM, BLOCK_N, STAGES, False)
    q_empty = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(q_empty, count=2)
    if PINGPONG:
        turn = _turns()
    else:
        turn = k_empty  # not read
    gl.warp_specialize([
        (_wsp_consumer, (O, stride_os, q_smem.index(0), k_smem, v_smem, q_bar, q_empty, k_bar, v_bar, k_empty,
                         v_empty, qk_scale, Plan, n_m, SQ, SK, H, GROUPS, Timeline, 0, HEAD_DIM, BLOCK_M,
                         BLOCK_N, STAGES, CAUSAL, TIMELINE, HEADS_IN_ROWS, turn, PINGPONG, Sinks, win_left,
                         win_right, WINDOW, SINKS, V_WAIT_EARLY)),
        (_wsp_consumer, (O, stride_os, q_smem.index(1), k_smem, v_smem, q_bar, q_empty, k_bar, v_bar, k_empty,
                         v_empty, qk_scale, Plan, n_m, SQ, SK, H, GROUPS, Timeline, 1, HEAD_DIM, BLOCK_M,
                         BLOCK_N, STAGES, CAUSAL, TIMELINE, HEADS_IN_ROWS, turn, PINGPONG, Sinks, win_left,
                         win_right, WINDOW, SINKS, V_WAIT_EARLY)),
        (_wsp_producer, (desc_q, desc_k, desc_v, q_smem, k_smem, v_smem, q_bar, q_empty, k_bar, v_bar, k_empty,
                         v_empty, Plan, n_m, SQ, SK, H, GROUPS, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, CAUSAL,
                         HEADS_IN_ROWS, win_left, win_right, WINDOW)),
    ], [4, 1], [CONSUMER_REGS, 24])
