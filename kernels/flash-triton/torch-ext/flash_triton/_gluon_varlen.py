"""The warp-specialized sm_90 Gluon program (`_gluon.py::attention_fwd_sm90_ws`) over packed sequences (varlen).

Why: `flash_attn_varlen_func` on the Triton program runs at the Triton program's speed, ~0.8x the Gluon program
at head dim 128 (TUNING.md step 6), so a packed prefill would lose to the same sequences run one by one through
`flash_attn_func`. Same schedule, same producer warp (`_ws_producer`), with what packed sequences need:
  - the tile's rows and keys start at `cu_seqlens_q[b]` / `cu_seqlens_k[b]` (read on the device) in the 2-D TMA
    views `[total, H*D]`; a tile past its sequence's end returns before allocating anything;
  - a tile may cross the end of its sequence (any lengths): its extra query rows are computed and never stored
    (the output is stored through a row-masked pointer store, not TMA, which would write the next sequence's
    rows); its last key block is shifted back inside the sequence (below);
  - rows that see no key (Sq > Sk, or Sk = 0) keep m = -inf and l = 0: the softmax subtracts 0 instead of -inf
    and the output divides by 1, so they come out as zeros, not NaN.
A key block that would cross the end of its sequence is loaded from Sk - BLOCK_N instead (the keys it shares with
the block before are masked), so no other sequence's keys or values enter: an inf or NaN there cannot reach this
sequence as 0·inf. Only a sequence with fewer than BLOCK_N keys reads past its end (the next sequence's first
rows, with probability exactly 0): finite values leave it exact, an inf or NaN would give NaN.
`flash_attn_func` therefore sends dense calls here only with Sk >= BLOCK_N.

Model features (`_features.py`, flash-attn's semantics), the one Gluon program that takes all of them (the dense
warp-specialized one takes sinks alone), as constexpr switches (off: the plain program compiles as before):
  - `SOFTCAP`: logits cap·tanh(scale·q·kᵀ / cap), tanh on the special-function unit (`tanh.approx.f32`, what
    flash-attn's `cutlass::fast_tanh` runs); the host then passes qk_scale = cap·log2(e). With `CAP_BOUND` (a cap
    up to `_features.CAP_BOUND_MAX`, `Config.cap_bound`) the softmax has no running max: a capped logit is at most
    the cap, so exp2 runs against a fixed reference and the accumulator is never rescaled (`_capped_softmax`);
  - `WINDOW`: key j kept for row i when i + diag - win_left <= j <= i + diag + win_right. A tile walks only the key
    blocks its rows' windows reach (from block `first`); the window mask runs only on blocks that cross a window
    edge for some row of the half;
  - `SINKS`: exp(Sinks[h]) joins each row's softmax denominator (gpt-oss), after the last block.
`P_PACK_ALU` (bf16, `Config.p_pack_alu`, not a feature: a way to compute P) rounds P to bf16 on the integer pipe
(`_gluon._p_operand`) instead of the F2FP conversion (TUNING.md step 21).
`CAP_POLY` (2, 4: `Config.cap_poly`, with `CAP_BOUND` only) computes one exp2 in that many as a polynomial on the
FMA pipes (`_exp2_poly_asm`), to take work off the special-function unit (TUNING.md step 20). With `P_PACK_ALU`
the polynomial's work replaces the conversion's on those pipes: CAP_POLY=4 with it is the default of a softcap
alone at head dims 80-128 in bf16 (`_features.softcap_switches`, TUNING.md step 22).
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    mbarrier,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from ._gluon import (
    _p_operand,
    _pv_wait,
    _sink_rescale,
    _exp2,
    _softmax_first,
    _softmax_next,
    _v_wait_early,
    _window_scores,
    _ws_buffers,
    _ws_issue,
    _ws_producer,
    key_block_start,
    tile_order,
)


@gluon.jit
def _masked_scores(s, j, full, offs_m, offs_n, diag, sk, CAUSAL: gl.constexpr, BLOCK_N: gl.constexpr):
    """Block j's scores: the causal diagonal on blocks past `full`; without it, the bound Sk on the block crossing it.
    A block crossing Sk was loaded from key Sk - BLOCK_N (`key_block_start`, when Sk >= BLOCK_N): its keys below
    j * BLOCK_N were seen by block j - 1 and are masked here."""
    lo = j * BLOCK_N
    cols = key_block_start(j, sk, BLOCK_N) + offs_n
    if CAUSAL:
        if lo >= full:  # keys past Sk lie above the diagonal of every stored row
            s = gl.where((cols[None, :] <= offs_m[:, None] + diag) & (cols[None, :] >= lo), s, float("-inf"))
    else:
        if lo + BLOCK_N > sk:
            s = gl.where((cols[None, :] < sk) & (cols[None, :] >= lo), s, float("-inf"))
    return s


@gluon.jit
def _feature_scores(s, j, full, m0, offs_m, offs_n, diag, sk, softcap_in, win_left, win_right,
                    CAUSAL: gl.constexpr, BLOCK_N: gl.constexpr, HALF_M: gl.constexpr, SOFTCAP: gl.constexpr,
                    WINDOW: gl.constexpr):
    """Block j's scores for the rows m0 ... m0 + HALF_M - 1: soft-capped (`SOFTCAP`: tanh(qk·softcap_in), before any
    -inf goes in), masked as `_masked_scores`, then (`WINDOW`) the window's edges on a block that crosses one."""
    if SOFTCAP:
        s = gl.inline_asm_elementwise("tanh.approx.f32 $0, $1;", "=f,f", [s * softcap_in], dtype=gl.float32,
                                      is_pure=True, pack=1)
    s = _masked_scores(s, j, full, offs_m, offs_n, diag, sk, CAUSAL, BLOCK_N)
    if WINDOW:
        s = _window_scores(s, j * BLOCK_N, key_block_start(j, sk, BLOCK_N), m0, offs_m, offs_n, diag, win_left,
                           win_right, HALF_M, BLOCK_N)
    return s




@gluon.jit
def _capped_softmax(s, l_i, qk_scale, m_ref, dtype: gl.constexpr, p_layout: gl.constexpr, ALU_PACK: gl.constexpr,
                    CAP_POLY: gl.constexpr):
    """`CAP_BOUND`: soft-capped scores lie in [-qk_scale, qk_scale] (base 2), so exp2 needs no running max: p =
    exp2(s·qk_scale - m_ref) against a fixed reference, and the accumulator is never rescaled (no row max, no
    alpha: fewer FMA-pipe instructions per score than the plain softmax, TUNING.md step 19). `CAP_POLY` = N (2, 4):
    one exponential in N on the FMA pipes (`_exp2_poly_asm`), since tanh and exp2 both queue on the special-function
    unit here (TUNING.md step 20); `ALU_PACK` as `_gluon._p_operand`."""
    p = _exp2(s * qk_scale - m_ref, CAP_POLY)
    return _p_operand(p, dtype, p_layout, ALU_PACK), l_i + gl.sum(p, axis=1)


@gluon.jit
def _varlen_consumer(O, stride_os, q_tile, k_smem, v_smem, q_bar, k_bar, v_bar, k_empty, v_empty, qk_scale,
                     o_row, o_col, m0, sq, sk, first, n_blocks, Sinks, h, softcap_in, win_left, win_right,
                     HEAD_DIM: gl.constexpr, HALF_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                     CAUSAL: gl.constexpr, HEAD_DIM_VALID: gl.constexpr, JOINT_RELEASE: gl.constexpr,
                     SOFTCAP: gl.constexpr, WINDOW: gl.constexpr, SINKS: gl.constexpr, CAP_BOUND: gl.constexpr,
                     P_PACK_ALU: gl.constexpr, CAP_POLY: gl.constexpr, V_WAIT_EARLY: gl.constexpr = False):
    """64 rows (m0 ... of this sequence), one warpgroup: `_gluon._ws_consumer` with varlen masks and stores; only
    the first HEAD_DIM_VALID columns are stored (a head dim of 80 or 96 computed on zero-padded 128-wide tiles).
    The walk's block i is key block `first` + i (stages and phases count i); the model features as the module says.
    `V_WAIT_EARLY`: each block's values waited for at the end of its softmax (`_gluon._v_wait_early`)."""
    dtype: gl.constexpr = q_tile.dtype
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, HEAD_DIM, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    rows_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    diag = sk - sq
    if CAUSAL:
        full = gl.maximum(gl.minimum(m0 + diag + 1, sk), 0) // BLOCK_N * BLOCK_N
    else:
        full = sk // BLOCK_N * BLOCK_N
    offs_m = m0 + gl.arange(0, HALF_M, layout=gl.SliceLayout(1, s_layout))
    offs_n = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    zero_s = gl.zeros([HALF_M, BLOCK_N], gl.float32, s_layout)

    mbarrier.wait(q_bar, 0)
    mbarrier.wait(k_bar.index(0), 0)
    s = warpgroup_mma(q_tile, k_smem.index(0).permute((1, 0)), zero_s, use_acc=False, is_async=True)
    s = warpgroup_mma_wait(0, deps=[s])
    if not JOINT_RELEASE:
        mbarrier.arrive(k_empty.index(0), count=1)  # this warpgroup is done with block 0's keys
    s = _feature_scores(s, first, full, m0, offs_m, offs_n, diag, sk, softcap_in, win_left, win_right, CAUSAL,
                        BLOCK_N, HALF_M, SOFTCAP, WINDOW)
    if CAP_BOUND:  # the reference: the cap less 30 (natural units) above a cap of 30, else 0 (`_features.CAP_BOUND_MAX`)
        m_ref = gl.maximum(qk_scale - 43.28085122666891, 0.0)
        m_i = gl.zeros([HALF_M], gl.float32, gl.SliceLayout(1, s_layout)) + m_ref
        p_op, l_i = _capped_softmax(s, gl.zeros([HALF_M], gl.float32, gl.SliceLayout(1, s_layout)), qk_scale, m_ref,
                                    dtype, p_layout, P_PACK_ALU, CAP_POLY)
    else:
        p_op, m_i, l_i = _softmax_first(s, qk_scale, dtype, p_layout, True, P_PACK_ALU)  # rows may see no key
    if V_WAIT_EARLY:
        _v_wait_early(v_bar, 0, STAGES)
    acc = gl.zeros([HALF_M, HEAD_DIM], gl.float32, o_layout)

    for j in range(1, n_blocks):
        s, acc, prev = _ws_issue(j, q_tile, k_smem, v_smem, k_bar, v_bar, k_empty, zero_s, p_op, acc, STAGES,
                                 JOINT_RELEASE, V_WAIT_EARLY=V_WAIT_EARLY)  # the dense program's block start
        # (`_gluon._ws_step`)
        s = _feature_scores(s, first + j, full, m0, offs_m, offs_n, diag, sk, softcap_in, win_left, win_right,
                            CAUSAL, BLOCK_N, HALF_M, SOFTCAP, WINDOW)
        if CAP_BOUND:
            p_op, l_i = _capped_softmax(s, l_i, qk_scale, m_ref, dtype, p_layout, P_PACK_ALU, CAP_POLY)
        else:
            p_op, m_i, l_i, alpha = _softmax_next(s, m_i, l_i, qk_scale, dtype, p_layout, True, P_PACK_ALU)
        acc = _pv_wait(acc, v_bar, j, STAGES, V_WAIT_EARLY)
        mbarrier.arrive(v_empty.index(prev), count=1)  # this warpgroup is done with block j-1's values
        if not CAP_BOUND:
            acc = acc * gl.convert_layout(alpha, rows_o)[:, None]

    last = (n_blocks - 1) % STAGES
    if not V_WAIT_EARLY:  # (with it, waited for at the end of the last block's softmax)
        mbarrier.wait(v_bar.index(last), ((n_blocks - 1) // STAGES) & 1)
    acc = warpgroup_mma(p_op, v_smem.index(last), acc, is_async=True)
    acc = warpgroup_mma_wait(0, deps=[acc])
    if SINKS:  # the sink's logit (unscaled, natural units) joins the denominator; a row that saw no key stays 0
        acc, l_i = _sink_rescale(acc, m_i, l_i, gl.load(Sinks + h).to(gl.float32) * 1.4426950408889634, rows_o)
    l_o = gl.convert_layout(l_i, rows_o)
    out = (acc / gl.where(l_o == 0.0, 1.0, l_o)[:, None]).to(dtype)
    rows = m0 + gl.arange(0, HALF_M, layout=rows_o)  # within the sequence
    cols = o_col + gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, o_layout))
    ptrs = O + (o_row + rows).to(gl.int64)[:, None] * stride_os + cols[None, :]
    if HEAD_DIM_VALID == HEAD_DIM:
        gl.store(ptrs, out, mask=(rows < sq)[:, None])
    else:
        gl.store(ptrs, out, mask=(rows < sq)[:, None] & (cols - o_col < HEAD_DIM_VALID)[None, :])


@gluon.jit
def attention_fwd_sm90_ws_varlen(desc_q, desc_k, desc_v, O, stride_os, qk_scale, H, GROUPS, CuSeqQ, CuSeqK, SQ, SK,
                                 Sinks, softcap_in, win_left, win_right, L2_HEADS,
                                 HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                                 STAGES: gl.constexpr, CAUSAL: gl.constexpr, num_warps: gl.constexpr,
                                 DENSE: gl.constexpr = False, HEADS_IN_ROWS: gl.constexpr = False,
                                 HEAD_DIM_VALID: gl.constexpr = 0, JOINT_RELEASE: gl.constexpr = False,
                                 SOFTCAP: gl.constexpr = False, WINDOW: gl.constexpr = False,
                                 SINKS: gl.constexpr = False, CAP_BOUND: gl.constexpr = False,
                                 P_PACK_ALU: gl.constexpr = False, CAP_POLY: gl.constexpr = 0,
                                 LPT: gl.constexpr = False, V_WAIT_EARLY: gl.constexpr = False):
    """grid = (cdiv(max_seqlen_q, BLOCK_M), B * H); BLOCK_M = 128, num_warps = 4 (as `attention_fwd_sm90_ws`). `LPT`
    (`DENSE` only): grid (cdiv(SQ, BLOCK_M) * B * H,) in `_gluon.tile_order`'s order, L2_HEADS heads a section.
    desc_q/desc_k/desc_v are 2-D TMA views `[total, H*D]` (q tiles of 64 rows); O is `[total_q, H*D]` contiguous.

    `DENSE`: every sequence has SQ queries and SK keys (a `flash_attn_func` call whose lengths are not multiples of
    the tile: the dense Gluon program's TMA store would cross a sequence end); CuSeqQ/CuSeqK are not read. The views
    are then `[B*S, H*D]` or, with `HEADS_IN_ROWS`, `[B*H*S, D]` (`[B, S, H, D]` views of contiguous `[B, H, S, D]`
    tensors, a head's rows consecutive; O likewise, stride_os = D).
    Packed (not `DENSE`) with `HEADS_IN_ROWS`: q, k, v are `[total, H, D]` views of contiguous `[H, total, D]` tensors
    (what transformers' continuous batching passes), read as `[H*total, D]`; SQ and SK are then the packed totals of
    q and k rows (a head's first row); O is still `[total_q, H*D]` contiguous.
    `HEAD_DIM_VALID` (0: HEAD_DIM): the real head dim when HEAD_DIM is its power-of-two padding (80, 96 -> 128, views
    `[B*H*S, D]` / `[H*total, D]` only: TMA zero-fills the columns past D, the store keeps the first D). `JOINT_RELEASE`: as in `attention_fwd_sm90_ws`.
    `SOFTCAP` (softcap_in = scale / cap, qk_scale = cap·log2(e)), `WINDOW` (win_left, win_right: a bound past every
    key for an unbounded side), `SINKS` (Sinks `[H]`, any float dtype): the module docstring. `V_WAIT_EARLY`: as
    `_varlen_consumer` (`Config.v_wait_early`)."""
    D_VALID: gl.constexpr = HEAD_DIM if HEAD_DIM_VALID == 0 else HEAD_DIM_VALID
    HALF_M: gl.constexpr = 64  # rows per consumer warpgroup: BLOCK_M = 128 (two consumers) or 192 (three)
    start_m, off_bh = tile_order(gl.cdiv(SQ, BLOCK_M), L2_HEADS, CAUSAL, LPT)
    b = off_bh // H
    h = off_bh % H
    hk = h // GROUPS
    # sq, sk: this sequence's lengths; q_row, kv_row, q_col, kv_col: its first rows in the TMA views; o_row, o_col:
    # its first output row and column (O has q's layout when dense, the packed contiguous one otherwise)
    if DENSE:
        sq = SQ
        sk = SK
        if HEADS_IN_ROWS:
            q_row = off_bh * SQ
            kv_row = (b * (H // GROUPS) + hk) * SK
            q_col = 0
            kv_col = 0
            o_col = 0
        else:
            q_row = b * SQ
            kv_row = b * SK
            q_col = h * HEAD_DIM
            kv_col = hk * HEAD_DIM
            o_col = q_col
        o_row = q_row
    else:
        o_row = gl.load(CuSeqQ + b)
        sq = gl.load(CuSeqQ + b + 1) - o_row
        kv_row = gl.load(CuSeqK + b)
        sk = gl.load(CuSeqK + b + 1) - kv_row
        o_col = h * D_VALID  # O is [total_q, H*D] contiguous with the real head dim
        if HEADS_IN_ROWS:
            q_row = h * SQ + o_row
            kv_row = hk * SK + kv_row
            q_col = 0
            kv_col = 0
        else:
            q_row = o_row
            q_col = o_col
            kv_col = hk * HEAD_DIM
    m0 = start_m * BLOCK_M
    if m0 < sq:
        if CAUSAL:
            end = gl.minimum(m0 + BLOCK_M + sk - sq, sk)
        else:
            end = sk
        if WINDOW:  # the blocks from the first row's window start to the last row's window end
            end = gl.minimum(end, gl.maximum(m0 + BLOCK_M + sk - sq + win_right, 0))
            first = gl.maximum(m0 + sk - sq - win_left, 0) // BLOCK_N
        else:
            first = 0
        n_blocks = gl.maximum(gl.cdiv(end, BLOCK_N) - first, 1)  # >= 1: a tile whose rows see no key runs (zeros)
        CONSUMERS: gl.constexpr = BLOCK_M // HALF_M
        q_smem, k_smem, v_smem, q_bar, k_bar, v_bar, k_empty, v_empty = _ws_buffers(
            desc_q, desc_k, desc_v, HALF_M, HEAD_DIM, BLOCK_N, STAGES, JOINT_RELEASE, CONSUMERS)
        if CONSUMERS == 3:  # FlashAttention-3/4's head-dim-64 tile: 192 rows, three consumers
            THREE_REGS: gl.constexpr = 160
            gl.warp_specialize([
                (_varlen_consumer, (O, stride_os, q_smem.index(0), k_smem, v_smem, q_bar, k_bar, v_bar, k_empty,
                                    v_empty, qk_scale, o_row, o_col, m0, sq, sk, first, n_blocks, Sinks, h,
                                    softcap_in, win_left, win_right, HEAD_DIM, HALF_M, BLOCK_N, STAGES, CAUSAL,
                                    D_VALID, JOINT_RELEASE, SOFTCAP, WINDOW, SINKS, CAP_BOUND, P_PACK_ALU,
                                    CAP_POLY, V_WAIT_EARLY)),
                (_varlen_consumer, (O, stride_os, q_smem.index(1), k_smem, v_smem, q_bar, k_bar, v_bar, k_empty,
                                    v_empty, qk_scale, o_row, o_col, m0 + HALF_M, sq, sk, first, n_blocks, Sinks, h,
                                    softcap_in, win_left, win_right, HEAD_DIM, HALF_M, BLOCK_N, STAGES, CAUSAL,
                                    D_VALID, JOINT_RELEASE, SOFTCAP, WINDOW, SINKS, CAP_BOUND, P_PACK_ALU,
                                    CAP_POLY, V_WAIT_EARLY)),
                (_varlen_consumer, (O, stride_os, q_smem.index(2), k_smem, v_smem, q_bar, k_bar, v_bar, k_empty,
                                    v_empty, qk_scale, o_row, o_col, m0 + 2 * HALF_M, sq, sk, first, n_blocks, Sinks, h,
                                    softcap_in, win_left, win_right, HEAD_DIM, HALF_M, BLOCK_N, STAGES, CAUSAL,
                                    D_VALID, JOINT_RELEASE, SOFTCAP, WINDOW, SINKS, CAP_BOUND, P_PACK_ALU,
                                    CAP_POLY, V_WAIT_EARLY)),
                (_ws_producer, (desc_q, desc_k, desc_v, q_smem, k_smem, v_smem, q_bar, k_bar, v_bar, k_empty, v_empty,
                                q_row + m0, kv_row, q_col, kv_col, first, n_blocks, sk, HALF_M, BLOCK_N, STAGES,
                                CONSUMERS)),
            ], [4, 4, 1], [THREE_REGS, THREE_REGS, 24])
        else:
            CONSUMER_REGS: gl.constexpr = 232
            gl.warp_specialize([
                (_varlen_consumer, (O, stride_os, q_smem.index(0), k_smem, v_smem, q_bar, k_bar, v_bar, k_empty,
                                    v_empty, qk_scale, o_row, o_col, m0, sq, sk, first, n_blocks, Sinks, h,
                                    softcap_in, win_left, win_right, HEAD_DIM, HALF_M, BLOCK_N, STAGES, CAUSAL,
                                    D_VALID, JOINT_RELEASE, SOFTCAP, WINDOW, SINKS, CAP_BOUND, P_PACK_ALU,
                                    CAP_POLY, V_WAIT_EARLY)),
                (_varlen_consumer, (O, stride_os, q_smem.index(1), k_smem, v_smem, q_bar, k_bar, v_bar, k_empty,
                                    v_empty, qk_scale, o_row, o_col, m0 + HALF_M, sq, sk, first, n_blocks, Sinks, h,
                                    softcap_in, win_left, win_right, HEAD_DIM, HALF_M, BLOCK_N, STAGES, CAUSAL,
                                    D_VALID, JOINT_RELEASE, SOFTCAP, WINDOW, SINKS, CAP_BOUND, P_PACK_ALU,
                                    CAP_POLY, V_WAIT_EARLY)),
                (_ws_producer, (desc_q, desc_k, desc_v, q_smem, k_smem, v_smem, q_bar, k_bar, v_bar, k_empty, v_empty,
                                q_row + m0, kv_row, q_col, kv_col, first, n_blocks, sk, HALF_M, BLOCK_N, STAGES,
                                CONSUMERS)),
            ], [4, 1], [CONSUMER_REGS, 24])
