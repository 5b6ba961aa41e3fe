"""flash-triton's `flash_attn_with_kvcache` over an FP8 KV cache, on the CPU through Triton's interpreter.

The cache holds float8_e4m3fn or float8_e5m2 values x / descale (FlashAttention-3's convention: fp32 descales per
(sequence, kv head) `[B, Hkv]` or one per tensor); the query, the appended keys/values and the output are fp16 here
(bf16 on the GPU). The oracle is fp64 attention over the dequantised cache (x8 · descale) as the call left it, the
appended rows included: the rule is the usual one, error <= 2 x fp16 eager attention's over the same dequantised
values. Appended rows must land in the cache bit for bit as torch's round-to-nearest-even cast of
clamp(x / descale) makes them, at the format's edges too (binade carries, ties, subnormals, saturation).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from interpreter_child import run_child
from kernel_ref import within_rule

INTERPRETER_CHILD = True  # its child starts in the background once tests are collected (conftest.py)

ROOT = Path(__file__).resolve().parents[1]
REPO = ROOT / "kernels" / "flash-triton"
E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
# name -> (cache dtype, descale: "bh" per (sequence, kv head), "tensor", None), page size (0: dense), splits, fused
CASES = {
    "e4m3-dense-bh-3fused": (E4M3, "bh", 0, 3, True),
    "e4m3-dense-bh-1split": (E4M3, "bh", 0, 1, True),
    "e4m3-paged16-tensor-2launch": (E4M3, "tensor", 16, 3, False),
    "e5m2-dense-tensor-3fused": (E5M2, "tensor", 0, 3, True),
    "e5m2-paged16-bh-heuristic": (E5M2, "bh", 16, 0, True),
    "e4m3-dense-no-descale": (E4M3, None, 0, 2, True),
}
# appended values at the formats' edges (descale 1): a carry into the next binade, ties both ways, subnormals,
# values past the largest finite one (saturated, never inf/NaN), the smallest ones
EDGES = [31.8, -31.8, 100.0, 104.0, 17.0, 19.0, 0.001, -0.0009, 500.0, -65000.0, 0.0001, 448.0, 449.0, 60000.0, 0.3, 1.0]


def _features_errors():
    from test_kernel_features import Errors  # the fp64 oracle with flash-attn's softcap/window/sinks semantics

    return Errors()


def _child() -> dict:
    from attnprof.variants import kernel_hub
    from kernel_ref import dequantized, fp8_cache

    mod = kernel_hub.load(kernel_hub.parse_spec(str(REPO)))
    gen = torch.Generator().manual_seed(0)

    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen) * scale).half()

    results: dict = {"interpreted": bool(mod.INTERPRETED)}
    b, s, hq, hkv, d = 3, 128, 4, 2, 64
    lengths = [50, 0, 100]
    for name, (dtype, kind, page, splits, fused) in CASES.items():
        if kind == "bh":
            kd = torch.rand(b, hkv, generator=gen) * 0.02 + 0.005
            vd = torch.rand(b, hkv, generator=gen) * 0.02 + 0.005
        elif kind == "tensor":
            kd, vd = torch.tensor([0.011]), torch.tensor([0.007])
        else:
            kd = vd = torch.ones(1)
        dense_k, dense_v = fp8_cache(rand(b, s, hkv, d), kd, dtype), fp8_cache(rand(b, s, hkv, d, scale=0.5), vd, dtype)
        table = None
        kc, vc = dense_k.clone(), dense_v.clone()
        if page:
            blocks = s // page
            table = torch.randperm(b * blocks + 2, generator=gen)[: b * blocks].view(b, blocks).to(torch.int32)
            kc = torch.zeros(b * blocks + 2, page, hkv, d, dtype=dtype)
            vc = torch.zeros_like(kc)
            kc[table.flatten().long()] = dense_k.view(-1, page, hkv, d)
            vc[table.flatten().long()] = dense_v.view(-1, page, hkv, d)
        q, kn, vn = rand(b, 1, hq, d), rand(b, 1, hkv, d), rand(b, 1, hkv, d, scale=0.5)
        seqlens = torch.tensor(lengths, dtype=torch.int32)
        kc0 = kc.clone()
        descales = {} if kind is None else {"k_descale": kd, "v_descale": vd}
        cfg = mod.DecodeConfig(block_n=32, fused_reduce=fused)
        out = mod.kvcache_attention(q, kc, vc, kn, vn, cache_seqlens=seqlens, block_table=table, causal=True,
                                    num_splits=splits, config=cfg, **descales)
        err = _features_errors()
        written, rest_untouched = True, True
        for i, n in enumerate(lengths):
            rows = (kc[table[i].long()].flatten(0, 1) if page else kc[i])[: n + 1]
            vrows = (vc[table[i].long()].flatten(0, 1) if page else vc[i])[: n + 1]
            kdi, vdi = (kd, vd) if kd.numel() == 1 else (kd[i : i + 1], vd[i : i + 1])
            written &= torch.equal(rows[n].view(torch.uint8), fp8_cache(kn[i : i + 1], kdi, dtype)[0, 0].view(torch.uint8))
            written &= torch.equal(vrows[n].view(torch.uint8), fp8_cache(vn[i : i + 1], vdi, dtype)[0, 0].view(torch.uint8))
            keys, vals = dequantized(rows[None], kdi)[0], dequantized(vrows[None], vdi)[0]
            err.add(out[i], q[i], keys, vals, True, d ** -0.5, 0.0, (-1, -1), None)
        changed = (kc.view(torch.uint8) != kc0.view(torch.uint8)).any(-1).any(-1)  # [rows, page] or [B, S]
        rest_untouched = int(changed.sum()) == len(lengths)
        results[name] = {**err.result(), "written": bool(written), "rest_untouched": bool(rest_untouched)}

    # the descale really is applied: the same call with the key descale off by 2x is far outside the rule
    kd, vd = torch.rand(b, hkv, generator=gen) * 0.02 + 0.005, torch.rand(b, hkv, generator=gen) * 0.02 + 0.005
    kc, vc = fp8_cache(rand(b, s, hkv, d), kd, E4M3), fp8_cache(rand(b, s, hkv, d), vd, E4M3)
    q = rand(b, 1, hq, d, scale=4.0)
    seqlens = torch.tensor(lengths, dtype=torch.int32)
    for label, kd_used, vd_used in (("right", kd, vd), ("k-off-2x", 2 * kd, vd), ("v-ignored", kd, None)):
        out = mod.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=seqlens, causal=True, num_splits=2,
                                          k_descale=kd_used, v_descale=vd_used)
        err = _features_errors()
        for i, n in enumerate(lengths):
            err.add(out[i], q[i], dequantized(kc[i : i + 1, :n], kd[i : i + 1])[0],
                    dequantized(vc[i : i + 1, :n], vd[i : i + 1])[0], True, d ** -0.5, 0.0, (-1, -1), None)
        results[f"descale/{label}"] = err.result()
    # v stored with the keys contiguous (the dense FP8 decode reads it as Vᵀ tiles): the same bytes, the same output
    # (32-key tiles over lengths 50, 0, 100 in two splits: whole tiles, read unmasked, and partial ones)
    vt = vc.transpose(1, 3).contiguous().transpose(1, 3)
    cfg = mod.DecodeConfig(block_n=32)
    plain = mod.kvcache_attention(q, kc, vc, cache_seqlens=seqlens, causal=True, num_splits=2, k_descale=kd,
                                  v_descale=vd, config=cfg)
    keys_contiguous = mod.kvcache_attention(q, kc, vt, cache_seqlens=seqlens, causal=True, num_splits=2, k_descale=kd,
                                            v_descale=vd, config=cfg)
    results["v-keys-contiguous"] = {"equal": bool(torch.equal(plain, keys_contiguous)), "stride": list(vt.stride())}

    # model features with an FP8 cache: softcap, a sliding window and sinks (the key descale meets the softcap)
    kd, vd = torch.rand(b, hkv, generator=gen) * 0.02 + 0.005, torch.rand(b, hkv, generator=gen) * 0.02 + 0.005
    kc, vc = fp8_cache(rand(b, s, hkv, d, scale=3.0), kd, E4M3), fp8_cache(rand(b, s, hkv, d), vd, E4M3)
    q, sinks = rand(b, 2, hq, d), torch.randn(hq, generator=gen).float()
    seqlens = torch.tensor([60, 1, 120], dtype=torch.int32)
    out = mod.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=seqlens, causal=True, num_splits=3, softcap=20.0,
                                      window_size=(23, 0), s_aux=sinks, k_descale=kd, v_descale=vd)
    err = _features_errors()
    for i, n in enumerate(seqlens.tolist()):
        err.add(out[i], q[i], dequantized(kc[i : i + 1, :n], kd[i : i + 1])[0],
                dequantized(vc[i : i + 1, :n], vd[i : i + 1])[0], True, d ** -0.5, 20.0, (23, 0), sinks)
    results["features"] = err.result()

    # appended values at the formats' edges, descale 1: the cache rows against torch's cast
    # (and 48 random values over eight decades: a head dim of 64)
    spread = torch.randn(48, generator=gen) * 10.0 ** (torch.rand(48, generator=gen) * 8 - 4)
    values = torch.cat([torch.tensor(EDGES), spread]).half().view(1, 1, 1, -1)
    for dtype in (E4M3, E5M2):
        kc = torch.zeros(1, 8, 1, 64, dtype=dtype)
        vc = torch.zeros_like(kc)
        kn = values
        mod.flash_attn_with_kvcache(torch.zeros(1, 1, 1, 64).half(), kc, vc, kn, -kn,
                                    cache_seqlens=torch.tensor([3], dtype=torch.int32), k_descale=torch.ones(1),
                                    v_descale=torch.ones(1))
        want = fp8_cache(kn, torch.ones(1), dtype)[0, 0, 0]
        got = kc[0, 3, 0]
        results[f"edges/{torch.finfo(dtype).max:.0f}"] = {
            "bits_equal": bool(torch.equal(got.view(torch.uint8), want.view(torch.uint8))),
            "v_bits_equal": bool(torch.equal(vc[0, 3, 0].view(torch.uint8),
                                             fp8_cache(-kn, torch.ones(1), dtype)[0, 0, 0].view(torch.uint8))),
            "got": got.float().tolist(), "want": want.float().tolist(), "finite": bool(got.float().isfinite().all())}
    return results


@pytest.fixture(scope="module")
def interp() -> dict:
    return run_child(__file__)


def test_child_ran_the_interpreter(interp):
    assert interp["interpreted"]


@pytest.mark.parametrize("case", list(CASES))
def test_fp8_cache_decode_with_append_matches_the_dequantised_oracle(interp, case):
    r = interp[case]
    within_rule(r)
    assert r["written"], "the appended k/v must land at cache_seqlens as torch's cast of x / descale"
    assert r["rest_untouched"], "nothing else in the cache may change"


def test_a_wrong_descale_is_far_outside_the_rule(interp):
    within_rule(interp["descale/right"])
    for label in ("k-off-2x", "v-ignored"):
        r = interp[f"descale/{label}"]
        assert r["err"] > 20 * r["eager"], (label, r)


def test_a_v_cache_stored_with_the_keys_contiguous_reads_the_same(interp):
    r = interp["v-keys-contiguous"]
    assert r["stride"][1] == 1 and r["equal"], r


@pytest.mark.parametrize("extra, words", [
    (dict(block_table=torch.zeros(2, 1, dtype=torch.int32)), "dense FP8 decode only"),
    (dict(k=torch.zeros(2, 1, 2, 64, dtype=torch.float16), v=torch.zeros(2, 1, 2, 64, dtype=torch.float16),
          cache_seqlens=torch.zeros(2, dtype=torch.int32)), "no k/v to append"),
], ids=["paged", "append"])
def test_a_keys_contiguous_v_cache_is_refused_where_it_is_not_read(extra, words):
    q, k, v = _fp8_args()
    v = v.transpose(1, 3).contiguous().transpose(1, 3)
    with pytest.raises(ValueError, match=words):
        _module().flash_attn_with_kvcache(q, k, v, k_descale=torch.ones(1), v_descale=torch.ones(1), **extra)


def test_softcap_window_and_sinks_over_an_fp8_cache(interp):
    within_rule(interp["features"])


@pytest.mark.parametrize("fmt", ["448", "57344"], ids=["e4m3", "e5m2"])
def test_appended_values_are_rounded_and_saturated_as_torch_casts(interp, fmt):
    r = interp[f"edges/{fmt}"]
    assert r["finite"], r["got"]
    assert r["bits_equal"] and r["v_bits_equal"], [(g, w) for g, w in zip(r["got"], r["want"]) if g != w]


def _module():
    from kernels import get_local_kernel

    return get_local_kernel(REPO)


def _fp8_args(dtype=E4M3, b=2, s=32, hkv=2, d=64):
    return (torch.randn(b, 1, 4, d, dtype=torch.float16), torch.zeros(b, s, hkv, d, dtype=dtype),
            torch.zeros(b, s, hkv, d, dtype=dtype))


def test_fp8_tensors_elsewhere_name_the_entry_point_that_reads_them():
    q = torch.randn(1, 8, 4, 64, dtype=torch.float16)
    k = torch.zeros(1, 8, 2, 64, dtype=E4M3)
    with pytest.raises(ValueError, match="FP8 runs through flash_attn_func with e4m3 q, k and v"):
        _module().flash_attn_func(q, k, k)


@pytest.mark.parametrize("change, words", [
    (dict(q=torch.zeros(2, 1, 4, 64, dtype=E4M3)), "q has dtype torch.float8_e4m3fn"),
    (dict(q_descale=torch.ones(1)), "q_descale is not supported"),
    (dict(k_descale=torch.ones(2, 3)), r"k_descale must be \[B=2, Hkv=2\]"),
    (dict(v_descale=torch.ones(2, 2, dtype=torch.float16)), "v_descale must be float32"),
    (dict(v_cache=torch.zeros(2, 32, 2, 64, dtype=E5M2)), "k_cache and v_cache must share one dtype"),
    (dict(k=torch.zeros(2, 1, 2, 64, dtype=E4M3), v=torch.zeros(2, 1, 2, 64, dtype=E4M3),
          cache_seqlens=torch.zeros(2, dtype=torch.int32)), "k has dtype torch.float8_e4m3fn"),
    (dict(k_cache=torch.zeros(2, 32, 2, 64, dtype=torch.float16), v_cache=torch.zeros(2, 32, 2, 64, dtype=torch.float16),
          k_descale=torch.ones(1)), "k_descale applies to an FP8 KV cache"),
    (dict(k_cache=torch.zeros(2, 32, 2, 64, dtype=torch.int8)), "a KV cache may also be float8_e4m3fn"),
], ids=["fp8-query", "q-descale", "descale-shape", "descale-dtype", "mixed-formats", "fp8-new-kv",
        "descale-16-bit-cache", "int8-cache"])
def test_bad_fp8_arguments_refused_before_launch(change, words):
    q, kc, vc = _fp8_args()
    args = {"q": q, "k_cache": kc, "v_cache": vc, **change}
    with pytest.raises(ValueError, match=words):
        _module().flash_attn_with_kvcache(**args)


if __name__ == "__main__":
    import json

    assert os.environ.get("TRITON_INTERPRET") == "1", "run the child with TRITON_INTERPRET=1"
    print(json.dumps(_child()))
