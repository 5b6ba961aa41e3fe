"""flash-triton compiled on a real GPU (Hopper: TMA loads), against the fp64 oracle. `make test-gpu` runs these.

Same numerics rule as the interpreter tests: norm-relative error against `reference_attention` at most twice
that of plain eager attention in the same dtype; here bf16 too, which the interpreter cannot check.
"""

from __future__ import annotations

import pytest
import torch

from attnprof.variants import VARIANTS, kernel_hub
from attnprof.variants.naive import naive_attention
from attnprof.variants.reference import reference_attention
from attnprof.workload import Inputs, Workload

pytestmark = pytest.mark.cuda

CASES = [  # (B, Hq, Hkv, Sq, Sk, D, dtype, causal)
    (2, 8, 8, 1024, 1024, 128, "bf16", True),
    (2, 8, 2, 1000, 1000, 128, "bf16", False),
    (3, 4, 4, 1025, 1025, 64, "bf16", True),
    (2, 8, 8, 513, 513, 64, "fp16", False),
    (2, 4, 1, 97, 300, 128, "fp16", True),
    (2, 4, 4, 300, 97, 64, "bf16", True),
    (1, 4, 4, 1, 777, 128, "bf16", True),
    (2, 8, 2, 512, 1536, 128, "fp16", True),  # aligned, Sq < Sk, GQA: the Gluon program takes these two
    (1, 8, 8, 2048, 2048, 64, "bf16", True),
    (1, 8, 2, 512, 1024, 128, "bf16", False),  # aligned, not causal: the Gluon programs' non-causal path
]


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.double().nan_to_num(nan=float("inf")) - ref).norm() / ref.norm().clamp_min(1e-30)).item()


@pytest.fixture(scope="module")
def mod():
    module = kernel_hub.load()
    assert not isinstance(module, type(None)) and hasattr(module, "attention"), module
    return module


PATHS = {"default": None, "ptr": dict(block_m=128, block_n=64, num_warps=8, num_stages=3, use_tma=False),
         "overlap": dict(block_m=64, block_n=64, num_warps=4, num_stages=3, use_tma=True, overlap=True),
         "overlap-ptr": dict(block_m=128, block_n=64, num_warps=8, num_stages=3, use_tma=False, overlap=True),
         "poly-exp": dict(block_m=64, block_n=64, num_warps=4, num_stages=3, use_tma=True, poly_exp=True),
         "lazy": dict(block_m=64, block_n=64, num_warps=4, num_stages=3, use_tma=True, lazy_rescale=True),
         "gluon": dict(block_m=64, block_n=64, num_warps=4, num_stages=3, gluon=True),
         "gluon-8w": dict(block_m=128, block_n=128, num_warps=8, num_stages=2, gluon=True),
         "gluon-ws": dict(block_m=128, block_n=64, num_warps=4, num_stages=3, gluon=True, warp_specialize=True),
         "gluon-ws-128": dict(block_m=128, block_n=128, num_warps=4, num_stages=2, gluon=True, warp_specialize=True),
         "gluon-wsp": dict(block_m=128, block_n=128, num_warps=4, num_stages=3, gluon=True, warp_specialize=True,
                           persistent=True),
         "gluon-ws-varlen": dict(block_m=128, block_n=128, num_warps=4, num_stages=3, gluon=True, warp_specialize=True,
                                 varlen=True),
         "gluon-lpt": dict(block_m=64, block_n=64, num_warps=4, num_stages=3, gluon=True, lpt=True),
         "gluon-ws-lpt": dict(block_m=128, block_n=128, num_warps=4, num_stages=3, gluon=True, warp_specialize=True,
                              lpt=True),
         "gluon-ws-varlen-lpt": dict(block_m=128, block_n=128, num_warps=4, num_stages=3, gluon=True,
                                     warp_specialize=True, varlen=True, lpt=True),
         "gluon-ws-varlen-192": dict(block_m=192, block_n=128, num_warps=4, num_stages=3, gluon=True,
                                     warp_specialize=True, varlen=True, lpt=True),
         # one score exponential in 2 / 4 as a polynomial on the FMA pipes (`Config.exp_poly`)
         "gluon-exp-poly": dict(block_m=64, block_n=128, num_warps=4, num_stages=2, gluon=True, exp_poly=2),
         "gluon-ws-exp-poly": dict(block_m=128, block_n=128, num_warps=4, num_stages=3, gluon=True,
                                   warp_specialize=True, exp_poly=4),
         "gluon-ws-split-mask": dict(block_m=128, block_n=128, num_warps=4, num_stages=3, gluon=True,
                                     warp_specialize=True, split_mask=True),
         # the consumers' matmuls issued in turns (`Config.pingpong`)
         "gluon-ws-pingpong": dict(block_m=128, block_n=128, num_warps=4, num_stages=3, gluon=True,
                                   warp_specialize=True, pingpong=True),
         "gluon-wsp-pingpong": dict(block_m=128, block_n=128, num_warps=4, num_stages=3, gluon=True,
                                    warp_specialize=True, persistent=True, pingpong=True),
         # each key block's values waited for at the end of its softmax (`Config.v_wait_early`)
         "gluon-v-wait-early": dict(block_m=64, block_n=128, num_warps=4, num_stages=2, gluon=True, v_wait_early=True),
         "gluon-ws-v-wait-early": dict(block_m=128, block_n=128, num_warps=4, num_stages=3, gluon=True,
                                       warp_specialize=True, v_wait_early=True),
         "gluon-ws-varlen-v-wait-early": dict(block_m=128, block_n=128, num_warps=4, num_stages=3, gluon=True,
                                              warp_specialize=True, varlen=True, v_wait_early=True),
         "gluon-wsp-v-wait-early": dict(block_m=128, block_n=128, num_warps=4, num_stages=3, gluon=True,
                                        warp_specialize=True, persistent=True, v_wait_early=True),
         "gluon-ws-pingpong-v-wait-early": dict(block_m=128, block_n=128, num_warps=4, num_stages=3, gluon=True,
                                                warp_specialize=True, pingpong=True, v_wait_early=True),
         "gluon-ws-varlen-192-v-wait-early": dict(block_m=192, block_n=128, num_warps=4, num_stages=3, gluon=True,
                                                  warp_specialize=True, varlen=True, lpt=True, v_wait_early=True)}


def oracle_case(case: tuple, d: int):
    """bf16 inputs of a (B, Hq, Hkv, Sq, Sk, causal) case at head dim d on the GPU, their fp64 reference and plain
    PyTorch's output (the error bound's baseline)."""
    b, hq, hkv, sq, sk, causal = case
    w = Workload(batch=b, heads=hq, kv_heads=hkv, seq=sq, kv_seq=sk, head_dim=d, dtype="bf16", causal=causal,
                 device="cuda")
    inputs = w.make_inputs(seed=d + sq)
    return inputs, reference_attention(inputs), naive_attention(inputs).double()


def both_layouts(inputs):
    """The inputs as contiguous [B, S, H, D] tensors ("rows", flash-attn's layout) and as [B, S, H, D] views of the
    [B, H, S, D] tensors ("heads", what PyTorch and transformers models pass)."""
    return (("rows", tuple(t.transpose(1, 2).contiguous() for t in (inputs.q, inputs.k, inputs.v))),
            ("heads", tuple(t.transpose(1, 2) for t in (inputs.q, inputs.k, inputs.v))))


def refused_for_its_shape(cfg, sq: int, sk: int, causal: bool, d: int = 64) -> bool:
    """The shape rules a Gluon config is refused by (anything else refused would be a bug)."""
    if cfg.block_m == 192 and d != 64:  # three consumer warpgroups: head dim 64 only
        return True
    if cfg.varlen:
        return sk < cfg.block_n
    return bool(sq % cfg.block_m or sk % cfg.block_n or (causal and sq > sk))


@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize("case", CASES, ids=lambda c: "x".join(map(str, c[:6])) + f"-{c[6]}-{'causal' if c[7] else 'full'}")
def test_matches_oracle_within_twice_eager(mod, case, path):
    b, hq, hkv, sq, sk, d, dtype, causal = case
    w = Workload(batch=b, heads=hq, kv_heads=hkv, seq=sq, kv_seq=sk, head_dim=d, dtype=dtype, causal=causal,
                 device="cuda")
    inputs = w.make_inputs(seed=sq + sk)
    ref = reference_attention(inputs)
    eager = naive_attention(inputs).double()
    if inputs.valid is not None:
        eager = eager.masked_fill(~inputs.valid.any(-1, keepdim=True), 0.0)
    q, k, v = (t.transpose(1, 2).contiguous() for t in (inputs.q, inputs.k, inputs.v))  # -> [B, S, H, D]
    cfg = None if PATHS[path] is None else mod.Config(**PATHS[path])
    if cfg is not None and cfg.gluon and (why := mod.gluon_unsupported(q, k, causal, cfg)):
        with pytest.raises(ValueError, match="Gluon program"):  # refused with the reason, never run wrong
            mod.attention(q, k, v, inputs.scale, causal, config=cfg)
        assert refused_for_its_shape(cfg, sq, sk, causal, d), why
        return
    out = mod.attention(q, k, v, inputs.scale, causal, config=cfg).transpose(1, 2)
    err, base = rel_err(out, ref), rel_err(eager, ref)
    assert err <= 2 * base, f"kernel error {err:.3g} > 2 x eager {dtype} error {base:.3g}"
    if causal and sq > sk:
        assert (out[:, :, : sq - sk] == 0).all()


@pytest.mark.parametrize("path", ["default", "gluon", "gluon-ws", "gluon-ws-128", "gluon-wsp", "gluon-ws-varlen",
                                  "gluon-ws-lpt", "gluon-ws-varlen-lpt", "gluon-ws-varlen-192", "gluon-ws-exp-poly",
                                  "gluon-ws-pingpong", "gluon-wsp-pingpong", "gluon-v-wait-early",
                                  "gluon-ws-v-wait-early", "gluon-ws-varlen-v-wait-early", "gluon-wsp-v-wait-early",
                                  "gluon-ws-pingpong-v-wait-early", "gluon-ws-varlen-192-v-wait-early"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "x".join(map(str, c[:6])) + f"-{c[6]}-{'causal' if c[7] else 'full'}")
def test_views_of_the_heads_major_layout_match_oracle(mod, case, path):
    """`[B, S, H, D]` views of PyTorch's `[B, H, S, D]` tensors, as the `kernel` variant hands them over (no copy):
    TMA and the Gluon programs read them as `[B*H*S, D]`; the output comes back in q's layout."""
    b, hq, hkv, sq, sk, d, dtype, causal = case
    w = Workload(batch=b, heads=hq, kv_heads=hkv, seq=sq, kv_seq=sk, head_dim=d, dtype=dtype, causal=causal,
                 device="cuda")
    inputs = w.make_inputs(seed=sq + sk + 1)
    ref = reference_attention(inputs)
    eager = naive_attention(inputs).double()
    if inputs.valid is not None:
        eager = eager.masked_fill(~inputs.valid.any(-1, keepdim=True), 0.0)
    q, k, v = (t.transpose(1, 2) for t in (inputs.q, inputs.k, inputs.v))  # views, [B, S, H, D]
    assert mod.tma_layout(q, k, v) == ("rows" if sq == sk == 1 or hq == hkv == 1 else "heads")
    cfg = None if PATHS[path] is None else mod.Config(**PATHS[path])
    if cfg is not None and cfg.gluon and (why := mod.gluon_unsupported(q, k, causal, cfg)):
        with pytest.raises(ValueError, match="Gluon program"):
            mod.attention(q, k, v, inputs.scale, causal, config=cfg)
        assert refused_for_its_shape(cfg, sq, sk, causal, d), why  # the persistent form reads these views too
        return
    out = mod.attention(q, k, v, inputs.scale, causal, config=cfg)
    assert out.transpose(1, 2).is_contiguous() or sq == 1  # q's layout
    out = out.transpose(1, 2)
    err, base = rel_err(out, ref), rel_err(eager, ref)
    assert err <= 2 * base, f"kernel error {err:.3g} > 2 x eager {dtype} error {base:.3g}"


@pytest.mark.parametrize("path", ["gluon-lpt", "gluon-ws-lpt", "gluon-ws-varlen-lpt"])
def test_lpt_order_with_a_partial_l2_section_matches_oracle(mod, path, monkeypatch):
    """`Config.lpt` with L2 sized for 8 heads' K/V while the call has 3 x 4 = 12 (batch, head)s: one full section and
    a partial one of 4 (`_gluon.tile_order`); every tile is computed once, in both layouts, causal."""
    d, sk = 128, 1024
    monkeypatch.setattr(mod._config, "L2_BYTES", 8 * sk * 2 * d * 2)
    inputs, ref, eager = oracle_case((3, 4, 2, sk, sk, True), d)
    cfg = mod.Config(**PATHS[path])
    for layout, (q, k, v) in both_layouts(inputs):
        assert mod.l2_heads(sk, d, 2, 12) == 8
        out = mod.attention(q, k, v, inputs.scale, True, config=cfg).transpose(1, 2)
        err, base = rel_err(out, ref), rel_err(eager, ref)
        assert err <= 2 * base, f"{layout}: kernel error {err:.3g} > 2 x eager error {base:.3g}"


@pytest.mark.parametrize("path", ["gluon-wsp", "gluon-wsp-pingpong", "gluon-wsp-v-wait-early"])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_the_persistent_program_walks_many_tiles_per_cta_in_its_plan(mod, causal, d, path, monkeypatch):
    """`Config.persistent`: 2 x 16 x 2k is 512 tiles of 1-16 key blocks, several per CTA in its plan
    (`_plan.lpt_plan`), the K/V ring's stages and phases carried from tile to tile (with `pingpong`, the turns too),
    with GQA and L2 sections of 8 of the 32 (batch, head)s, in both layouts: every tile computed once, within the
    oracle bound."""
    s = 2048
    monkeypatch.setattr(mod._config, "L2_BYTES", 8 * s * 2 * d * 2)
    inputs, ref, eager = oracle_case((2, 16, 4, s, s, causal), d)
    assert mod.l2_heads(s, d, 2, 32) == 8
    for layout, (q, k, v) in both_layouts(inputs):
        out = mod.attention(q, k, v, inputs.scale, causal, config=mod.Config(**PATHS[path]))
        assert out.transpose(1, 2).is_contiguous() == (layout == "heads")  # q's layout
        err, base = rel_err(out.transpose(1, 2), ref), rel_err(eager, ref)
        assert err <= 2 * base, f"{layout}: kernel error {err:.3g} > 2 x eager error {base:.3g}"


@pytest.mark.parametrize("d", [80, 96, 256])
@pytest.mark.parametrize("case", [(2, 16, 4, 1024, 1024, True), (2, 8, 8, 1000, 1000, False), (1, 8, 2, 300, 2048, True),
                                  (4, 8, 2, 1, 3000, True)], ids=["causal", "full-ragged", "gqa-sq<sk", "decode"])
def test_head_dims_beyond_64_and_128_match_oracle(mod, case, d):
    """The default path of head dims 80, 96 and 256 in both layouts (TUNING.md step 12): 80 and 96 on the Gluon
    program's zero-padded tiles from [B, S, H, D] views of [B, H, S, D] tensors (its varlen form when ragged), on the
    Triton program from contiguous [B, S, H, D] ones (the padding columns would be the next head's); 256 on the
    Gluon program's 128x64 tiles (its varlen form when ragged) in both layouts; decode shapes on the decode
    program."""
    b, hq, hkv, sq, sk, causal = case
    inputs, ref, eager = oracle_case(case, d)
    sm90 = torch.cuda.get_device_capability() == (9, 0)
    decode = sq * (hq // hkv) <= 64
    for layout, (q, k, v) in both_layouts(inputs):
        gluon = sm90 and not decode and (layout == "heads" or d == 256)
        assert getattr(mod.choose_config(q, k, causal), "gluon", False) == gluon, (layout, mod.choose_config(q, k, causal))
        out = mod.flash_attn_func(q, k, v, softmax_scale=inputs.scale, causal=causal).transpose(1, 2)
        err, base = rel_err(out, ref), rel_err(eager, ref)
        assert err <= 2 * base, f"{layout}: kernel error {err:.3g} > 2 x eager error {base:.3g}"


@pytest.mark.parametrize("d", [80, 96, 256])
@pytest.mark.parametrize("varlen", [False, True], ids=["dense", "varlen-form"])
@pytest.mark.parametrize("case", [(2, 16, 4, 1024, 1024, True), (2, 8, 8, 1000, 1000, False), (1, 8, 2, 256, 2048, True)],
                         ids=["causal", "full-ragged", "gqa-sq<sk"])
def test_head_dims_80_96_256_on_the_warp_specialized_gluon_program(mod, case, varlen, d):
    """Head dims 80, 96 (zero-padded 128-wide tiles over [B*H*S, D] views) and 256 on the Gluon program, dense and
    varlen form by explicit config (the default takes the dense form, and the varlen one for ragged lengths)."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the Gluon program is sm_90 only")
    b, hq, hkv, sq, sk, causal = case
    inputs, ref, eager = oracle_case(case, d)
    tiles = (128, 64, 4, 2) if d == 256 else (128, 128, 4, 3)
    cfg = mod.Config(*tiles, gluon=True, warp_specialize=True, varlen=varlen)
    ran = 0
    for layout, (q, k, v) in both_layouts(inputs):
        if why := mod.gluon_unsupported(q, k, causal, cfg):
            padded_rows = d != 256 and layout == "rows"  # the padding columns would be the next head's
            assert padded_rows or refused_for_its_shape(cfg, sq, sk, causal), why
            continue
        out = mod.attention(q, k, v, inputs.scale, causal, config=cfg)
        assert out.transpose(1, 2).is_contiguous() == (layout == "heads")  # q's layout
        out = out.transpose(1, 2)
        err, base = rel_err(out, ref), rel_err(eager, ref)
        assert err <= 2 * base, f"{layout}: kernel error {err:.3g} > 2 x eager error {base:.3g}"
        ran += 1
    assert ran or not varlen, "the varlen form takes these shapes in the heads layout at least"


def test_variant_and_registry_on_gpu():
    w = Workload(batch=2, heads=16, kv_heads=4, seq=2048, head_dim=128, dtype="bf16", device="cuda")
    assert VARIANTS["kernel"].supports(w).ok
    inputs = w.make_inputs(seed=1)
    ref = reference_attention(inputs)
    eager = naive_attention(inputs)
    assert rel_err(VARIANTS["kernel"](inputs), ref) <= 2 * rel_err(eager, ref)


def test_non_finite_values_in_the_next_batch_do_not_leak_through_a_tma_tile(mod):
    """Batch 0's last key tile runs into batch 1's first rows (S = 1000 is not a multiple of the tile): inf/NaN
    there must not reach batch 0 (they did before the masked loop zeroed out-of-sequence values)."""
    w = Workload(batch=2, heads=4, seq=1000, head_dim=128, dtype="bf16", causal=False, device="cuda")
    inputs = w.make_inputs(seed=3)
    q, k, v = (t.transpose(1, 2).contiguous() for t in (inputs.q, inputs.k, inputs.v))  # -> [B, S, H, D]
    v[1, :64] = float("inf")
    k[1, :64] = float("nan")
    first = Inputs(inputs.q[:1], inputs.k[:1], inputs.v[:1], causal=False, scale=inputs.scale)
    ref = reference_attention(first)
    out = mod.attention(q, k, v, inputs.scale, False).transpose(1, 2)[:1]
    assert out.isfinite().all()
    assert rel_err(out, ref) <= 2 * rel_err(naive_attention(first).double(), ref)


def test_default_dispatch_takes_the_gluon_program_where_it_runs(mod):
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the Gluon program is sm_90 only")
    q = torch.empty(1, 2048, 8, 128, device="cuda", dtype=torch.bfloat16)
    assert mod.choose_config(q, q, True).label() == "128x128 w4 s3 tma ws gluon"
    assert mod.choose_config(q, q, False).label() == "128x128 w4 s3 tma ws gluon"  # not causal too (TUNING step 11)
    short128 = q[:, :1024].contiguous()  # up to 1k keys, causal: 64-row tiles, two CTAs per SM (TUNING step 14)
    assert mod.choose_config(short128, short128, True).label() == "64x64 w4 s3 tma gluon"
    assert mod.choose_config(short128, short128, False).label() == "128x128 w4 s3 tma ws gluon"
    ragged = q[:, :1000].contiguous()
    assert mod.choose_config(ragged, ragged, True).label() == "128x128 w4 s3 tma ws gluon varlen"
    short = q[:, :100].contiguous()  # fewer keys than one tile: the Triton program
    assert not mod.choose_config(short, short, True).gluon
    short64 = torch.empty(1, 2048, 8, 64, device="cuda", dtype=torch.bfloat16)
    assert mod.choose_config(short64, short64, True).label() == "64x128 w4 s2 tma gluon"  # below 8k keys (step 13)
    assert mod.choose_config(short64, short64, False).label() == "64x128 w4 s2 tma gluon"
    assert not mod.choose_config(short64[:, :1000], short64[:, :1000], False).gluon  # ragged, not causal: Triton
    heads96 = torch.empty(1, 8, 2048, 96, device="cuda", dtype=torch.bfloat16).transpose(1, 2)  # [B, S, H, D] view
    assert mod.choose_config(heads96, heads96, True).label() == "128x128 w4 s3 tma ws gluon"  # zero-padded tiles
    ragged96 = torch.empty(1, 8, 1000, 96, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    assert mod.choose_config(ragged96, ragged96, True).label() == "128x128 w4 s3 tma ws gluon varlen"
    rows96 = heads96.contiguous()  # the padding columns would be the next head's: the Triton program
    assert not mod.choose_config(rows96, rows96, True).gluon
    d256 = torch.empty(1, 2048, 8, 256, device="cuda", dtype=torch.bfloat16)
    assert mod.choose_config(d256, d256, False).label() == "128x64 w4 s2 tma ws gluon"
    ragged256 = d256[:, :1000].contiguous()
    assert mod.choose_config(ragged256, ragged256, True).label() == "128x64 w4 s2 tma ws gluon varlen"


@pytest.mark.parametrize("layout", ["rows", "heads"])
def test_ragged_gluon_path_keeps_the_next_sequence_out(mod, layout):
    """The varlen form on a dense call: a tile's last key block would cross into the next batch (rows) or head
    (heads); it is shifted back inside the sequence, so inf/NaN there never reach this one (0 * inf)."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the Gluon program is sm_90 only")
    w = Workload(batch=2, heads=4, seq=1000, head_dim=128, dtype="bf16", causal=False, device="cuda")
    inputs = w.make_inputs(seed=4)
    q, k, v = (t.transpose(1, 2) for t in (inputs.q, inputs.k, inputs.v))
    if layout == "rows":
        q, k, v = (t.contiguous() for t in (q, k, v))
        k[1, :64], v[1, :64] = float("nan"), float("inf")  # batch 1's first keys
    else:
        k[0, :64, 1], v[0, :64, 1] = float("nan"), float("inf")  # head 1's first keys: the rows after head 0's
    for causal in (False, True):
        first = Inputs(inputs.q[:1, :1], inputs.k[:1, :1], inputs.v[:1, :1], causal=causal, scale=inputs.scale)
        ref = reference_attention(first)
        cfg = mod.choose_config(q, k, causal)
        assert cfg.label().endswith("varlen"), cfg.label()
        out = mod.attention(q, k, v, inputs.scale, causal).transpose(1, 2)[:1, :1]
        assert out.isfinite().all()
        assert rel_err(out, ref) <= 2 * rel_err(naive_attention(first).double(), ref)


def test_timing_replays_a_captured_call(mod):
    """kernel_bench times CUDA-graph replays (GPU time, not the launch's host cost): our kernel, every program of
    it the default picks at these shapes, must be capturable (no host sync, no allocation outside the graph pool)."""
    from attnprof.measure.timing import time_call

    for s, d, causal in ((1024, 128, True), (1000, 128, False), (1024, 64, True)):
        q, k, v = (torch.randn(2, s, 8, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        t = time_call(lambda q=q, k=k, v=v, causal=causal: mod.flash_attn_func(q, k, v, causal=causal), "cuda",
                      warmup=2, reps=3, cuda_graph=True)
        assert t.method == "cuda-graph", (mod.choose_config(q, k, causal).label(), t.method)


@pytest.mark.parametrize("path", ["gluon-ws-lpt", "gluon-wsp"])
def test_the_timeline_records_every_tile_and_changes_nothing(mod, path):
    """`attention(..., timeline=)` on the dense warp-specialized program and its persistent form: the same output bit
    for bit, and one record per tile: start before end, an SM of this GPU, the key blocks its causal rows reach (tile
    i of 128 rows: i + 1)."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the Gluon programs are sm_90 only")
    gen = torch.Generator(device="cuda").manual_seed(3)
    q, k, v = (torch.randn(2, 1024, 4, 128, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(3))
    cfg = mod.Config(**PATHS[path])
    tiles = 2 * 4 * (1024 // 128)
    timeline = torch.zeros(4 * tiles, dtype=torch.int64, device="cuda")
    out = mod.attention(q, k, v, None, True, config=cfg, timeline=timeline)
    assert torch.equal(out, mod.attention(q, k, v, None, True, config=cfg))
    rec = timeline.view(tiles, 4).cpu()
    assert bool((rec[:, 0] > 0).all() and (rec[:, 1] > rec[:, 0]).all()), rec[:4]
    assert int(rec[:, 2].max()) < torch.cuda.get_device_properties(0).multi_processor_count
    assert sorted(rec[:, 3].tolist()) == sorted(i + 1 for i in range(1024 // 128) for _ in range(2 * 4))
