"""flash-triton's `flash_attn_with_kvcache` (the split-KV decode program) on the CPU, through Triton's interpreter.

The child (this file run with TRITON_INTERPRET=1) builds dense and paged caches, calls the kernel, and measures the
error of every sequence against the fp64 oracle (`kernel_ref.Check`) and what the call did to the cache; the tests
assert on its JSON. Rule: error <= 2 x eager attention's in fp16. Covered: decode and appends (Sq = 1 and 3), GQA,
one split, several, the heuristic's choice, the merge fused into the last CTA and as a second launch; paged caches of
block size 16, 64 and 256 with scattered block tables (bit for bit the dense result); empty sequences, transformers'
padding sequences (cache_seqlens = -1), left padding, cache_batch_idx, LSE, appends past the capacity.
"""

from __future__ import annotations

import importlib
import json
import os
from pathlib import Path

import pytest
import torch

from interpreter_child import run_child
from kernel_ref import within_rule

INTERPRETER_CHILD = True  # its child starts in the background once tests are collected (conftest.py)

ROOT = Path(__file__).resolve().parents[1]
REPO = ROOT / "kernels" / "flash-triton"
# name -> (splits, fused merge, prefetching merge, splits merged per round trip)
SPLITS = {"one": (1, True, False, 1), "three-fused": (3, True, False, 1), "three-2-launch": (3, False, False, 1),
          "seven-fused-prefetch": (7, True, True, 1), "seven-2-launch-prefetch": (7, False, True, 1),
          "heuristic": (0, True, False, 1), "seven-fused-group4-prefetch": (7, True, True, 4),
          "seven-2-launch-group4": (7, False, False, 4), "three-fused-group4": (3, True, False, 4)}


# ---------------------------------------------------------------------------------------------------------------
# The child: runs with TRITON_INTERPRET=1 from its first import on.
# ---------------------------------------------------------------------------------------------------------------
def _cached_rows(cache, lengths, block_table=None):
    """Each sequence's cached keys `[L_b, Hkv, D]` from a dense `[B, S, ...]` or paged `[blocks, page, ...]` cache."""
    if block_table is None:
        return [cache[b, :n] for b, n in enumerate(lengths)]
    return [cache[block_table[b].clamp_min(0).long()].flatten(0, 1)[:n] for b, n in enumerate(lengths)]


def _check_call(mod, q, kc, vc, kn, vn, seqlens, causal, block_table=None, **kw):
    """Run the kernel on copies of the caches; return (oracle result, output, caches after)."""
    from kernel_ref import Check

    kc0, vc0 = kc.clone(), vc.clone()
    kc, vc = kc.clone(), vc.clone()
    out = mod.kvcache_attention(q, kc, vc, kn, vn, cache_seqlens=seqlens, block_table=block_table, causal=causal,
                                **kw)
    check = Check()
    lengths = [max(int(n), 0) for n in seqlens]
    old_k, old_v = _cached_rows(kc0, lengths, block_table), _cached_rows(vc0, lengths, block_table)
    for b in range(q.shape[0]):
        keys, vals = old_k[b], old_v[b]
        if kn is not None and int(seqlens[b]) >= 0:
            keys, vals = torch.cat([keys, kn[b]]), torch.cat([vals, vn[b]])
        check.add(out[b], q[b], keys, vals, causal, q.shape[-1] ** -0.5)
    return check.result(), out, kc, vc, kc0


def _child() -> dict:
    from attnprof.variants import kernel_hub

    mod = kernel_hub.load(kernel_hub.parse_spec(str(REPO)))
    gen = torch.Generator().manual_seed(0)

    def rand(*shape):
        return torch.randn(*shape, generator=gen).half()

    results: dict = {"interpreted": bool(mod.INTERPRETED)}
    # dense cache, decode with append, GQA 4/2: every way of splitting and merging
    b, s, hq, hkv, d = 3, 200, 4, 2, 64
    kc, vc, q, kn, vn = rand(b, s, hkv, d), rand(b, s, hkv, d), rand(b, 1, hq, d), rand(b, 1, hkv, d), rand(b, 1, hkv, d)
    seqlens = torch.tensor([50, 0, 130], dtype=torch.int32)
    for name, (splits, fused, prefetch, group) in SPLITS.items():
        cfg = mod.DecodeConfig(block_n=32, fused_reduce=fused, prefetch_merge=prefetch, merge_group=group)
        r, out, kc1, vc1, kc0 = _check_call(mod, q, kc, vc, kn, vn, seqlens, True, num_splits=splits, config=cfg)
        written = all(torch.equal(kc1[i, seqlens[i]], kn[i, 0]) and torch.equal(vc1[i, seqlens[i]], vn[i, 0])
                      for i in range(b))
        untouched = kc1.clone()
        for i in range(b):
            untouched[i, seqlens[i]] = kc0[i, seqlens[i]]
        results[f"dense/{name}"] = {**r, "written": written, "rest_untouched": bool(torch.equal(untouched, kc0))}

    # paged caches: scattered block tables, block sizes 16/64/256; the same keys as a dense cache give the same bits
    for page in (16, 64, 256):
        lengths, sq = [300, 0, 77], 1
        max_blocks = -(-(max(lengths) + 4) // page)
        dense_k, dense_v = rand(3, max_blocks * page, hkv, d), rand(3, max_blocks * page, hkv, d)
        table = torch.randperm(3 * max_blocks + 2, generator=gen)[: 3 * max_blocks].view(3, max_blocks).to(torch.int32)
        pk, pv = rand(3 * max_blocks + 2, page, hkv, d), rand(3 * max_blocks + 2, page, hkv, d)
        pk[table.flatten().long()] = dense_k.view(3 * max_blocks, page, hkv, d)
        pv[table.flatten().long()] = dense_v.view(3 * max_blocks, page, hkv, d)
        q, kn, vn = rand(3, sq, hq, d), rand(3, sq, hkv, d), rand(3, sq, hkv, d)
        lens = torch.tensor(lengths, dtype=torch.int32)
        r, out, pk1, _, _ = _check_call(mod, q, pk, pv, kn, vn, lens, True, block_table=table, num_splits=3)
        same_tiles = mod.DecodeConfig().for_head_dim(d, page)  # the tiles the paged call took by default
        _, out_dense, dk1, _, _ = _check_call(mod, q, dense_k, dense_v, kn, vn, lens, True, num_splits=3,
                                              config=same_tiles)
        written = all(torch.equal(pk1[table[i, n // page].long(), n % page], kn[i, 0]) for i, n in enumerate(lengths))
        results[f"paged/{page}"] = {**r, "written": written, "same_as_dense": bool(torch.equal(out, out_dense))}

    # appending three tokens (chunked decode / speculative verify), causal within the chunk, paged 16, head dim 128
    d2, page = 128, 16
    table = torch.tensor([[5, 2, 7, 0], [1, 6, 3, 4]], dtype=torch.int32)
    pk, pv = rand(8, page, 1, d2), rand(8, page, 1, d2)
    q, kn, vn = rand(2, 3, 2, d2), rand(2, 3, 1, d2), rand(2, 3, 1, d2)
    for causal in (True, False):
        r, *_ = _check_call(mod, q, pk, pv, kn, vn, torch.tensor([29, 40], dtype=torch.int32), causal,
                            block_table=table, num_splits=2)
        results[f"append3/{'causal' if causal else 'full'}"] = r
    # 62 + 3 > 4 blocks x 16: positions 62, 63 land in the last block (page 4), position 64 has nowhere to go
    kc1 = pk.clone()
    mod.kvcache_attention(q, kc1, pv.clone(), kn, vn, cache_seqlens=torch.tensor([29, 62], dtype=torch.int32),
                          block_table=table, causal=True, num_splits=2)
    results["past_capacity"] = {"last_page_rows": bool(torch.equal(kc1[4, 14:], kn[1, :2])),
                                "rows_written": int((kc1 != pk).any(-1).any(-1).sum())}  # 3 + 2

    # dense cache extras: left padding, rows picked by cache_batch_idx, LSE, an int cache_seqlens, None (full cache)
    kc, vc, q = rand(4, 64, hkv, d), rand(4, 64, hkv, d), rand(2, 1, hq, d)
    idx = torch.tensor([2, 0], dtype=torch.int32)
    # 16-key blocks: 4 splits, and the padding (19 keys) empties the first, so the merge starts past split 0
    out, lse = mod.kvcache_attention(q, kc, vc, cache_seqlens=torch.tensor([40, 0], dtype=torch.int32),
                                     cache_batch_idx=idx, cache_leftpad=torch.tensor([19, 0], dtype=torch.int32),
                                     num_splits=4, return_softmax_lse=True,
                                     config=mod.DecodeConfig(block_n=16, prefetch_merge=True, merge_group=4))
    from kernel_ref import Check, lse_reference

    check = Check()
    check.add(out[0], q[0], kc[2, 19:40], vc[2, 19:40], False, d ** -0.5)
    want = lse_reference(q[0], kc[2, 19:40], False, d ** -0.5)
    results["leftpad_batch_idx_lse"] = {**check.result(), "lse_err": (lse[0].double() - want).abs().max().item(),
                                        "empty_out_zero": bool((out[1] == 0).all()),
                                        "empty_lse": lse[1].tolist()[0][0]}
    for name, lens in (("int", 33), ("none", None)):
        out = mod.flash_attn_with_kvcache(q, kc[:2], vc[:2], cache_seqlens=lens, num_splits=2)
        n = 64 if lens is None else lens
        check = Check()
        for i in range(2):
            check.add(out[i], q[i], kc[i, :n], vc[i, :n], False, d ** -0.5)
        results[f"seqlens_{name}"] = check.result()

    # transformers' padded decode batch: cache_seqlens -1 and a block-table row of -1 for the padding sequence
    table = torch.tensor([[3, 1], [-1, -1]], dtype=torch.int32)
    pk, pv = rand(4, 16, hkv, d), rand(4, 16, hkv, d)
    q, kn, vn = rand(2, 1, hq, d), rand(2, 1, hkv, d), rand(2, 1, hkv, d)
    r, out, pk1, _, pk0 = _check_call(mod, q, pk, pv, kn, vn, torch.tensor([20, -1], dtype=torch.int32), True,
                                      block_table=table, num_splits=2)
    results["padding_sequence"] = {**r, "pad_out_zero": bool((out[1] == 0).all()),
                                   "only_one_row_written": int((pk1 != pk0).any(-1).any(-1).sum())}

    # flash_attn_func at decode shapes takes the decode program (k/v as a full dense cache, strided views too)
    q, k = rand(2, 2, 8, d), rand(2, 2, 90, d).transpose(1, 2)  # k: [B, S, Hkv, D] view of [B, Hkv, S, D]
    v = rand(2, 90, 2, d)
    out = mod.flash_attn_func(q, k, v, causal=True)
    check = Check()
    for i in range(2):
        check.add(out[i], q[i], k[i], v[i], True, d ** -0.5)
    results["flash_attn_func_decode"] = {**check.result(), "program": mod.choose_config(q, k, True).label()}
    return results


# ---------------------------------------------------------------------------------------------------------------
# The tests
# ---------------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def interp() -> dict:
    return run_child(__file__)


def test_child_ran_the_interpreter(interp):
    assert interp["interpreted"]


@pytest.mark.parametrize("splits", list(SPLITS))
def test_dense_cache_decode_with_append(interp, splits):
    r = interp[f"dense/{splits}"]
    within_rule(r)
    assert r["written"], "the new k/v must land at cache_seqlens"
    assert r["rest_untouched"], "nothing else in the cache may change"


@pytest.mark.parametrize("page", [16, 64, 256])
def test_paged_cache_scattered_blocks(interp, page):
    r = interp[f"paged/{page}"]
    within_rule(r)
    assert r["written"] and r["same_as_dense"]


@pytest.mark.parametrize("mode", ["causal", "full"])
def test_appending_three_tokens(interp, mode):
    within_rule(interp[f"append3/{mode}"])


def test_appends_past_the_capacity_are_dropped_not_written_elsewhere(interp):
    r = interp["past_capacity"]
    assert r["last_page_rows"] and r["rows_written"] == 5, r


def test_leftpad_batch_idx_and_lse(interp):
    r = interp["leftpad_batch_idx_lse"]
    within_rule(r)
    assert r["lse_err"] < 1e-2, r
    assert r["empty_out_zero"] and r["empty_lse"] == float("inf")


@pytest.mark.parametrize("kind", ["int", "none"])
def test_cache_seqlens_as_int_or_none(interp, kind):
    within_rule(interp[f"seqlens_{kind}"])


def test_transformers_padding_sequence_reads_and_writes_nothing(interp):
    r = interp["padding_sequence"]
    within_rule(r)
    assert r["pad_out_zero"] and r["only_one_row_written"] == 1, r


def test_flash_attn_func_at_decode_shapes_takes_the_decode_program(interp):
    r = interp["flash_attn_func_decode"]
    within_rule(r)
    assert r["program"].startswith("decode"), r


def _module():
    from kernels import get_local_kernel

    return get_local_kernel(REPO)


def test_splits_come_from_shapes_like_flash_attention_2():
    splits = importlib.import_module(_module().__name__ + "._splits")  # by name: a later load may rebind the attribute
    assert splits.num_splits_heuristic(512, 264, 128, 128) == 1  # batch 64 x 8 kv heads: no split
    # the largest count in one wave of 132 slots (1 per SM): batch 1 / 2 / 4 x 8 kv heads over 32k keys (256 blocks)
    assert [splits.num_splits_heuristic(8 * b, 132, 256, 128) for b in (1, 2, 4)] == [16, 8, 4]
    assert splits.num_splits_heuristic(8, 132, 8, 128) == 8  # 1k keys: one block per split
    assert splits.num_splits_heuristic(1, 132, 256, 128) == 128  # one kv head: MAX_SPLITS
    # 33 splits of 128 blocks give as many blocks per split (4) as 32: the extra one would be empty
    assert splits.num_splits_heuristic(8, 264, 128, 128) == 32
    p = splits.plan(1, 8, 4, 8192, torch.device("cpu"), splits.DecodeConfig(block_n=64), num_splits=16)
    assert (p.block_m, p.m_tiles, p.num_splits, p.split_len) == (16, 1, 16, 512)
    p = splits.plan(1, 8, 4, 100, torch.device("cpu"), splits.DecodeConfig(block_n=64), num_splits=16)
    assert p.num_splits == 2 and p.split_len == 64  # never more splits than key blocks
    # a floor on keys per split (the FP8 default's): 2 CTA slots x 4 "SMs" would split 1024 keys 8 ways, 512 keys
    # each allows 2; a count asked for by name is not floored
    cpu = torch.device("cpu")
    assert splits.plan(1, 1, 4, 1024, cpu, splits.DecodeConfig(block_n=128, ctas_per_sm=2)).num_splits == 8
    assert splits.plan(1, 1, 4, 1024, cpu, splits.DEFAULT_FP8.for_head_dim(128)).num_splits == 2
    assert splits.plan(1, 1, 4, 1024, cpu, splits.DEFAULT_FP8.for_head_dim(128), num_splits=8).num_splits == 8


def test_default_tiles_by_head_dim_and_page_size():
    splits = importlib.import_module(_module().__name__ + "._splits")
    cfg = splits.DecodeConfig()
    assert [cfg.for_head_dim(d).block_n for d in (64, 96, 128, 256)] == [128, 128, 128, 64]
    assert cfg.for_head_dim(128, page=64).block_n == 64 and cfg.for_head_dim(128, page=256).block_n == 128
    assert splits.DecodeConfig(block_n=32).for_head_dim(128).block_n == 32  # an explicit choice stays


def test_merge_counters_are_disjoint_zeroed_ranges_of_one_ring():
    """The fused merge's counters: ranges of one ring of zeros per device, handed out as (ring, first index) so a call
    costs no tensor view; consecutive calls get disjoint ranges (calls in flight on other streams never share a
    counter), each starting on a 64-byte line, and the ring wraps around to its start."""
    splits = importlib.import_module(_module().__name__ + "._splits")
    cpu = torch.device("cpu")
    splits._rings.pop(cpu, None)
    got = [splits.counter_slot(cpu, n) for n in (3, 5, 1, 8)]
    ring = got[0][0]
    assert all(t is ring for t, _ in got) and int(ring.abs().sum()) == 0
    starts = [start for _, start in got]
    assert starts == [0, 16, 32, 48]  # each range rounded up to 16 counters
    _, wrapped = splits.counter_slot(cpu, splits._RING_SIZE - 48)  # does not fit after 64: back to the start
    assert wrapped == 0
    fresh, start = splits.counter_slot(cpu, splits._RING_SIZE + 1)  # larger than the ring: its own zeros
    assert start == 0 and fresh.numel() == splits._RING_SIZE + 1 and fresh is not ring


def _decode_args(b=2, s=32, hq=4, hkv=2, d=64):
    return (torch.randn(b, 1, hq, d, dtype=torch.float16), torch.randn(b, s, hkv, d, dtype=torch.float16),
            torch.randn(b, s, hkv, d, dtype=torch.float16))


@pytest.mark.parametrize("change, words", [
    (dict(rotary_cos=torch.ones(4, 8), rotary_sin=torch.ones(4, 8)), "rotary_cos"),
    (dict(window_size=(8,)), "window_size=\\(8,\\) must be two ints"),
    (dict(softcap=-5.0), "softcap=-5.0 must be a finite number"),
    (dict(alibi_slopes=torch.ones(4)), "alibi_slopes"),
    (dict(s_aux=torch.ones(5)), "s_aux must be \\[Hq\\]"),
    (dict(k=torch.zeros(2, 1, 2, 64, dtype=torch.float16)), "both k and v"),
    (dict(k=torch.zeros(2, 1, 2, 64, dtype=torch.float16), v=torch.zeros(2, 1, 2, 64, dtype=torch.float16)),
     "without cache_seqlens"),
    (dict(block_table=torch.zeros(2, 2, dtype=torch.int32), cache_batch_idx=torch.zeros(2, dtype=torch.int32)),
     "do not apply to a paged cache"),
    (dict(block_table=torch.zeros(2, 2)), "block_table must be int32"),
    (dict(cache_seqlens=torch.zeros(3, dtype=torch.int32)), "cache_seqlens must have 2 rows"),
    (dict(num_splits=-1), "num_splits must be an int >= 0"),
], ids=["rotary", "window", "softcap", "alibi", "sinks", "k-without-v", "no-seqlens", "paged-batch-idx",
        "table-dtype", "seqlens-length", "splits"])
def test_bad_arguments_refused_before_launch(change, words):
    with pytest.raises(ValueError, match=words):
        _module().flash_attn_with_kvcache(*_decode_args(), **change)


def test_mismatched_caches_refused():
    q, kc, vc = _decode_args()
    with pytest.raises(ValueError, match="k_cache and v_cache must have the same shape"):
        _module().flash_attn_with_kvcache(q, kc, vc[:, :16])
    with pytest.raises(ValueError, match="pass cache_batch_idx"):
        _module().flash_attn_with_kvcache(q, kc[:1], vc[:1])


if __name__ == "__main__":
    assert os.environ.get("TRITON_INTERPRET") == "1", "run the child with TRITON_INTERPRET=1"
    print(json.dumps(_child()))
