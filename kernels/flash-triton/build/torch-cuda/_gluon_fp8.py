"""FP8 prefill on Hopper in Gluon: `_fp8.py`'s arithmetic on `_gluon.py`'s warp-specialized schedule (FlashAttention-3).

Why: the Triton FP8 program (`_fp8.attention_fwd_fp8`) reaches only 0.95-1.15x the bf16 kernel on an H100, because the
Triton compiler waits on each wgmma where its result is used and never overlaps the softmax with a matmul; at FP8's
doubled tensor-core rate the exponentials are an even larger share of a key block's time than in bf16. This is
`_gluon.attention_fwd_sm90_ws` with e4m3 operands: one producer warp loads Q, K and Vᵀ by TMA into a ring of
`STAGES` shared buffers, two consumer warpgroups of 64 rows each issue S_j = Q·Kⱼᵀ and P_{j-1}·V_{j-1} back to back
and run the softmax of block j while P_{j-1}·V_{j-1} is still on the tensor cores.

The numerics are `_fp8.py`'s, exactly: the query and key descales folded into the logit scale (softmax scale x log2(e)
x q_descale[b, hkv] x k_descale[b, hkv]), P quantized to e4m3 with no scale (it is in [0, 1] after the running max is
subtracted; the conversion rounds to nearest even), the row sums l from P before quantization, fp32 accumulation, and
the value descale applied once at the end (out = acc x v_descale / l).

What FP8 changes against the bf16 program:
- sm_90's FP8 wgmma takes only K-major operands. QKᵀ: Q `[64, D]` and K `[BLOCK_N, D]` have D (the reduction) contiguous,
  as in bf16. P·V: the reduction runs over the keys, so V is read as Vᵀ with the keys contiguous: a `[B, Hkv, D, Sk]`
  contiguous tensor seen as the 2-D view `[B*Hkv*D, Sk]`, tiles `[D, BLOCK_N]` (`vt_desc`), permuted to `[BLOCK_N, D]`
  in shared memory. `permuted_vt` writes it once per call from v in any layout (the pass `_fp8.v_keys_contiguous`
  makes for the Triton program).
- P is an 8-bit register A operand: its DotOperandLayout packs 4 elements per 32 bits (k_width 4; bf16 packs 2), and
  the wgmma's K step is 32 (instr_shape [16, N, 32]): BLOCK_N 128 is 4 steps of P·V. The QKᵀ accumulator holds
  other columns per thread than that operand wants; instead of shuffling P between lanes each block, the keys of P
  and of Vᵀ are put in the same permuted order within each 32 (`p_operand_keys`, `_transpose_keys_permuted`; a sum
  over keys does not care about their order), which makes the layout change a renaming of registers.
- The output is bf16/fp16 while Q is e4m3, so O is staged in its own shared buffer (the bf16 program reuses Q's).

Scope, checked by `gluon_fp8_supported` (the bf16 program's `gluon_unsupported` rules): sm_90, e4m3 q/k/v, head dim
64 or 128, Sq a multiple of BLOCK_M, Sk of BLOCK_N, causal only with Sq <= Sk (every row sees key 0; no tile crosses a
sequence end of a TMA view), q and k both `[B, S, H, D]`-contiguous or both views of contiguous `[B, H, S, D]`
(`_checks.tma_layout`); the output is a contiguous `[B, Sq, Hq, D]`. Everything else takes the Triton program.
"""

from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl
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

from ._checks import descale_strides, tma_layout
from ._config import INTERPRETED, l2_heads
from ._gluon import (_pass_turn, _pv_wait, _scores, _softmax_first, _softmax_next, _take_turn, _tma_fill, _tma_load,
                     _tma_store, _turns, _v_wait_early, _ws_first_scores, tile_order, tma_desc)

BLOCK_M = 128  # two consumer warpgroups of 64 rows
BLOCK_N = 128  # a multiple of 32 (the K step of an 8-bit wgmma) for P·V; N = 128 for QKᵀ
STAGES = 3  # 32 KiB of K and Vᵀ a stage at head dim 128: 3 stages + Q + O staging = 144 KiB of 227
HEAD_DIMS = (64, 128)
_LOG2E = math.log2(math.e)


@functools.cache
def _fp8_layout(rows: int, cols: int):
    """The shared-memory layout of an e4m3 `[rows, cols]` TMA tile (128-byte swizzle for 128 columns, 64 for 64)."""
    return gl.NVMMASharedLayout.get_default_for([rows, cols], gl.float8e4nv)


def fp8_desc(t: torch.Tensor, block: int, heads_in_rows: bool) -> TensorDescriptor:
    """An e4m3 `[B, S, H, D]` tensor as `_gluon.tma_desc`'s 2-D views: `[B*S, H*D]` (contiguous; a head is a column
    block) or, `heads_in_rows`, `[B*H*S, D]` (a view of a contiguous `[B, H, S, D]`); tiles `[block, D]`."""
    b, s, h, d = t.shape
    layout = _fp8_layout(block, d)
    if heads_in_rows:
        return TensorDescriptor(t, [b * h * s, d], [d, 1], [block, d], layout)
    return TensorDescriptor(t, [b * s, h * d], [h * d, 1], [block, d], layout)


@triton.jit
def _transpose_keys_permuted(V, VT, stride_vb, stride_vs, stride_vh, stride_vd, S, H, HEAD_DIM: tl.constexpr,
                             BLOCK_S: tl.constexpr):
    """grid = (S / BLOCK_S, B * H): v `[B, S, H, D]` (any strides: D or the keys contiguous) into vt `[B, H, D, S]`
    contiguous with the keys of each 32-key group in `p_operand_keys` order: key 16h + 8g + 2c + e goes to position
    16h + 4c + 2g + e (h, g, e < 2; c < 4). P then enters the P·V wgmma straight from the QKᵀ accumulator's registers."""
    s0 = tl.program_id(0) * BLOCK_S
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    offs_s = s0 + tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, HEAD_DIM)
    tile = tl.load(V + b.to(tl.int64) * stride_vb + h * stride_vh + offs_d[:, None] * stride_vd
                   + offs_s.to(tl.int64)[None, :] * stride_vs)
    tile = tl.reshape(tl.permute(tl.reshape(tile, [HEAD_DIM, BLOCK_S // 32, 2, 2, 4, 2]), (0, 1, 2, 4, 3, 5)),
                      [HEAD_DIM, BLOCK_S])
    tl.store(VT + bh.to(tl.int64) * HEAD_DIM * S + offs_d[:, None] * S + offs_s[None, :], tile)


def permuted_vt(v: torch.Tensor) -> torch.Tensor:
    """v `[B, S, H, D]` e4m3 (S a multiple of 128) as the `[B, H, D, S]` Vᵀ `vt_desc` reads: the keys contiguous (the
    K-major B operand) and permuted within each group of 32 (`_transpose_keys_permuted`). One read and one write of v
    per call, the pass `_fp8.v_keys_contiguous` makes for the Triton program (the permutation comes free with it)."""
    b, s, h, d = v.shape
    vt = torch.empty((b, h, d, s), dtype=v.dtype, device=v.device)
    _transpose_keys_permuted[(s // 128, b * h)](v, vt, v.stride(0), v.stride(1), v.stride(2), v.stride(3), s, h,
                                                HEAD_DIM=d, BLOCK_S=128, num_warps=4)
    return vt


def permuted_vt_reference(v: torch.Tensor) -> torch.Tensor:
    """`permuted_vt` in torch (the tests' oracle of the key order)."""
    b, s, h, d = v.shape
    vt = v.permute(0, 2, 3, 1).reshape(b, h, d, s // 32, 2, 2, 4, 2)
    return vt.permute(0, 1, 2, 3, 4, 6, 5, 7).reshape(b, h, d, s)


def vt_desc(vt: torch.Tensor, block_n: int) -> TensorDescriptor:
    """Vᵀ tiles `[D, block_n]` (the keys contiguous: the K-major B operand of P·V) over the 2-D view `[B*H*D, S]` of
    the contiguous `[B, H, D, S]` tensor `permuted_vt` makes: the D rows of (batch, kv head) bh start at row bh * D."""
    b, h, d, s = vt.shape
    return TensorDescriptor(vt, [b * h * d, s], [s, 1], [d, block_n], _fp8_layout(d, block_n))


@gluon.jit
def p_operand_keys(p):
    """P `[M, N]` (e4m3, in the QKᵀ accumulator's layout) with its columns reordered so that the 8-bit A operand of
    the P·V wgmma holds, register for register, what the accumulator holds: no shuffle. A thread of the accumulator
    has keys {2c, 2c+1, 8+2c, 9+2c, 16+2c, ...} (c its lane mod 4) of each 32, the A operand wants positions {4c ...
    4c+3, 16+4c ... 16+4c+3}; so position 16h + 4c + 2g + e takes key 16h + 8g + 2c + e, and Vᵀ's keys are stored
    in the same order (`_transpose_keys_permuted`). (Without it, `convert_layout` to the k_width-4 layout cost 16
    SHFL and ~100 PRMT per key block and thread.)"""
    M: gl.constexpr = p.shape[0]
    N: gl.constexpr = p.shape[1]
    p = gl.reshape(p, [M, N // 32, 2, 2, 4, 2])  # key = 32 chunk + 16 h + 8 g + 2 c + e
    p = gl.permute(p, (0, 1, 2, 4, 3, 5))  # position = 32 chunk + 16 h + 4 c + 2 g + e
    return gl.reshape(p, [M, N])


@gluon.jit
def _p_fp8(p, p_layout: gl.constexpr):
    """fp32 P (the accumulator's layout) as the e4m3 A operand of P·V: its keys reordered (`p_operand_keys`, no data
    movement), then each operand register's four probabilities rounded to e4m3 and packed by two `cvt.rn.satfinite
    .e4m3x2` (what `p.to(float8e4nv)` does per pair, round to nearest even; P <= 1 never saturates). Converted
    after the reordering, the four values of a register are consecutive elements, so nothing is unpacked and
    repacked byte by byte, as when the cast comes first."""
    p = gl.convert_layout(p_operand_keys(p), p_layout)
    return gl.inline_asm_elementwise(
        "{ .reg .b16 lo, hi; cvt.rn.satfinite.e4m3x2.f32 lo, $2, $1; cvt.rn.satfinite.e4m3x2.f32 hi, $4, $3; "
        "mov.b32 $0, {lo, hi}; }", "=r,r,r,r,r", [p], dtype=gl.float8e4nv, is_pure=True, pack=4)


@gluon.jit
def _fp8_producer(desc_q, desc_k, desc_vt, q_smem, k_smem, vt_smem, q_bar, k_bar, v_bar, k_empty, v_empty,
                  q_row, q_col, kv_row, kv_col, vt_row, n_blocks,
                  HALF_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr):
    """One warp: both 64-row slices of the Q tile, then key block j's K tile (rows kv_row + j * BLOCK_N) and Vᵀ tile
    (columns j * BLOCK_N of rows vt_row ...) into stage j % STAGES, each refilled as soon as both consumers released
    that stage's previous block (`k_empty` after their QKᵀ, `v_empty` after their P·V, as `_gluon._ws_producer`)."""
    mbarrier.expect(q_bar, 2 * desc_q.block_type.nbytes)
    _tma_load(desc_q, [q_row, q_col], q_bar, q_smem.index(0))
    _tma_load(desc_q, [q_row + HALF_M, q_col], q_bar, q_smem.index(1))
    for j in range(n_blocks):
        slot = j % STAGES
        phase = ((j // STAGES) + 1) & 1  # the phase that block j - STAGES's release completed
        if j >= STAGES:
            mbarrier.wait(k_empty.index(slot), phase)
        _tma_fill(desc_k, k_bar.index(slot), k_smem.index(slot), kv_row + j * BLOCK_N, kv_col)
        if j >= STAGES:
            mbarrier.wait(v_empty.index(slot), phase)
        _tma_fill(desc_vt, v_bar.index(slot), vt_smem.index(slot), vt_row, j * BLOCK_N)


@gluon.jit
def _fp8_consumer(desc_o, o_tile, q_tile, k_smem, vt_smem, q_bar, k_bar, v_bar, k_empty, v_empty, qk_scale, v_descale,
                  o_row, o_col, m0, diag, n_blocks,
                  HEAD_DIM: gl.constexpr, HALF_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                  CAUSAL: gl.constexpr, EXP_POLY: gl.constexpr = 0, turn=None, PINGPONG: gl.constexpr = False,
                  SECOND: gl.constexpr = False, V_WAIT_EARLY: gl.constexpr = False):
    """64 rows of the tile (rows m0 ...), one warpgroup: `_gluon._ws_consumer`'s schedule with e4m3 operands.
    `EXP_POLY`: one score exponential in that many (2, 4) on the FMA pipes (`_gluon._exp2`): with FP8 matmuls twice
    as fast, the special-function unit's 16,384 exponentials per 128x128 block take as long as both products. The
    softmax (`_softmax_first/_softmax_next`, l_i summing the fp32 probabilities) leaves P in fp32 in the accumulator's
    layout; it crosses the loop's back edge so, and is rounded to the e4m3 A operand (`_p_fp8`) right after S_j is
    issued, under that matmul. (Carried as e4m3, its 64 bytes crossed the back edge one byte a register and were
    repacked with ~130 PRMT a key block.) Vᵀ's stage is permuted to the `[BLOCK_N, D]` B operand with the keys (the
    reduction) contiguous. The output, acc x v_descale / l, goes out through this half's O buffer by TMA.
    `PINGPONG`: the two consumers issue each key block's matmuls in turns, as `_gluon._ws_issue` (the `SECOND` hands
    the first its first turn). `V_WAIT_EARLY`: each block's values waited for at the end of its softmax
    (`_gluon._v_wait_early`: the exponentials then stay under P_{j-1}·V_{j-1} in the machine code)."""
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 32])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, HEAD_DIM, 32])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=4)  # 4 x 8 bits per 32
    rows_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    if PINGPONG and SECOND:
        _pass_turn(turn, True)
    s, full, offs_m, offs_n, zero_s = _ws_first_scores(q_tile, k_smem, q_bar, k_bar, m0, diag, n_blocks, s_layout,
                                                       HALF_M, BLOCK_N, CAUSAL)
    mbarrier.arrive(k_empty.index(0), count=1)
    s = _scores(s, 0, full, offs_m, offs_n, diag, CAUSAL, BLOCK_N)
    p, m_i, l_i = _softmax_first(s, qk_scale, gl.float32, s_layout, POLY=EXP_POLY)  # fp32 P, still in the accumulator's layout
    if V_WAIT_EARLY:
        _v_wait_early(v_bar, 0, STAGES)
    acc = gl.zeros([HALF_M, HEAD_DIM], gl.float32, o_layout)

    for j in range(1, n_blocks):
        cur = j % STAGES
        before = (j - 1) % STAGES
        mbarrier.wait(k_bar.index(cur), (j // STAGES) & 1)
        if PINGPONG:
            _take_turn(turn, (j - 1) & 1, SECOND)
        s = warpgroup_mma(q_tile, k_smem.index(cur).permute((1, 0)), zero_s, use_acc=False, is_async=True)
        if not V_WAIT_EARLY:
            mbarrier.wait(v_bar.index(before), ((j - 1) // STAGES) & 1)
        p_op = _p_fp8(p, p_layout)  # under S_j on the tensor cores
        acc = warpgroup_mma(p_op, vt_smem.index(before).permute((1, 0)), acc, is_async=True)
        if PINGPONG:
            _pass_turn(turn, SECOND)
        s = warpgroup_mma_wait(1, deps=[s])  # S_j done; P_{j-1} V_{j-1} still runs under this softmax
        mbarrier.arrive(k_empty.index(cur), count=1)
        s = _scores(s, j, full, offs_m, offs_n, diag, CAUSAL, BLOCK_N)
        p, m_i, l_i, alpha = _softmax_next(s, m_i, l_i, qk_scale, gl.float32, s_layout, POLY=EXP_POLY)
        acc = _pv_wait(acc, v_bar, j, STAGES, V_WAIT_EARLY)
        mbarrier.arrive(v_empty.index(before), count=1)
        acc = acc * gl.convert_layout(alpha, rows_o)[:, None]

    final = (n_blocks - 1) % STAGES
    if not V_WAIT_EARLY:  # (with it, waited for at the end of the last block's softmax)
        mbarrier.wait(v_bar.index(final), ((n_blocks - 1) // STAGES) & 1)
    acc = warpgroup_mma(_p_fp8(p, p_layout), vt_smem.index(final).permute((1, 0)), acc, is_async=True)
    acc = warpgroup_mma_wait(0, deps=[acc])
    out = acc * gl.convert_layout(v_descale / l_i, rows_o)[:, None]  # every row saw a key: l_i > 0
    o_tile.store(out.to(o_tile.dtype))
    fence_async_shared()
    _tma_store(desc_o, [o_row, o_col], o_tile)
    tma.store_wait(0)


@gluon.jit
def _ring_barriers(n: gl.constexpr, count: gl.constexpr):
    """n mbarriers (`[n, 1]`), each completing after `count` arrivals."""
    bars = gl.allocate_shared_memory(gl.int64, [n, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(n):
        mbarrier.init(bars.index(i), count=count)
    return bars


@gluon.jit
def attention_fwd_fp8_sm90_ws(desc_q, desc_k, desc_vt, desc_o, QD, KD, VD, qk_scale,
                              stride_qdb, stride_qdh, stride_kdb, stride_kdh, stride_vdb, stride_vdh,
                              H, GROUPS, SQ, SK, L2_HEADS,
                              HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                              STAGES: gl.constexpr, CAUSAL: gl.constexpr, num_warps: gl.constexpr,
                              HEADS_IN_ROWS: gl.constexpr = False, LPT: gl.constexpr = False,
                              EXP_POLY: gl.constexpr = 0, PINGPONG: gl.constexpr = False,
                              V_WAIT_EARLY: gl.constexpr = False):
    """grid = (Sq / BLOCK_M, B * H), with `LPT` (Sq / BLOCK_M * B * H,) (`_gluon.tile_order`); BLOCK_M = 128,
    num_warps = 4 (the default partition is consumer 0; consumer 1 and the producer warp are workers). desc_q (64-row
    tiles) and desc_k: `fp8_desc` (`HEADS_IN_ROWS`: the `[B*H*S, D]` views); desc_vt: `vt_desc`; desc_o: `[B*Sq, H*D]`
    of the contiguous bf16/fp16 output, 64-row tiles. qk_scale = softmax scale x log2(e); the descales are fp32 at
    D[b * stride_db + hkv * stride_dh] (strides 0: one per tensor), loaded once per program as `_fp8.py` does.
    `EXP_POLY`, `PINGPONG`, `V_WAIT_EARLY`: as `_fp8_consumer`."""
    HALF_M: gl.constexpr = BLOCK_M // 2
    start_m, off_bh = tile_order(SQ // BLOCK_M, L2_HEADS, CAUSAL, LPT)
    b = off_bh // H
    h = off_bh % H
    hk = h // GROUPS  # GQA
    bk = b * (H // GROUPS) + hk  # (batch, kv head)
    m0 = start_m * BLOCK_M
    if HEADS_IN_ROWS:
        q_row, q_col, kv_row, kv_col = (b * H + h) * SQ + m0, 0, bk * SK, 0
    else:
        q_row, q_col, kv_row, kv_col = b * SQ + m0, h * HEAD_DIM, b * SK, hk * HEAD_DIM
    scale = qk_scale * gl.load(QD + b * stride_qdb + hk * stride_qdh) * gl.load(KD + b * stride_kdb + hk * stride_kdh)
    v_descale = gl.load(VD + b * stride_vdb + hk * stride_vdh)
    diag = SK - SQ  # bottom-right causal: row i sees keys j <= i + diag
    if CAUSAL:
        n_blocks = gl.cdiv(gl.minimum(m0 + BLOCK_M + diag, SK), BLOCK_N)
    else:
        n_blocks = gl.cdiv(SK, BLOCK_N)
    # setmaxnreg: 232 for each consumer thread (S 64 + O up to 64 fp32 registers, P 16), 24 for the producer warp
    CONSUMER_REGS: gl.constexpr = 232

    fp8: gl.constexpr = desc_q.dtype
    q_smem = gl.allocate_shared_memory(fp8, [2, HALF_M, HEAD_DIM], desc_q.layout)
    k_smem = gl.allocate_shared_memory(fp8, [STAGES, BLOCK_N, HEAD_DIM], desc_k.layout)
    vt_smem = gl.allocate_shared_memory(fp8, [STAGES, HEAD_DIM, BLOCK_N], desc_vt.layout)
    o_smem = gl.allocate_shared_memory(desc_o.dtype, [2, HALF_M, HEAD_DIM], desc_o.layout)
    q_bar = _ring_barriers(1, 1).index(0)
    k_bar = _ring_barriers(STAGES, 1)  # full: one TMA transaction each
    v_bar = _ring_barriers(STAGES, 1)
    k_empty = _ring_barriers(STAGES, 2)  # empty: one arrival per consumer warpgroup
    v_empty = _ring_barriers(STAGES, 2)
    o_row = b * SQ + m0
    o_col = h * HEAD_DIM
    if PINGPONG:
        turn = _turns()
    else:
        turn = k_empty  # not read
    gl.warp_specialize([
        (_fp8_consumer, (desc_o, o_smem.index(0), q_smem.index(0), k_smem, vt_smem, q_bar, k_bar, v_bar, k_empty,
                         v_empty, scale, v_descale, o_row, o_col, m0, diag, n_blocks, HEAD_DIM, HALF_M, BLOCK_N,
                         STAGES, CAUSAL, EXP_POLY, turn, PINGPONG, False, V_WAIT_EARLY)),
        (_fp8_consumer, (desc_o, o_smem.index(1), q_smem.index(1), k_smem, vt_smem, q_bar, k_bar, v_bar, k_empty,
                         v_empty, scale, v_descale, o_row + HALF_M, o_col, m0 + HALF_M, diag, n_blocks, HEAD_DIM,
                         HALF_M, BLOCK_N, STAGES, CAUSAL, EXP_POLY, turn, PINGPONG, True, V_WAIT_EARLY)),
        (_fp8_producer, (desc_q, desc_k, desc_vt, q_smem, k_smem, vt_smem, q_bar, k_bar, v_bar, k_empty, v_empty,
                         q_row, q_col, kv_row, kv_col, bk * HEAD_DIM, n_blocks, HALF_M, BLOCK_N, STAGES)),
    ], [4, 1], [CONSUMER_REGS, 24])


def gluon_fp8_supported(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> str | None:
    """None when `attention_fwd_fp8_sm90_ws` can run these inputs (already checked by `_fp8.fp8_problem`), else why
    not (the rules of the bf16 program's `gluon_unsupported`). v's layout does not matter: the program reads the copy
    `permuted_vt` makes."""
    if not q.dtype == k.dtype == v.dtype == torch.float8_e4m3fn:
        return f"the Gluon FP8 program takes e4m3 q, k, v (got {q.dtype}, {k.dtype}, {v.dtype})"
    d = q.shape[-1]
    if d not in HEAD_DIMS:
        return f"the Gluon FP8 program is built for head dims {', '.join(map(str, HEAD_DIMS))} (got {d})"
    sq, sk = q.shape[1], k.shape[1]
    if sq % BLOCK_M or sk % BLOCK_N:
        return (f"the Gluon FP8 program needs Sq a multiple of {BLOCK_M} and Sk of {BLOCK_N} (got {sq}, {sk}): its "
                "TMA tiles never cross a sequence end")
    if causal and sq > sk:
        return f"the Gluon FP8 program needs Sq <= Sk when causal (got {sq} > {sk}): it has no rows that see no key"
    if tma_layout(q, k, k) is None:
        return ("the Gluon FP8 program reads q and k through TMA as contiguous [B, S, H, D] tensors or as [B, S, H, D] "
                "views of contiguous [B, H, S, D] ones (these have other strides or are not 16-byte aligned)")
    if q.device.type != "cuda" or INTERPRETED:
        return "the Gluon FP8 program needs a CUDA GPU (Gluon has no interpreter)"
    major, minor = torch.cuda.get_device_capability(q.device)
    if (major, minor) != (9, 0):
        return f"the Gluon FP8 program uses sm_90's FP8 wgmma (this GPU is sm_{major}{minor})"
    return None


def gluon_fp8_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, q_descale, k_descale,
                        v_descale, scale: float, causal: bool, *, stages: int = STAGES, lpt: bool = False,
                        exp_poly: int = 0, pingpong: bool = False, v_wait_early: bool = False) -> None:
    """Launch `attention_fwd_fp8_sm90_ws` (inputs that `gluon_fp8_supported` took): e4m3 q `[B, Sq, Hq, D]`, k and v
    `[B, Sk, Hkv, D]` (v as the caller passed it, D or the keys contiguous: `permuted_vt` transposes it, not
    `_fp8.v_keys_contiguous`), out a contiguous `[B, Sq, Hq, D]` bf16/fp16 tensor written in place; descales fp32
    `[B, Hkv]`, one element or None (1.0); `scale` the softmax scale. `lpt`: causal tiles in LPT order. `exp_poly`
    (0, 2, 4): `EXP_POLY`. `pingpong`: `PINGPONG`. `v_wait_early`: `V_WAIT_EARLY`."""
    b, sq, hq, d = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    heads_in_rows = tma_layout(q, k, k) == "heads"
    descales = (q_descale, k_descale, v_descale)
    one = torch.ones(1, dtype=torch.float32, device=q.device) if any(t is None for t in descales) else None
    lpt = lpt and causal
    n_m = sq // BLOCK_M
    grid = (n_m * b * hq,) if lpt else (n_m, b * hq)
    l2 = l2_heads(sk, d, q.element_size(), b * hq) if lpt else 1
    attention_fwd_fp8_sm90_ws[grid](
        fp8_desc(q, BLOCK_M // 2, heads_in_rows), fp8_desc(k, BLOCK_N, heads_in_rows),
        vt_desc(permuted_vt(v), BLOCK_N), tma_desc(out, BLOCK_M // 2, False),
        *(one if t is None else t for t in descales), scale * _LOG2E,
        *(s for t in descales for s in descale_strides(t)), hq, hq // hkv, sq, sk, l2,
        HEAD_DIM=d, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, STAGES=stages, CAUSAL=bool(causal), num_warps=4,
        HEADS_IN_ROWS=heads_in_rows, LPT=lpt, EXP_POLY=exp_poly, PINGPONG=pingpong, V_WAIT_EARLY=v_wait_early)


__all__ = ["attention_fwd_fp8_sm90_ws", "gluon_fp8_attention", "gluon_fp8_supported", "permuted_vt"]
