"""flash-triton's real Triton program on the CPU, through Triton's interpreter, against the fp64 oracle.

TRITON_INTERPRET=1 must be set before Triton is first imported (Triton's own `@jit` helpers such as `tl.max`
are decorated then), so the kernel runs in a child interpreter started with it: this file is also that child
(`python tests/test_kernel_interpret.py` prints one JSON line of measured errors); the tests below assert on it.
The child loads a copy of the repo through `kernels.get_local_kernel` and the registry's `kernel` variant.
Numerics rule: the kernel's norm-relative error against `reference_attention` is at most twice that of plain
eager attention (`naive`) in the same dtype. The interpreter gets bf16 `tl.dot` wrong (relative error ~1e9 on a
case that is right on the H200), so under it the kernel runs bf16 on float32 copies; both dtypes are checked here.
Bad inputs are refused before launch, so those tests run here, on a module loaded without the interpreter.
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import pytest
import torch

from interpreter_child import run_child

INTERPRETER_CHILD = True  # its child starts in the background once tests are collected (conftest.py)

ROOT = Path(__file__).resolve().parents[1]
REPO = ROOT / "kernels" / "flash-triton"

SHAPES = [  # (B, Hq, Hkv, Sq, Sk, D, causal): odd lengths, GQA, Sq != Sk both ways, decode
    (1, 2, 2, 97, 97, 64, True),
    (2, 4, 2, 100, 130, 64, True),
    (1, 2, 1, 150, 60, 64, True),
    (1, 2, 2, 1, 77, 128, True),
    (2, 2, 2, 65, 200, 128, False),
    (1, 4, 1, 129, 129, 128, False),
]
BF16_SHAPES = [(1, 2, 1, 70, 70, 64, True), (1, 2, 2, 64, 64, 64, False), (1, 2, 2, 70, 70, 64, False)]
CONFIGS = {"default": None, "tma-32x32": (32, 32, 4, 2, True), "ptr-64x32": (64, 32, 4, 2, False),
           # (block_m, block_n, warps, stages, tma, warp_specialize, overlap, poly_exp, lazy_rescale)
           "overlap-32x16": (32, 16, 4, 2, False, False, True),
           "polyexp-32x32": (32, 32, 4, 2, False, False, False, True),
           "lazy-32x16": (32, 16, 4, 2, False, False, False, False, True)}


def shape_id(s) -> str:
    return "x".join(map(str, s[:6])) + ("-causal" if s[6] else "-full")


# ---------------------------------------------------------------------------------------------------------------
# The child: runs with TRITON_INTERPRET=1 from its first import on.
# ---------------------------------------------------------------------------------------------------------------
def _child() -> dict:

    from attnprof.variants import VARIANTS, kernel_hub
    from attnprof.variants.naive import naive_attention
    from attnprof.variants.reference import reference_attention
    from attnprof.workload import Inputs, Workload

    def rel_err(out, ref):
        return ((out.double().nan_to_num(nan=float("inf")) - ref).norm() / ref.norm().clamp_min(1e-30)).item()

    def eager_err(inputs, ref):
        out = naive_attention(inputs).double()
        if inputs.valid is not None:  # eager gives NaN in rows that see no key
            out = out.masked_fill(~inputs.valid.any(-1, keepdim=True), 0.0)
        return rel_err(out, ref)

    mod = kernel_hub.load(kernel_hub.parse_spec(str(REPO)))
    results: dict = {"interpreted": bool(mod.INTERPRETED)}
    for shape in SHAPES:
        b, hq, hkv, sq, sk, d, causal = shape
        w = Workload(batch=b, heads=hq, kv_heads=hkv, seq=sq, kv_seq=sk, head_dim=d, dtype="fp16", causal=causal)
        inputs = w.make_inputs(seed=sq * 7 + sk)
        ref = reference_attention(inputs)
        base = eager_err(inputs, ref)
        q, k, v = (t.transpose(1, 2).contiguous() for t in (inputs.q, inputs.k, inputs.v))  # -> [B, S, H, D]
        for name, cfg in CONFIGS.items():
            config = mod.Config(*cfg) if cfg else None
            out = mod.attention(q, k, v, inputs.scale, causal, config=config).transpose(1, 2)  # -> [B, H, S, D]
            blind = max(0, sq - sk) if causal else 0  # rows that see no key
            results[f"{shape_id(shape)}/{name}"] = {
                "err": rel_err(out, ref), "eager": base, "shape_ok": tuple(out.shape) == tuple(ref.shape),
                "dtype": str(out.dtype), "blind_rows_zero": bool((out[:, :, :blind] == 0).all())}

    for shape in BF16_SHAPES:  # the cases the interpreter once got wrong in bf16 (values ~1e8), both dtypes
        b, hq, hkv, sq, sk, d, causal = shape
        for dtype in ("bf16", "fp16"):
            w = Workload(batch=b, heads=hq, kv_heads=hkv, seq=sq, kv_seq=sk, head_dim=d, dtype=dtype,
                         causal=causal)
            inputs = w.make_inputs(seed=sq + 1)
            ref = reference_attention(inputs)
            q, k, v = (t.transpose(1, 2) for t in (inputs.q, inputs.k, inputs.v))  # views, [B, S, H, D]
            out = mod.flash_attn_func(q, k, v, softmax_scale=inputs.scale, causal=causal).transpose(1, 2)
            results[f"dtype/{shape_id(shape)}/{dtype}"] = {"err": rel_err(out, ref), "eager": eager_err(inputs, ref),
                                                          "dtype": str(out.dtype)}

    w = Workload(batch=1, heads=2, seq=40, head_dim=64, dtype="fp16", causal=False)
    inputs = w.make_inputs(seed=3)
    scaled = Inputs(inputs.q, inputs.k, inputs.v, causal=False, scale=0.3)
    ref = reference_attention(scaled)
    q, k, v = (t.transpose(1, 2).contiguous() for t in (inputs.q, inputs.k, inputs.v))
    out = mod.flash_attn_func(q, k, v, softmax_scale=0.3, causal=False).transpose(1, 2)
    results["softmax_scale"] = {"err": rel_err(out, ref), "eager": eager_err(scaled, ref)}

    for transposed in (False, True):
        w = Workload(batch=2, heads=4, kv_heads=2, seq=70, kv_seq=90, head_dim=64, dtype="fp16",
                     transposed=transposed)
        verdict = VARIANTS["kernel"].supports(w)
        inputs = w.make_inputs(seed=11)
        ref = reference_attention(inputs)
        out = VARIANTS["kernel"](inputs)
        results[f"variant/transposed={transposed}"] = {"accepted": verdict.ok, "err": rel_err(out, ref),
                                                       "eager": eager_err(inputs, ref)}
    # the kernel variant hands [B, S, H, D] views of the workload's [B, H, S, D] tensors over: no layout copies
    seen: list = []
    plain = mod.flash_attn_func
    mod.flash_attn_func = lambda q, k, v, **kw: seen.append((q.data_ptr(), k.data_ptr(), v.data_ptr())) or plain(
        q, k, v, **kw)
    try:
        inputs = Workload(batch=2, heads=4, kv_heads=2, seq=70, head_dim=64, dtype="fp16").make_inputs(seed=2)
        VARIANTS["kernel"](inputs)
    finally:
        mod.flash_attn_func = plain
    results["variant_views"] = {"same_storage": seen == [(inputs.q.data_ptr(), inputs.k.data_ptr(),
                                                          inputs.v.data_ptr())]}
    # TMA over [B, S, H, D] views of [B, H, S, D] tensors: the 2-D view [B*H*S, D], a head's rows consecutive
    for shape in [(2, 4, 2, 70, 90, 64, True), (1, 2, 2, 40, 40, 128, False), (2, 2, 1, 33, 33, 64, True)]:
        b, hq, hkv, sq, sk, d, causal = shape
        w = Workload(batch=b, heads=hq, kv_heads=hkv, seq=sq, kv_seq=sk, head_dim=d, dtype="fp16", causal=causal)
        inputs = w.make_inputs(seed=sq)
        ref = reference_attention(inputs)
        q, k, v = (t.transpose(1, 2) for t in (inputs.q, inputs.k, inputs.v))
        out = mod.attention(q, k, v, inputs.scale, causal, config=mod.Config(32, 32, 4, 2, True))
        results[f"heads/{shape_id(shape)}"] = {"layout": mod.tma_layout(q, k, v), "err": rel_err(out.transpose(1, 2),
                                               ref), "eager": eager_err(inputs, ref),
                                               "out_is_bhsd": out.transpose(1, 2).is_contiguous()}
    # ... where a tile past Sk reads the next head's first rows: NaN/inf there must not leak into this head
    w = Workload(batch=1, heads=2, seq=40, head_dim=64, dtype="fp16", causal=False)
    inputs = w.make_inputs(seed=6)
    inputs.k[:, 1, :8] = float("nan")
    inputs.v[:, 1, :8] = float("inf")
    first = Inputs(inputs.q[:, :1], inputs.k[:, :1], inputs.v[:, :1], causal=False, scale=inputs.scale)
    ref = reference_attention(first)
    q, k, v = (t.transpose(1, 2) for t in (inputs.q, inputs.k, inputs.v))
    out = mod.attention(q, k, v, inputs.scale, False, config=mod.Config(32, 32, 4, 2, True)).transpose(1, 2)[:, :1]
    results["heads_neighbour_inf"] = {"finite": bool(out.isfinite().all()), "err": rel_err(out, ref),
                                      "eager": eager_err(first, ref)}
    # head dims 80 and 96 (padded to 128 columns inside) and 256, on every entry point, fp16 and bf16
    for d in (80, 96, 256):
        for dtype in ("fp16", "bf16"):
            for b, hq, hkv, sq, sk, causal in ((2, 4, 2, 37, 53, True), (1, 2, 1, 1, 45, True)):  # prefill, decode
                w = Workload(batch=b, heads=hq, kv_heads=hkv, seq=sq, kv_seq=sk, head_dim=d, dtype=dtype,
                             causal=causal)
                inputs = w.make_inputs(seed=d + sq)
                ref = reference_attention(inputs)
                q, k, v = (t.transpose(1, 2) for t in (inputs.q, inputs.k, inputs.v))
                out = mod.flash_attn_func(q, k, v, softmax_scale=inputs.scale, causal=causal).transpose(1, 2)
                results[f"hd{d}/dense/{dtype}/sq{sq}"] = {"err": rel_err(out, ref), "eager": eager_err(inputs, ref)}
        # varlen: three sequences, one empty; kvcache: a paged cache, new keys appended, three splits
        w = Workload(batch=1, heads=4, kv_heads=2, seq=33, kv_seq=33, head_dim=d, dtype="fp16", causal=True)
        inputs = w.make_inputs(seed=d)
        ref = reference_attention(inputs)
        q, k, v = (t.transpose(1, 2)[0] for t in (inputs.q, inputs.k, inputs.v))  # [S, H, D], one sequence
        pad = lambda t: torch.cat([t.new_zeros(5, *t.shape[1:]), t])  # noqa: E731 - a 5-row sequence before it
        cu = torch.tensor([0, 5, 5, 38], dtype=torch.int32)
        out = mod.flash_attn_varlen_func(pad(q), pad(k), pad(v), cu, cu, 33, 33, softmax_scale=inputs.scale,
                                         causal=True)[5:]
        results[f"hd{d}/varlen"] = {"err": rel_err(out[None].transpose(1, 2), ref), "eager": eager_err(inputs, ref)}
        w = Workload(batch=1, heads=4, kv_heads=2, seq=1, kv_seq=40, head_dim=d, dtype="fp16", causal=True)
        inputs = w.make_inputs(seed=d + 1)
        ref = reference_attention(inputs)
        q, k, v = (t.transpose(1, 2) for t in (inputs.q, inputs.k, inputs.v))
        cache_k, cache_v = (torch.zeros(4, 16, 2, d, dtype=torch.float16) for _ in range(2))  # 4 pages of 16
        table = torch.tensor([[2, 0, 3]], dtype=torch.int32)
        for j, page in enumerate((2, 0, 3)):  # the first 39 keys cached, the 40th appended by the call
            cache_k[page, : min(16, 39 - 16 * j)] = k[0, 16 * j: min(16 * j + 16, 39)]
            cache_v[page, : min(16, 39 - 16 * j)] = v[0, 16 * j: min(16 * j + 16, 39)]
        out = mod.flash_attn_with_kvcache(q, cache_k, cache_v, k[:, 39:], v[:, 39:],
                                          cache_seqlens=torch.tensor([39], dtype=torch.int32), block_table=table,
                                          softmax_scale=inputs.scale, causal=True, num_splits=3)
        results[f"hd{d}/kvcache"] = {"err": rel_err(out.transpose(1, 2), ref), "eager": eager_err(inputs, ref),
                                     "appended": bool(torch.equal(cache_k[3, 7], k[0, 39]))}
    # bf16 through the interpreter: varlen and kvcache refuse it before launch (they returned ~1e9 garbage silently)
    refusals = {}
    qb, kb = torch.randn(6, 2, 64).bfloat16(), torch.randn(6, 2, 64).bfloat16()
    cu6 = torch.tensor([0, 6], dtype=torch.int32)
    calls = {"varlen": lambda: mod.flash_attn_varlen_func(qb, kb, kb, cu6, cu6, 6, 6, causal=True),
             "kvcache": lambda: mod.flash_attn_with_kvcache(qb[None, :1], kb[None], kb[None], causal=True)}
    for name, call in calls.items():
        try:
            call()
            refusals[name] = "ran"
        except ValueError as e:
            refusals[name] = str(e)
    results["bf16_refused"] = refusals
    # inf/NaN in one batch's first keys/values must not leak into the previous batch's last (partial) TMA tile
    w = Workload(batch=2, heads=2, seq=40, head_dim=64, dtype="fp16", causal=False)
    inputs = w.make_inputs(seed=5)
    q, k, v = (t.transpose(1, 2).contiguous() for t in (inputs.q, inputs.k, inputs.v))  # -> [B, S, H, D]
    v[1, :8] = float("inf")
    k[1, :8] = float("nan")
    first = Inputs(inputs.q[:1], inputs.k[:1], inputs.v[:1], causal=False, scale=inputs.scale)
    ref = reference_attention(first)
    out = mod.attention(q, k, v, inputs.scale, False, config=mod.Config(32, 32, 4, 2, True)).transpose(1, 2)[:1]
    results["tma_neighbour_inf"] = {"finite": bool(out.isfinite().all()), "err": rel_err(out, ref),
                                    "eager": eager_err(first, ref)}
    # lazy rescale: a key block late in the sequence whose scores jump far above the running max must still
    # rescale (else exp2 of the stale-max scores overflows fp16); blocks before it take the skip branch
    w = Workload(batch=1, heads=2, seq=32, kv_seq=96, head_dim=64, dtype="fp16", causal=False)
    inputs = w.make_inputs(seed=9)
    inputs.k[:, :, 64:80] *= 6.0
    ref = reference_attention(inputs)
    q, k, v = (t.transpose(1, 2).contiguous() for t in (inputs.q, inputs.k, inputs.v))
    out = mod.attention(q, k, v, inputs.scale, False, config=mod.Config(*CONFIGS["lazy-32x16"])).transpose(1, 2)
    results["lazy_jump"] = {"finite": bool(out.isfinite().all()), "err": rel_err(out, ref),
                            "eager": eager_err(inputs, ref)}
    # the Gluon program has no interpreter: never chosen here, and refused with the reason when asked for
    q, k = (t.transpose(1, 2).contiguous() for t in (inputs.q, inputs.k))
    ws = mod.Config(128, 128, 4, 3, gluon=True, warp_specialize=True)
    try:
        mod.attention(q, k, k, None, False, config=ws)
        refused = ""
    except ValueError as e:
        refused = str(e)
    results["gluon_on_cpu"] = {"chosen": mod.choose_config(q, k, False).label(), "refused": refused}
    # the plan of a call signature is remembered: a repeat reuses it; a view 2 bytes off TMA's 16-byte alignment is
    # another signature, and gets pointer loads
    w = Workload(batch=1, heads=2, seq=40, head_dim=64, dtype="fp16", causal=True)
    inputs = w.make_inputs(seed=11)
    ref = reference_attention(inputs)
    tma = mod.Config(32, 32, 4, 2, True)
    q, k, v = (t.transpose(1, 2).contiguous() for t in (inputs.q, inputs.k, inputs.v))
    before = len(mod._PLANS)
    first = mod.attention(q, k, v, inputs.scale, True, config=tma)
    after_first = len(mod._PLANS)
    second = mod.attention(q, k, v, inputs.scale, True, config=tma)
    after_second = len(mod._PLANS)
    off = [torch.cat([t.new_zeros(1), t.flatten()])[1:].view(t.shape) for t in (q, k, v)]  # data_ptr % 16 == 2
    shifted = mod.attention(*off, inputs.scale, True, config=tma)
    plans = {p[1].use_tma for key, p in mod._PLANS.items() if tma in key and p[0] == "triton"}  # key: _signature
    results["plan_cache"] = {"new_plans": [after_first - before, after_second - after_first, len(mod._PLANS) - after_second],
                             "repeat_equal": bool(torch.equal(first, second)), "tma_kinds": sorted(plans),
                             "offset_ptr": off[0].data_ptr() % 16,
                             "err": rel_err(first.transpose(1, 2), ref), "shifted_err": rel_err(shifted.transpose(1, 2), ref),
                             "eager": eager_err(inputs, ref)}
    results["transformers"] = _child_transformers(kernel_hub, rel_err)
    return results


def _child_transformers(kernel_hub, rel_err) -> dict:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from attnprof.models.attention import register_variant

    name = register_variant(kernel_hub.KERNEL)  # the one AttentionInterface adapter, built from the variant
    cfg = LlamaConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=1, head_dim=64, vocab_size=97, max_position_embeddings=64)
    torch.manual_seed(0)
    models = {}
    for label, dtype, impl in (("ours", torch.float16, name), ("eager16", torch.float16, "eager"),
                               ("ref", torch.float64, "eager")):
        model = LlamaForCausalLM(copy.deepcopy(cfg)).eval()  # own config: set_attn_implementation writes to it
        if models:
            model.load_state_dict(models["ours"].state_dict())
        model = model.to(dtype)
        model.set_attn_implementation(impl)
        models[label] = model
    ids = torch.randint(0, 97, (2, 37))
    with torch.no_grad():
        want = models["ref"](ids).logits
        got, base = models["ours"](ids).logits, models["eager16"](ids).logits
        mask = torch.ones_like(ids)
        mask[0, :5] = 0
        # left padding: a bool mask whose rows are one key range each, through flash_attn_with_kvcache (leftpad)
        padded = models["ours"](ids, attention_mask=mask).logits[0, 5:]
        pos = torch.arange(5, 37)[None]
        want0 = models["ref"](ids[:1, 5:], position_ids=pos).logits[0]
        base0 = models["eager16"](ids[:1, 5:], position_ids=pos).logits[0]
    used = models["ours"].config._attn_implementation
    return {"name": name, "used": used, "err": rel_err(got, want), "eager": rel_err(base, want),
            "padded": {"err": rel_err(padded, want0), "eager": rel_err(base0, want0)}}


# ---------------------------------------------------------------------------------------------------------------
# The tests
# ---------------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def interp() -> dict:
    return run_child(__file__)


def test_child_ran_the_interpreter(interp):
    assert interp["interpreted"]


@pytest.mark.parametrize("cfg", list(CONFIGS))
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_matches_oracle_within_twice_eager(interp, shape, cfg):
    r = interp[f"{shape_id(shape)}/{cfg}"]
    assert r["shape_ok"] and r["dtype"] == "torch.float16"
    assert r["err"] <= 2 * r["eager"], f"kernel error {r['err']:.3g} > 2 x eager fp16 error {r['eager']:.3g}"
    assert r["blind_rows_zero"], "rows that see no key must be zeros"


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("shape", BF16_SHAPES, ids=shape_id)
def test_both_dtypes_match_the_oracle_through_the_interpreter(interp, shape, dtype):
    """bf16 once came back as garbage (~1e8) under the interpreter, with no warning: never a silent wrong answer."""
    r = interp[f"dtype/{shape_id(shape)}/{dtype}"]
    assert r["dtype"] == {"bf16": "torch.bfloat16", "fp16": "torch.float16"}[dtype]
    assert r["err"] <= 2 * r["eager"], f"kernel error {r['err']:.3g} > 2 x eager {dtype} error {r['eager']:.3g}"


def test_non_finite_values_in_the_next_batch_do_not_leak_through_a_tma_tile(interp):
    """A TMA tile past the end of batch 0's keys reads batch 1's first rows; their inf/NaN must not reach batch 0."""
    r = interp["tma_neighbour_inf"]
    assert r["finite"] and r["err"] <= 2 * r["eager"], r


@pytest.mark.parametrize("key", [f"hd{d}/{case}" for d in (80, 96, 256) for case in
                                 ("dense/fp16/sq37", "dense/bf16/sq37", "dense/fp16/sq1", "dense/bf16/sq1", "varlen",
                                  "kvcache")])
def test_head_dims_80_96_256_match_the_oracle_on_every_entry_point(interp, key):
    r = interp[key]
    assert r["err"] <= 2 * r["eager"], r
    assert r.get("appended", True), r  # the new key landed in its page (position 39 = page 3, row 7)


@pytest.mark.parametrize("entry", ["varlen", "kvcache"])
def test_bf16_through_the_interpreter_is_refused_where_it_would_be_wrong(interp, entry):
    assert "bfloat16 through Triton's interpreter" in interp["bf16_refused"][entry], interp["bf16_refused"]


def test_kernel_variant_passes_views_not_copies(interp):
    assert interp["variant_views"]["same_storage"], interp["variant_views"]


@pytest.mark.parametrize("key", ["heads/2x4x2x70x90x64-causal", "heads/1x2x2x40x40x128-full",
                                 "heads/2x2x1x33x33x64-causal", "heads_neighbour_inf"])
def test_tma_reads_views_of_the_heads_major_layout(interp, key):
    r = interp[key]
    assert r.get("layout", "heads") == "heads" and r.get("out_is_bhsd", True) and r.get("finite", True), r
    assert r["err"] <= 2 * r["eager"], r


def test_lazy_rescale_follows_a_max_that_jumps_late(interp):
    r = interp["lazy_jump"]
    assert r["finite"] and r["err"] <= 2 * r["eager"], r


def test_gluon_program_is_never_chosen_on_the_cpu_and_refused_when_asked(interp):
    r = interp["gluon_on_cpu"]
    assert "gluon" not in r["chosen"]
    assert "needs a CUDA GPU" in r["refused"] and "ws gluon" in r["refused"], r


def test_a_call_signature_is_planned_once_and_alignment_is_part_of_it(interp):
    r = interp["plan_cache"]
    assert r["new_plans"] == [1, 0, 1], r  # a repeat is not re-planned; the misaligned views are
    assert r["repeat_equal"] and r["offset_ptr"] != 0, r
    assert r["tma_kinds"] == [False, True], r  # the aligned call kept TMA, the misaligned one got pointer loads
    assert r["err"] <= 2 * r["eager"] and r["shifted_err"] <= 2 * r["eager"], r


def test_softmax_scale_is_used(interp):
    r = interp["softmax_scale"]
    assert r["err"] <= 2 * r["eager"]


@pytest.mark.parametrize("transposed", [False, True])
def test_kernel_variant_through_registry(interp, transposed):
    r = interp[f"variant/transposed={transposed}"]
    assert r["accepted"] and r["err"] <= 2 * r["eager"]


def test_transformers_attention_implementation(interp):
    r = interp["transformers"]
    assert r["name"] == r["used"] == "attnprof_kernel"
    assert r["err"] <= 2 * r["eager"], r
    assert r["padded"]["err"] <= 2 * r["padded"]["eager"], r  # left padding runs (it was refused) and is right


def _tensors(b=1, sq=16, sk=16, hq=2, hkv=2, d=64, dtype=torch.float16):
    return (torch.randn(b, sq, hq, d, dtype=dtype), torch.randn(b, sk, hkv, d, dtype=dtype),
            torch.randn(b, sk, hkv, d, dtype=dtype))


def test_gluon_configs_are_refused_by_shape_before_any_compile():
    """Which Gluon config can be built at which head dim is decided from the config alone (shared memory, registers,
    the program's form), with the reason; head dim 256 only on the warp-specialized program."""
    from kernels import get_local_kernel

    mod = get_local_kernel(REPO)
    C = mod.Config
    ws = dict(gluon=True, warp_specialize=True)
    assert mod.gluon_shape_problem(C(128, 64, 4, 2, **ws), 256, "heads") is None
    assert mod.gluon_shape_problem(C(128, 128, 4, 3, **ws), 128, "heads") is None  # the default at 128: 224 KiB, fits
    assert "warp-specialized" in mod.gluon_shape_problem(C(64, 64, 4, 3, gluon=True), 256, "heads")
    assert "warp-specialized" in mod.gluon_shape_problem(C(128, 64, 4, 2, persistent=True, **ws), 256, "heads")
    assert "448 KiB of shared memory" in mod.gluon_shape_problem(C(128, 128, 4, 3, **ws), 256, "heads")
    assert "288 KiB of shared memory" in mod.gluon_shape_problem(C(128, 128, 4, 4, **ws), 128, "heads")
    assert "registers" in mod.gluon_shape_problem(C(128, 128, 4, 1, **ws), 256, "heads")
    assert mod.gluon_shape_problem(C(128, 128, 4, 3, **ws), 80, "heads") is None  # zero-padded to 128: D=128's budget
    assert "warp-specialized" in mod.gluon_shape_problem(C(64, 64, 4, 3, gluon=True), 96, "heads")
    assert "head dims 64, 80, 96, 128, 256 (got 72" in mod.gluon_shape_problem(C(128, 64, 4, 2, **ws), 72, "heads")
    assert "next head's" in mod.gluon_shape_problem(C(128, 128, 4, 3, **ws), 80, "rows")  # padding = next head
    assert mod.gluon_shape_problem(C(128, 128, 4, 3, **ws), 128, "rows") is None


def test_every_program_the_dispatch_rule_picks_can_be_built_for_its_inputs():
    """`gluon_preferred` (what the H200 measured) only ever names a Gluon config that fits its head dim, and a
    ragged call only the varlen form (a dense Gluon program's TMA store would cross a sequence end)."""
    from kernels import get_local_kernel

    mod = get_local_kernel(REPO)
    picked = set()
    for d in mod.SUPPORTED_HEAD_DIMS:
        for causal in (True, False):
            for sk in (512, 1024, 2048, 8192, 16384):
                for aligned in (True, False):
                    cfg = mod.gluon_preferred(d, causal, sk, aligned)
                    if cfg is None:
                        continue
                    picked.add(cfg.label())
                    assert mod.gluon_shape_problem(cfg, d, "heads") is None, (d, causal, sk, aligned, cfg.label())
                    assert cfg.varlen == (not aligned), (d, causal, sk, aligned, cfg.label())
    # the programs it ships: warp-specialized (and varlen, and in LPT order), its 256 tiles, the one-warpgroup 64x128
    # and 64x64
    assert {"128x128 w4 s3 tma ws gluon", "128x128 w4 s3 tma ws gluon varlen", "128x64 w4 s2 tma ws gluon",
            "128x64 w4 s2 tma ws gluon varlen", "64x128 w4 s2 tma gluon", "64x64 w4 s3 tma gluon",
            "128x128 w4 s3 tma ws gluon lpt"} == picked
    assert mod.gluon_preferred(128, True, 4096, True).lpt and not mod.gluon_preferred(128, True, 16384, True).lpt
    assert not mod.gluon_preferred(128, False, 4096, True).lpt and not mod.gluon_preferred(256, True, 4096, True).lpt


@pytest.mark.parametrize("make, words", [
    (lambda: _tensors(dtype=torch.float32), "float16 and bfloat16 only"),
    (lambda: _tensors(d=100), "head dim 100 is not supported; .* nearest supported: 96;"),
    (lambda: _tensors(hq=3, hkv=2), "multiple of kv heads"),
    (lambda: (lambda q, k, v: (q[..., ::2], k[..., ::2], v[..., ::2]))(*_tensors()), "contiguous last"),
    (lambda: (lambda q, k, v: (q, k, v[:, :8].contiguous()))(*_tensors()), "same shape"),
    (lambda: (lambda q, k, v: (q, k[..., :32].contiguous(), v[..., :32].contiguous()))(*_tensors()), "head dim of q"),
    (lambda: (lambda q, k, v: (q[0], k, v))(*_tensors()), "must be 4-D"),
    (lambda: _tensors(), "TRITON_INTERPRET=1"),  # valid tensors, but this process has no interpreter
], ids=["fp32", "d100", "gqa", "strided", "kv-shapes", "kv-head-dim", "3d", "cpu-no-interpreter"])
def test_bad_inputs_refused_before_launch(make, words):
    from kernels import get_local_kernel

    mod = get_local_kernel(REPO)
    if mod.INTERPRETED:
        pytest.skip("this process runs Triton's interpreter; the refusal of CPU tensors is not reachable")
    for _ in range(2):  # a refusal is never remembered as a plan: the same call is refused again
        with pytest.raises(ValueError, match=words):
            mod.flash_attn_func(*make())


if __name__ == "__main__":
    assert os.environ.get("TRITON_INTERPRET") == "1", "run the child with TRITON_INTERPRET=1"
    print(json.dumps(_child()))
