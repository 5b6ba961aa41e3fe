"""The decode program: attention of a few new queries over a KV cache, split along the keys ("flash-decoding").

Why a second Triton program: at decode a sequence has Sq = 1 (or a handful, when appending or speculating) and
thousands of keys. The prefill program (`_kernel.py`) gives one CTA per (batch, query head, 64 query rows): at
batch 1 that is 32 CTAs on 132 SMs, each walking the whole cache for one mostly-empty query tile, and the GQA
group's query heads each read the same K/V again. Here:
  - the query rows of one KV head's whole GQA group (Sq × Hq/Hkv rows, ordered (query, head)) form one M tile, so
    every K/V byte is read once per step (`BLOCK_M` ≥ 16 for the tensor cores; the rows past Sq·G are padding);
  - the key range is split across `num_splits` CTAs (grid: splits × B·Hkv × M tiles), each folding its keys into
    a partial (m, l, acc) with the online softmax; the partials are merged by log-sum-exp. With `FUSED_REDUCE` the
    last CTA of a (b, kv head, M tile) to finish merges them (an atomic counter per tile says which CTA is last;
    it puts the counter back to 0 for the next call), so one call is one launch; otherwise `kvcache_reduce` merges
    them in a second launch;
  - the number of splits and the split length come from shapes only (the cache capacity), never from
    `cache_seqlens` on the host: a split past a sequence's end does no work and is not merged. Nothing here syncs
    with the host, so a step can be captured in a CUDA graph.
The cache is dense (`[B_cache, S_cache, Hkv, D]`, row b of the batch at `cache_batch_idx[b]`) or paged
(`[num_blocks, PAGE_SIZE, Hkv, D]`): key position p of sequence b lives at row `p % PAGE_SIZE` of block
`block_table[b, p // PAGE_SIZE]`, translated row by row, so any page size works and a tile may span pages.

New keys/values (`APPEND`, the `k`/`v` of `flash_attn_with_kvcache`) sit at positions `cache_seqlens[b] + i`: the
attention reads them from `K_new`/`V_new`, and the CTA whose split holds a position writes it into the cache (M tile
0 only), so no CTA reads a cache row another one writes. Causal is bottom-right: query i sees keys
j <= i + L - Sq with L = cache_seqlens + Snew. A sequence with cache_seqlens < 0 (transformers pads its decode
batches that way) has no keys and appends nothing; positions past the cache capacity are neither written nor read.
Softmax in base 2 (log2(e) folded into `qk_scale`), as in `_kernel.py`; LSE out in natural log, +inf for a row
that saw no key (flash-attn's convention), whose output is 0.

An FP8 cache (`DESCALE`: e4m3 or e5m2 K/V, fp16/bf16 queries and output) moves half the bytes of the stream. Each
tile is widened to the query's dtype in registers and the dot products run as for a 16-bit cache; the descales of
flash-attn's convention (one fp32 per (sequence, kv head), or one per tensor as stride-0 broadcasts) are folded in
once per CTA: the key descale into the logit scale (QKᵀ·dk·scale), the value descale into the accumulator after the
loop (P·V is linear in V). Appended keys/values are quantized on the way into the cache (x / descale, saturated to
the format's largest finite value) and attended in that quantized form, as a later step reads them.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _kv_rows(Cache, Table, b, cb, hk, pos, stride_cb, stride_cs, stride_ch, stride_bt, PAGE_SIZE: tl.constexpr,
             mask):
    """Pointers to the cache rows of key positions `pos` (`[BLOCK_N]`) of sequence b, kv head hk."""
    if PAGE_SIZE > 0:
        page = tl.load(Table + b.to(tl.int64) * stride_bt + pos // PAGE_SIZE, mask=mask, other=0)
        row = page.to(tl.int64) * stride_cb + (pos % PAGE_SIZE).to(tl.int64) * stride_cs
    else:
        row = cb.to(tl.int64) * stride_cb + pos.to(tl.int64) * stride_cs
    return Cache + row + hk.to(tl.int64) * stride_ch


@triton.jit
def _tile_pages(Table, b, start, limit, stride_bt, PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr):
    """The block-table entries of the key tile at `start` (a multiple of BLOCK_N): one entry when pages hold whole
    tiles (PAGE_SIZE a multiple of BLOCK_N), one per row otherwise, nothing for a dense cache. The main loop loads
    them one tile ahead and carries them, so the tile's K/V loads do not wait on an in-loop load and Triton's
    pipeliner keeps `num_stages` of them in flight (loaded in the same iteration, they got one)."""
    if PAGE_SIZE == 0:
        return 0
    elif PAGE_SIZE >= BLOCK_N and PAGE_SIZE % BLOCK_N == 0:
        return tl.load(Table + b.to(tl.int64) * stride_bt + start // PAGE_SIZE, mask=start < limit, other=0)
    else:
        pos = start + tl.arange(0, BLOCK_N)
        return tl.load(Table + b.to(tl.int64) * stride_bt + pos // PAGE_SIZE, mask=pos < limit, other=0)


@triton.jit
def _tile_ptrs(Cache, pages, cb, hk, start, stride_cb, stride_cs, stride_ch, PAGE_SIZE: tl.constexpr,
               BLOCK_N: tl.constexpr):
    """Row pointers `[BLOCK_N]` of the key tile at `start`, given its `_tile_pages`."""
    pos = start + tl.arange(0, BLOCK_N)
    if PAGE_SIZE == 0:
        row = cb.to(tl.int64) * stride_cb + pos.to(tl.int64) * stride_cs
    else:
        row = pages.to(tl.int64) * stride_cb + (pos % PAGE_SIZE).to(tl.int64) * stride_cs
    return Cache + row + hk.to(tl.int64) * stride_ch


@triton.jit
def _lengths(Seqlens, LeftPad, b, seqlen_scalar, S_NEW, cap,
             HAS_SEQLENS: tl.constexpr, HAS_LEFTPAD: tl.constexpr, APPEND: tl.constexpr):
    """(old, total, lo): keys already cached, keys after the append (capped at the capacity), first valid key."""
    if HAS_SEQLENS:
        old = tl.load(Seqlens + b).to(tl.int32)
    else:
        old = seqlen_scalar + tl.zeros([], tl.int32)
    active = old >= 0  # transformers gives -1 to the padding sequences of a decode batch
    old = tl.where(active, tl.minimum(old, cap), 0)
    total = old
    if APPEND:
        total = tl.where(active, tl.minimum(old + S_NEW, cap), 0)
    if HAS_LEFTPAD:
        lo = tl.load(LeftPad + b).to(tl.int32)
    else:
        lo = tl.zeros([], tl.int32)
    return old, total, lo


@triton.jit
def _tile_rows(mt, SQ, GROUPS, BLOCK_M: tl.constexpr):
    """Rows of M tile `mt`: row r is query r // G of head r % G of the group; valid for r < Sq·G."""
    offs_m = mt * BLOCK_M + tl.arange(0, BLOCK_M)
    return offs_m, offs_m // GROUPS, offs_m % GROUPS, offs_m < SQ * GROUPS


@triton.jit
def _key_limit(mt, total, SQ, GROUPS, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr):
    """One past the last key any row of M tile `mt` sees."""
    if CAUSAL:
        last_q = tl.minimum((mt * BLOCK_M + BLOCK_M - 1) // GROUPS, SQ - 1)
        return tl.maximum(tl.minimum(total, last_q + total - SQ + 1), 0)
    else:
        return total


@triton.jit
def _window_lo(lo, total, SQ, win_left, WINDOW: tl.constexpr):
    """The first key any query of the call may see: past the left padding and, with a window, past the first
    query's window start (rows further down see later keys only)."""
    if WINDOW:
        return tl.maximum(lo, total - SQ - win_left)
    else:
        return lo


@triton.jit
def _split_span(lo, limit, split_len):
    """[first, end) of the splits with keys: split s holds keys [max(lo, s·len), min(limit, (s+1)·len))."""
    first = lo // split_len
    return first, tl.where(lo < limit, tl.cdiv(limit, split_len), first)


@triton.jit
def _quantize(x, descale, DST: tl.constexpr, FP8_MAX: tl.constexpr, FP8_MANT: tl.constexpr,
              FP8_EMIN: tl.constexpr):
    """x / descale in the cache's FP8 format (FP8_MANT mantissa bits, FP8_EMIN its smallest normal exponent),
    rounded to nearest even and saturated at ±FP8_MAX (a plain cast would make inf/NaN of an outlier).

    The rounding is done here in fp32, not by the cast: y + c - c with c = 1.5·2^(23 + e), e the exponent of y's
    grid spacing in the format, rounds y to that spacing (fp32 additions round to nearest even), carries into the
    next binade and covers the subnormals; the cast then meets an exact value (the division rounded as torch's).
    Triton's interpreter casts to FP8 without either (31.8 -> 16, ties up, no saturation), so this way the CPU tests
    check what the GPU computes."""
    y = tl.math.div_rn(x.to(tl.float32), descale + tl.zeros_like(x.to(tl.float32)))  # correctly rounded, as torch
    y = tl.minimum(tl.maximum(y, -FP8_MAX), FP8_MAX)
    exp = ((y.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127  # y's binade (any value below FP8_EMIN: FP8_EMIN)
    spacing = tl.maximum(exp, FP8_EMIN) - FP8_MANT
    c = ((spacing + 23 + 127) << 23 | (1 << 22)).to(tl.float32, bitcast=True)
    r = (y + c) - c
    return tl.where(r == 0.0, y * 0.0, r).to(DST)  # what rounds to 0 keeps its sign (-0.0), as the cast does


@triton.jit
def _tanh(x):
    """tanh from exp2, as `_kernel._tanh` (this module is compiled on its own too, so it imports nothing; why not
    `tanh.approx.f32`: there)."""
    e = tl.math.exp2(tl.abs(x) * -2.8853900817779268)
    t = (1.0 - e) / (1.0 + e)
    return tl.where(x < 0, -t, t)


@triton.jit
def _fold(m_i, l_i, acc, q, k, v, pos, ok, row_lim, qk_scale, CAUSAL: tl.constexpr,
          softcap_in, softcap_out, win_left, win_right, SOFTCAP: tl.constexpr, WINDOW: tl.constexpr):
    """One key block into the online softmax: keys `pos` (`ok`: inside this split), `row_lim` each row's position
    (its causal limit); `WINDOW` keeps [row_lim - win_left, row_lim + win_right], `SOFTCAP` caps the logits."""
    qk = tl.dot(q, tl.trans(k))  # (BLOCK_M, BLOCK_N) fp32
    keep = ok[None, :]
    if CAUSAL:
        keep = keep & (pos[None, :] <= row_lim[:, None])
    if WINDOW:
        keep = keep & (pos[None, :] >= row_lim[:, None] - win_left) & (pos[None, :] <= row_lim[:, None] + win_right)
    if SOFTCAP:  # cap·tanh(scale·qk / cap), base 2 (`_features.kernel_args`)
        qk = _tanh(qk * softcap_in) * softcap_out
    else:
        qk = qk * qk_scale
    qk = tl.where(keep, qk, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(qk, 1))
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with nothing visible yet: exp2 gives 0, not NaN
    p = tl.math.exp2(qk - m_use[:, None])
    alpha = tl.math.exp2(m_i - m_use)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
    return m_new, l_i, acc


@triton.jit
def _cols_mask(rows_ok, offs_d, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr):
    """`rows_ok` as a tile mask, plus the D valid columns when the head dim is padded (80, 96 -> BLOCK_D 128);
    decided at compile time, so power-of-two head dims keep their plain row masks (and vectorized loads). The twin of
    `_kernel._cols_mask`: this module is compiled on its own too (tests load it by path), so it imports nothing."""
    if BLOCK_D == HEAD_DIM:
        return rows_ok[:, None]
    else:
        return rows_ok[:, None] & (offs_d < HEAD_DIM)[None, :]


@triton.jit
def _finish(O, LSE, acc, l_i, m_i, b, hk, qi, g, row_ok, GROUPS, HQ, SQ,
            stride_ob, stride_os, stride_oh, STORE_LSE: tl.constexpr, HEAD_DIM: tl.constexpr,
            BLOCK_D: tl.constexpr, Sinks, SINKS: tl.constexpr):
    """out = acc / l into `[B, Sq, Hq, D]`; LSE (natural log, `[B, Hq, Sq]`) = (m + log2 l)·ln 2, +inf when l = 0.
    `SINKS`: each head's sink logit joins l first (gpt-oss; `_features.py`)."""
    h = hk * GROUPS + g
    if SINKS:
        sink = tl.load(Sinks + h, mask=row_ok, other=0.0).to(tl.float32) * 1.4426950408889634
        m_new = tl.maximum(m_i, sink)
        alpha = tl.math.exp2(m_i - m_new)
        acc = acc * alpha[:, None]
        l_i = l_i * alpha + tl.math.exp2(sink - m_new)
        m_i = m_new
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    out = acc / l_safe[:, None]
    offs_d = tl.arange(0, BLOCK_D)
    o_ptrs = (O + b.to(tl.int64) * stride_ob + qi.to(tl.int64)[:, None] * stride_os + h.to(tl.int64)[:, None] * stride_oh
              + offs_d[None, :])
    tl.store(o_ptrs, out.to(O.dtype.element_ty), mask=_cols_mask(row_ok, offs_d, HEAD_DIM, BLOCK_D))
    if STORE_LSE:
        lse = tl.where(l_i == 0.0, float("inf"), (m_i + tl.math.log2(l_safe)) * 0.6931471805599453)
        tl.store(LSE + (b.to(tl.int64) * HQ + h) * SQ + qi, lse, mask=row_ok)


@triton.jit
def _merge(m_a, l_a, acc_a, m_b, l_b, acc_b):
    """Log-sum-exp merge of two partial softmax states (base 2); a state with m = -inf contributes nothing."""
    m = tl.maximum(m_a, m_b)
    m_use = tl.where(m == float("-inf"), 0.0, m)
    a = tl.math.exp2(m_a - m_use)
    b = tl.math.exp2(m_b - m_use)
    return m, l_a * a + l_b * b, acc_a * a[:, None] + acc_b * b[:, None]


@triton.jit
def _partial(PartAcc, PartML, tile, s, n_hi, rows, offs_d, row_ok, BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr,
             NUM_SPLITS_MAX):
    """Split s's partial (m, l, acc) of one tile, read past L1 (`.cg`: another SM wrote it); nothing for s >= n_hi
    (m = -inf: merges as nothing)."""
    base = tile.to(tl.int64) * NUM_SPLITS_MAX + s
    ok = row_ok & (rows * 0 + s < n_hi)
    ml = PartML + (base * BLOCK_M + rows) * 2
    m_s = tl.load(ml, mask=ok, other=float("-inf"), cache_modifier=".cg")
    l_s = tl.load(ml + 1, mask=ok, other=0.0, cache_modifier=".cg")
    acc_s = tl.load(PartAcc + (base * BLOCK_M + rows)[:, None] * HEAD_DIM + offs_d[None, :], mask=ok[:, None],
                    other=0.0, cache_modifier=".cg")
    return m_s, l_s, acc_s


@triton.jit
def _partials4(PartAcc, PartML, tile, s, n_hi, rows, offs_d, row_ok, BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr,
               NUM_SPLITS_MAX):
    """`_partial` of splits s ... s + 3: four independent loads, in flight together (one L2 round trip)."""
    m0, l0, a0 = _partial(PartAcc, PartML, tile, s, n_hi, rows, offs_d, row_ok, BLOCK_M, HEAD_DIM, NUM_SPLITS_MAX)
    m1, l1, a1 = _partial(PartAcc, PartML, tile, s + 1, n_hi, rows, offs_d, row_ok, BLOCK_M, HEAD_DIM, NUM_SPLITS_MAX)
    m2, l2, a2 = _partial(PartAcc, PartML, tile, s + 2, n_hi, rows, offs_d, row_ok, BLOCK_M, HEAD_DIM, NUM_SPLITS_MAX)
    m3, l3, a3 = _partial(PartAcc, PartML, tile, s + 3, n_hi, rows, offs_d, row_ok, BLOCK_M, HEAD_DIM, NUM_SPLITS_MAX)
    return m0, l0, a0, m1, l1, a1, m2, l2, a2, m3, l3, a3


@triton.jit
def _merge4(m_i, l_i, acc, m0, l0, a0, m1, l1, a1, m2, l2, a2, m3, l3, a3):
    """`_merge` of four partials into (m_i, l_i, acc) at once: one max, five weights, no chain of merges."""
    m = tl.maximum(tl.maximum(tl.maximum(m_i, m0), tl.maximum(m1, m2)), m3)
    m_use = tl.where(m == float("-inf"), 0.0, m)
    w = tl.math.exp2(m_i - m_use)
    w0 = tl.math.exp2(m0 - m_use)
    w1 = tl.math.exp2(m1 - m_use)
    w2 = tl.math.exp2(m2 - m_use)
    w3 = tl.math.exp2(m3 - m_use)
    l_i = l_i * w + l0 * w0 + l1 * w1 + l2 * w2 + l3 * w3
    acc = (acc * w[:, None] + a0 * w0[:, None] + a1 * w1[:, None]) + (a2 * w2[:, None] + a3 * w3[:, None])
    return m, l_i, acc


@triton.jit
def _reduce_splits(PartAcc, PartML, tile, n_lo, n_hi, offs_m, row_ok, BLOCK_M: tl.constexpr,
                   HEAD_DIM: tl.constexpr, NUM_SPLITS_MAX, PREFETCH: tl.constexpr = False,
                   GROUP: tl.constexpr = 1):
    """Merge the partials of splits [n_lo, n_hi) of one (b, kv head, M tile). Partials `[tiles, splits, BLOCK_M, D]`
    (acc) and `[tiles, splits, BLOCK_M, 2]` (m, l); HEAD_DIM here is the partials' width, BLOCK_D.

    The merge is a chain of L2 round trips, one per split. `PREFETCH` loads split s + 1 before merging split s, so
    each round trip overlaps the previous merge. `GROUP` = 4 loads four splits' partials per round trip (four 2-D
    loads, independent of each other) and, with `PREFETCH`, the next four while merging these: ~n/4 round trips
    instead of ~n; the default, four without the prefetch, ran batch 1 at 8k 19.6 -> 18.1 µs on an H100 (TUNING.md
    step 19: the split merge alone took 6.1 µs of 15 in the profile). (Four splits per step as one [4, BLOCK_M, D]
    load runs 2-3x slower than this loop on the H200: TUNING.md step 15; the loop through Triton's pipeliner, 1-2
    more splits in flight, is no faster: TUNING.md step 17.)"""
    offs_d = tl.arange(0, HEAD_DIM)
    rows = offs_m % BLOCK_M
    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    if GROUP == 4:
        m0, l0, a0, m1, l1, a1, m2, l2, a2, m3, l3, a3 = _partials4(PartAcc, PartML, tile, n_lo, n_hi, rows, offs_d,
                                                                    row_ok, BLOCK_M, HEAD_DIM, NUM_SPLITS_MAX)
        for s in range(n_lo + 4, n_hi + 4, 4):  # s: the first split of the next group
            if PREFETCH:  # the next group's loads go out before this group is merged
                n0, k0, b0, n1, k1, b1, n2, k2, b2, n3, k3, b3 = _partials4(PartAcc, PartML, tile, s, n_hi, rows,
                                                                            offs_d, row_ok, BLOCK_M, HEAD_DIM,
                                                                            NUM_SPLITS_MAX)
                m_i, l_i, acc = _merge4(m_i, l_i, acc, m0, l0, a0, m1, l1, a1, m2, l2, a2, m3, l3, a3)
                m0, l0, a0, m1, l1, a1, m2, l2, a2, m3, l3, a3 = n0, k0, b0, n1, k1, b1, n2, k2, b2, n3, k3, b3
            else:
                m_i, l_i, acc = _merge4(m_i, l_i, acc, m0, l0, a0, m1, l1, a1, m2, l2, a2, m3, l3, a3)
                m0, l0, a0, m1, l1, a1, m2, l2, a2, m3, l3, a3 = _partials4(PartAcc, PartML, tile, s, n_hi, rows,
                                                                            offs_d, row_ok, BLOCK_M, HEAD_DIM,
                                                                            NUM_SPLITS_MAX)
    elif PREFETCH:
        m_n, l_n, acc_n = _partial(PartAcc, PartML, tile, n_lo, n_hi, rows, offs_d, row_ok, BLOCK_M, HEAD_DIM,
                                   NUM_SPLITS_MAX)
        for s in range(n_lo, n_hi):
            m_s, l_s, acc_s = m_n, l_n, acc_n
            m_n, l_n, acc_n = _partial(PartAcc, PartML, tile, s + 1, n_hi, rows, offs_d, row_ok, BLOCK_M,
                                       HEAD_DIM, NUM_SPLITS_MAX)
            m_i, l_i, acc = _merge(m_i, l_i, acc, m_s, l_s, acc_s)
    else:
        for s in range(n_lo, n_hi):
            m_s, l_s, acc_s = _partial(PartAcc, PartML, tile, s, n_hi, rows, offs_d, row_ok, BLOCK_M, HEAD_DIM,
                                       NUM_SPLITS_MAX)
            m_i, l_i, acc = _merge(m_i, l_i, acc, m_s, l_s, acc_s)
    return m_i, l_i, acc


@triton.jit(do_not_specialize=["count_off"])
def kvcache_fwd(Q, KCache, VCache, KNew, VNew, O, LSE, Seqlens, BatchIdx, LeftPad, Table, PartAcc, Counters,
                seqlen_scalar, qk_scale, Sinks, softcap_in, softcap_out, win_left, win_right, KDescale, VDescale,
                count_off, ml_off, stride_kdb, stride_kdh, stride_vdb, stride_vdh,
                stride_qb, stride_qs, stride_qh,
                stride_kcb, stride_kcs, stride_kch,
                stride_vcb, stride_vcs, stride_vch, stride_vcd,
                stride_knb, stride_kns, stride_knh,
                stride_vnb, stride_vns, stride_vnh,
                stride_ob, stride_os, stride_oh, stride_bt,
                HQ, HKV, GROUPS, SQ, S_NEW, cap, split_len, num_splits,
                HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PAGE_SIZE: tl.constexpr,
                CAUSAL: tl.constexpr, APPEND: tl.constexpr, HAS_SEQLENS: tl.constexpr,
                HAS_BATCH_IDX: tl.constexpr, HAS_LEFTPAD: tl.constexpr, SPLIT: tl.constexpr,
                FUSED_REDUCE: tl.constexpr, STORE_LSE: tl.constexpr, BLOCK_D: tl.constexpr = 128,
                PREFETCH: tl.constexpr = False, SOFTCAP: tl.constexpr = False, WINDOW: tl.constexpr = False,
                SINKS: tl.constexpr = False, MERGE_GROUP: tl.constexpr = 1, DESCALE: tl.constexpr = False,
                FP8_MAX: tl.constexpr = 448.0, FP8_MANT: tl.constexpr = 3, FP8_EMIN: tl.constexpr = -6,
                V_KEYS: tl.constexpr = False):
    """grid = (num_splits, B * Hkv, cdiv(Sq * G, BLOCK_M)). q `[B, Sq, Hq, D]`, caches dense `[B_c, S_c, Hkv, D]` or
    paged `[blocks, PAGE_SIZE, Hkv, D]`, k/v new `[B, Snew, Hkv, D]`, out `[B, Sq, Hq, D]`; last dims contiguous.
    With `SPLIT`: one fp32 workspace, the partial accumulators from PartAcc and their (m, l) pairs from
    PartAcc + ml_off (one allocation per call, not two); the fused merge's counters are Counters[count_off + tile]
    (a ring shared by calls: `_splits.counter_slot`; not specialized, it changes every call). `DESCALE`: an FP8
    cache, its descales at KDescale[b·stride_kdb + hk·stride_kdh] (likewise V); FP8_MAX, FP8_MANT, FP8_EMIN its format
    (`_quantize`). `V_KEYS` (an FP8 dense cache, no append): v_cache stored with the keys contiguous (stride_vcs = 1,
    the head dim at stride_vcd), read as Vᵀ tiles: P·V's B operand has the keys as its reduction dim, and an 8-bit
    operand stored head-dim-contiguous reaches the mma one byte at a time (`ld.shared.b8`)."""
    s = tl.program_id(0)
    bk = tl.program_id(1)
    mt = tl.program_id(2)
    b = bk // HKV
    hk = bk % HKV
    tile = bk * tl.num_programs(2) + mt
    if HAS_BATCH_IDX:
        cb = tl.load(BatchIdx + b)
    else:
        cb = b
    old, total, lo = _lengths(Seqlens, LeftPad, b, seqlen_scalar, S_NEW, cap, HAS_SEQLENS, HAS_LEFTPAD, APPEND)
    lo = _window_lo(lo, total, SQ, win_left, WINDOW)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)  # the head dim padded to a power of two (80, 96 -> 128)
    k_descale = 1.0
    v_descale = 1.0
    if DESCALE:  # an FP8 cache: the key descale joins the logit scale, the value descale scales acc at the end
        k_descale = tl.load(KDescale + b * stride_kdb + hk * stride_kdh).to(tl.float32)
        v_descale = tl.load(VDescale + b * stride_vdb + hk * stride_vdh).to(tl.float32)
        qk_scale = qk_scale * k_descale
        softcap_in = softcap_in * k_descale

    if APPEND:  # write this split's share of the new keys/values into the cache (M tile 0 only)
        w_lo = tl.maximum(old, s * split_len)
        w_hi = tl.where(mt == 0, tl.minimum(total, s * split_len + split_len), w_lo)
        for start in tl.range(w_lo, w_hi, BLOCK_N, num_stages=1):
            pos = start + offs_n
            ok = pos < w_hi
            src = (pos - old).to(tl.int64)[:, None]
            kn = tl.load(KNew + b.to(tl.int64) * stride_knb + src * stride_kns + hk * stride_knh + offs_d[None, :],
                         mask=_cols_mask(ok, offs_d, HEAD_DIM, BLOCK_D), other=0.0)
            vn = tl.load(VNew + b.to(tl.int64) * stride_vnb + src * stride_vns + hk * stride_vnh + offs_d[None, :],
                         mask=_cols_mask(ok, offs_d, HEAD_DIM, BLOCK_D), other=0.0)
            k_dst = _kv_rows(KCache, Table, b, cb, hk, pos, stride_kcb, stride_kcs, stride_kch, stride_bt, PAGE_SIZE, ok)
            v_dst = _kv_rows(VCache, Table, b, cb, hk, pos, stride_vcb, stride_vcs, stride_vch, stride_bt, PAGE_SIZE, ok)
            if DESCALE:
                kn = _quantize(kn, k_descale, KCache.dtype.element_ty, FP8_MAX, FP8_MANT, FP8_EMIN)
                vn = _quantize(vn, v_descale, VCache.dtype.element_ty, FP8_MAX, FP8_MANT, FP8_EMIN)
            tl.store(k_dst[:, None] + offs_d[None, :], kn.to(KCache.dtype.element_ty), mask=_cols_mask(ok, offs_d, HEAD_DIM, BLOCK_D))
            tl.store(v_dst[:, None] + offs_d[None, :], vn.to(VCache.dtype.element_ty), mask=_cols_mask(ok, offs_d, HEAD_DIM, BLOCK_D))

    offs_m, qi, g, row_ok = _tile_rows(mt, SQ, GROUPS, BLOCK_M)
    h = hk * GROUPS + g
    q = tl.load(Q + b.to(tl.int64) * stride_qb + qi.to(tl.int64)[:, None] * stride_qs
                + h.to(tl.int64)[:, None] * stride_qh + offs_d[None, :],
                mask=_cols_mask(row_ok, offs_d, HEAD_DIM, BLOCK_D), other=0.0)
    row_lim = qi + total - SQ  # causal: the last key each row sees
    limit = _key_limit(mt, total, SQ, GROUPS, CAUSAL, BLOCK_M)
    k_lo = tl.maximum(lo, s * split_len)
    k_hi = tl.minimum(limit, s * split_len + split_len)

    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    cache_hi = k_hi
    if APPEND:
        cache_hi = tl.minimum(k_hi, old)
    pages = _tile_pages(Table, b, k_lo, cache_hi, stride_bt, PAGE_SIZE, BLOCK_N)
    whole = k_lo  # V_KEYS: the whole tiles first, their Vᵀ loads unmasked along the keys (a mask that changes along
    if V_KEYS:    # the contiguous dim keeps Triton from pipelining them: they went through registers, not async copies)
        whole = k_lo + tl.maximum(cache_hi - k_lo, 0) // BLOCK_N * BLOCK_N
        for start in range(k_lo, whole, BLOCK_N):  # a dense cache: no pages
            pos = start + offs_n
            ok = pos < cache_hi
            k_ptr = _tile_ptrs(KCache, 0, cb, hk, start, stride_kcb, stride_kcs, stride_kch, PAGE_SIZE, BLOCK_N)
            v_ptr = _tile_ptrs(VCache, 0, cb, hk, start, stride_vcb, stride_vcs, stride_vch, PAGE_SIZE, BLOCK_N)
            k = tl.load(k_ptr[:, None] + offs_d[None, :], mask=_cols_mask(ok, offs_d, HEAD_DIM, BLOCK_D), other=0.0)
            vt_ptr = v_ptr[None, :] + offs_d.to(tl.int64)[:, None] * stride_vcd
            if BLOCK_D == HEAD_DIM:
                vt = tl.load(vt_ptr)
            else:
                vt = tl.load(vt_ptr, mask=(offs_d < HEAD_DIM)[:, None], other=0.0)
            m_i, l_i, acc = _fold(m_i, l_i, acc, q, k.to(Q.dtype.element_ty), tl.trans(vt).to(Q.dtype.element_ty),
                                  pos, ok, row_lim, qk_scale, CAUSAL, softcap_in, softcap_out, win_left, win_right,
                                  SOFTCAP, WINDOW)
    for start in range(whole, cache_hi, BLOCK_N):  # the cached keys: the stream this program exists for
        pos = start + offs_n
        ok = pos < cache_hi
        k_ptr = _tile_ptrs(KCache, pages, cb, hk, start, stride_kcb, stride_kcs, stride_kch, PAGE_SIZE, BLOCK_N)
        v_ptr = _tile_ptrs(VCache, pages, cb, hk, start, stride_vcb, stride_vcs, stride_vch, PAGE_SIZE, BLOCK_N)
        pages = _tile_pages(Table, b, start + BLOCK_N, cache_hi, stride_bt, PAGE_SIZE, BLOCK_N)  # the next tile's
        k = tl.load(k_ptr[:, None] + offs_d[None, :], mask=_cols_mask(ok, offs_d, HEAD_DIM, BLOCK_D), other=0.0)
        if V_KEYS:  # the last, partial tile
            v = tl.trans(tl.load(v_ptr[None, :] + offs_d.to(tl.int64)[:, None] * stride_vcd,
                                 mask=tl.trans(_cols_mask(ok, offs_d, HEAD_DIM, BLOCK_D)), other=0.0))
        else:
            v = tl.load(v_ptr[:, None] + offs_d[None, :], mask=_cols_mask(ok, offs_d, HEAD_DIM, BLOCK_D), other=0.0)
        if DESCALE:  # widened in registers: the dot products run in the query's dtype
            k = k.to(Q.dtype.element_ty)
            v = v.to(Q.dtype.element_ty)
        m_i, l_i, acc = _fold(m_i, l_i, acc, q, k, v, pos, ok, row_lim, qk_scale, CAUSAL, softcap_in, softcap_out,
                              win_left, win_right, SOFTCAP, WINDOW)
    if APPEND:  # this split's new keys, read from k/v (another CTA may be writing them into the cache right now)
        for start in tl.range(tl.maximum(k_lo, old), k_hi, BLOCK_N, num_stages=1):
            pos = start + offs_n
            ok = pos < k_hi
            src = (pos - old).to(tl.int64)[:, None]
            k = tl.load(KNew + b.to(tl.int64) * stride_knb + src * stride_kns + hk * stride_knh + offs_d[None, :],
                        mask=_cols_mask(ok, offs_d, HEAD_DIM, BLOCK_D), other=0.0)
            v = tl.load(VNew + b.to(tl.int64) * stride_vnb + src * stride_vns + hk * stride_vnh + offs_d[None, :],
                        mask=_cols_mask(ok, offs_d, HEAD_DIM, BLOCK_D), other=0.0)
            if DESCALE:  # as a later step will read them: quantized, then widened
                k = _quantize(k, k_descale, KCache.dtype.element_ty, FP8_MAX, FP8_MANT,
                              FP8_EMIN).to(Q.dtype.element_ty)
                v = _quantize(v, v_descale, VCache.dtype.element_ty, FP8_MAX, FP8_MANT,
                              FP8_EMIN).to(Q.dtype.element_ty)
            else:
                k = k.to(KCache.dtype.element_ty)
                v = v.to(VCache.dtype.element_ty)
            m_i, l_i, acc = _fold(m_i, l_i, acc, q, k, v, pos, ok, row_lim, qk_scale, CAUSAL, softcap_in, softcap_out,
                              win_left, win_right, SOFTCAP, WINDOW)
    if DESCALE:
        acc = acc * v_descale

    if SPLIT:
        PartML = PartAcc + ml_off
        if k_lo < k_hi:  # an empty split stores nothing; the merge skips it
            part = tile.to(tl.int64) * num_splits + s
            rows = offs_m % BLOCK_M
            ml = PartML + (part * BLOCK_M + rows) * 2
            tl.store(ml, m_i, mask=row_ok)
            tl.store(ml + 1, l_i, mask=row_ok)
            tl.store(PartAcc + (part * BLOCK_M + rows)[:, None] * BLOCK_D + offs_d[None, :], acc, mask=row_ok[:, None])
        if FUSED_REDUCE:
            tl.debug_barrier()  # every thread's partial stores before the release below
            done = tl.atomic_add(Counters + count_off + tile, 1, sem="acq_rel")
            if done == num_splits - 1:  # the last CTA of this tile: merge every non-empty split, reset the counter
                n_lo, n_hi = _split_span(lo, limit, split_len)
                m_i, l_i, acc = _reduce_splits(PartAcc, PartML, tile, n_lo, n_hi, offs_m, row_ok, BLOCK_M, BLOCK_D,
                                               num_splits, PREFETCH, MERGE_GROUP)
                _finish(O, LSE, acc, l_i, m_i, b, hk, qi, g, row_ok, GROUPS, HQ, SQ, stride_ob, stride_os, stride_oh,
                        STORE_LSE, HEAD_DIM, BLOCK_D, Sinks, SINKS)
                tl.atomic_xchg(Counters + count_off + tile, 0)
    else:
        _finish(O, LSE, acc, l_i, m_i, b, hk, qi, g, row_ok, GROUPS, HQ, SQ, stride_ob, stride_os, stride_oh,
                STORE_LSE, HEAD_DIM, BLOCK_D, Sinks, SINKS)


@triton.jit
def kvcache_reduce(O, LSE, Seqlens, LeftPad, PartAcc, seqlen_scalar, Sinks, win_left, ml_off,
                   stride_ob, stride_os, stride_oh,
                   HQ, HKV, GROUPS, SQ, S_NEW, cap, split_len, num_splits,
                   HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, CAUSAL: tl.constexpr, APPEND: tl.constexpr,
                   HAS_SEQLENS: tl.constexpr, HAS_LEFTPAD: tl.constexpr, STORE_LSE: tl.constexpr,
                   BLOCK_D: tl.constexpr = 128, PREFETCH: tl.constexpr = False, WINDOW: tl.constexpr = False,
                   SINKS: tl.constexpr = False, MERGE_GROUP: tl.constexpr = 1):
    """The merge as its own launch (when `FUSED_REDUCE` is off): grid = (B * Hkv, M tiles)."""
    PartML = PartAcc + ml_off
    bk = tl.program_id(0)
    mt = tl.program_id(1)
    b = bk // HKV
    hk = bk % HKV
    tile = bk * tl.num_programs(1) + mt
    old, total, lo = _lengths(Seqlens, LeftPad, b, seqlen_scalar, S_NEW, cap, HAS_SEQLENS, HAS_LEFTPAD, APPEND)
    lo = _window_lo(lo, total, SQ, win_left, WINDOW)
    offs_m, qi, g, row_ok = _tile_rows(mt, SQ, GROUPS, BLOCK_M)
    limit = _key_limit(mt, total, SQ, GROUPS, CAUSAL, BLOCK_M)
    n_lo, n_hi = _split_span(lo, limit, split_len)
    m_i, l_i, acc = _reduce_splits(PartAcc, PartML, tile, n_lo, n_hi, offs_m, row_ok, BLOCK_M, BLOCK_D, num_splits,
                                   PREFETCH, MERGE_GROUP)
    _finish(O, LSE, acc, l_i, m_i, b, hk, qi, g, row_ok, GROUPS, HQ, SQ, stride_ob, stride_os, stride_oh,
            STORE_LSE, HEAD_DIM, BLOCK_D, Sinks, SINKS)
