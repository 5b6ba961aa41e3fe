"""flash-triton's model features (softcap, sliding window, sinks) against an fp64 oracle, through Triton's interpreter.

Gemma 2 caps its logits and slides a window over some layers, Mistral slides one, gpt-oss adds a per-head sink logit
to every softmax denominator; transformers hands them to a flash-attn kernel as `softcap`, `window_size` and `s_aux`.
The child (this file run with TRITON_INTERPRET=1) calls all three entry points with them (dense prefill, packed
varlen, decode over dense and paged caches with several splits) and measures the error against `oracle` below in
fp64; the rule is the usual one: error <= 2 x the same computation in fp16 by plain PyTorch. Scores are made large
(q scaled up) so the cap really bends them, windows cut inside every sequence, and sinks are large enough to take a
visible share of each row.
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

import pytest

from interpreter_child import run_child

INTERPRETER_CHILD = True  # its child starts in the background once tests are collected (conftest.py)

ROOT = Path(__file__).resolve().parents[1]
REPO = ROOT / "kernels" / "flash-triton"
FEATURES = {  # name -> (causal, softcap, window_size, sinks)
    "softcap": (True, 20.0, (-1, -1), False),
    "window-causal": (True, 0.0, (17, 0), False),
    "window-both-sides": (False, 0.0, (9, 5), False),
    "sinks": (True, 0.0, (-1, -1), True),
    "all": (True, 30.0, (23, 0), True),
}


def oracle(q, k, v, causal: bool, scale: float, softcap: float, window, sinks, dtype):
    """q `[Sq, Hq, D]`, k/v `[Sk, Hkv, D]` -> `[Sq, Hq, D]` in `dtype`: flash-attn's semantics spelled out (scale,
    cap·tanh(s / cap), bottom-right causal and window, the sink's logit in the denominator, 0 for a row with no key)."""
    import torch

    g = q.shape[1] // k.shape[1]
    qd, kd, vd = (t.to(dtype) for t in (q, k, v))
    s = torch.einsum("qhd,khd->hqk", qd, kd.repeat_interleave(g, 1)) * scale  # [H, Sq, Sk]
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    sq, sk = q.shape[0], k.shape[0]
    pos = torch.arange(sq)[:, None] + sk - sq  # each query's position
    j = torch.arange(sk)[None, :]
    keep = torch.ones(sq, sk, dtype=torch.bool)
    if causal:
        keep &= j <= pos
    if window[0] >= 0:
        keep &= j >= pos - window[0]
    if window[1] >= 0:
        keep &= j <= pos + window[1]
    s = s.masked_fill(~keep, float("-inf"))
    if sinks is not None:
        sink = sinks.to(dtype)[:, None, None].expand(s.shape[0], sq, 1)
        p = torch.softmax(torch.cat([s, sink], -1), -1)[..., :-1]
    else:
        p = torch.softmax(s, -1).nan_to_num(0.0)  # a row with no key: 0
    return torch.einsum("hqk,khd->qhd", p, vd.repeat_interleave(g, 1))


class Errors:
    """||kernel - fp64||, ||fp16 PyTorch - fp64|| and ||fp64||, summed over the sequences of one case."""

    def __init__(self):
        self.err = self.eager = self.norm = 0.0
        self.finite = True

    def add(self, out, q, k, v, causal, scale, softcap, window, sinks):
        import torch

        ref = oracle(q, k, v, causal, scale, softcap, window, sinks, torch.float64)
        eager = oracle(q, k, v, causal, scale, softcap, window, sinks, torch.float32).half().double()
        got = out.double()
        self.finite &= bool(got.isfinite().all())
        self.err += (got.nan_to_num(nan=math.inf) - ref).norm().item() ** 2
        self.eager += (eager - ref).norm().item() ** 2
        self.norm += ref.norm().item() ** 2

    def result(self) -> dict:
        n = max(self.norm, 1e-60) ** 0.5
        return {"err": self.err ** 0.5 / n, "eager": self.eager ** 0.5 / n, "finite": self.finite}


def _child() -> dict:
    import torch

    from attnprof.variants import kernel_hub

    mod = kernel_hub.load(kernel_hub.parse_spec(str(REPO)))
    gen = torch.Generator().manual_seed(0)

    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen) * scale).half()

    hq, hkv, d = 4, 2, 64
    scale = d ** -0.5
    out: dict = {"interpreted": bool(mod.INTERPRETED)}
    for name, (causal, cap, window, with_sinks) in FEATURES.items():
        sinks = (torch.randn(hq, generator=gen) * 2 + 9).float() if with_sinks else None
        kw = dict(softcap=cap, window_size=window, s_aux=sinks)
        # dense prefill, Sq < Sk (bottom-right) and a ragged Sk: flash_attn_func
        q, k, v = rand(2, 37, hq, d, scale=4.0), rand(2, 100, hkv, d), rand(2, 100, hkv, d)
        got = mod.flash_attn_func(q, k, v, causal=causal, **kw)
        e = Errors()
        for i in range(2):
            e.add(got[i], q[i], k[i], v[i], causal, scale, cap, window, sinks)
        out[f"dense/{name}"] = e.result()
        # longer keys than one 128-key block past the diagonal: the unmasked fast loop runs (soft-capped or not)
        q, k, v = rand(1, 64, hq, d, scale=4.0), rand(1, 300, hkv, d), rand(1, 300, hkv, d)
        got = mod.flash_attn_func(q, k, v, causal=causal, **kw)
        e = Errors()
        e.add(got[0], q[0], k[0], v[0], causal, scale, cap, window, sinks)
        out[f"dense-long/{name}"] = e.result()
        # packed sequences of 50, 0 and 77 tokens: flash_attn_varlen_func
        lengths = [50, 0, 77]
        cu = torch.tensor([0, 50, 50, 127], dtype=torch.int32)
        q, k, v = rand(127, hq, d, scale=4.0), rand(127, hkv, d), rand(127, hkv, d)
        got = mod.flash_attn_varlen_func(q, k, v, cu, cu, max(lengths), max(lengths), causal=causal, **kw)
        e = Errors()
        for a, b in zip(cu[:-1].tolist(), cu[1:].tolist()):
            if b > a:
                e.add(got[a:b], q[a:b], k[a:b], v[a:b], causal, scale, cap, window, sinks)
        out[f"varlen/{name}"] = e.result()
        # decode (Sq 1) and a 3-token append over a dense cache, 7 splits of 16 keys; and a paged cache
        for sq in (1, 3):
            b, cap_len = 3, 112
            kc, vc = rand(b, cap_len, hkv, d), rand(b, cap_len, hkv, d)
            q, kn, vn = rand(b, sq, hq, d, scale=4.0), rand(b, sq, hkv, d), rand(b, sq, hkv, d)
            lens = torch.tensor([60, 0, 101], dtype=torch.int32)
            cfg = mod.DecodeConfig(block_n=16, num_splits=7)
            kc1, vc1 = kc.clone(), vc.clone()
            got = mod.kvcache_attention(q, kc1, vc1, kn, vn, cache_seqlens=lens, causal=causal, config=cfg, **kw)
            e = Errors()
            for i, n in enumerate(lens.tolist()):
                e.add(got[i], q[i], kc1[i, :n + sq], vc1[i, :n + sq], causal, scale, cap, window, sinks)
            out[f"kvcache-sq{sq}/{name}"] = e.result()
        page = 16
        table = torch.randperm(24, generator=gen)[:21].view(3, 7).to(torch.int32)
        pk, pv = rand(24, page, hkv, d), rand(24, page, hkv, d)
        q = rand(3, 1, hq, d, scale=4.0)
        lens = torch.tensor([45, 112, 3], dtype=torch.int32)
        got = mod.flash_attn_with_kvcache(q, pk, pv, cache_seqlens=lens, block_table=table, causal=causal,
                                          num_splits=3, **kw)
        e = Errors()
        for i, n in enumerate(lens.tolist()):
            rows_k = pk[table[i].long()].flatten(0, 1)[:n]
            rows_v = pv[table[i].long()].flatten(0, 1)[:n]
            e.add(got[i], q[i], rows_k, rows_v, causal, scale, cap, window, sinks)
        out[f"paged/{name}"] = e.result()

    # the plain path is untouched by a feature that is off: the same call with the defaults spelled out
    q, k, v = rand(1, 64, hq, d), rand(1, 64, hkv, d), rand(1, 64, hkv, d)
    out["defaults_bitwise"] = bool(torch.equal(mod.flash_attn_func(q, k, v, causal=True),
                                               mod.flash_attn_func(q, k, v, causal=True, softcap=0.0,
                                                                   window_size=(-1, -1), s_aux=None)))
    # a window that keeps every key runs the plain (or soft-capped) path: the same bits as without it
    qn, kn, vn = rand(2, 40, hq, d, scale=4.0), rand(2, 90, hkv, d), rand(2, 90, hkv, d)
    kc, vc, lens = rand(2, 96, hkv, d), rand(2, 96, hkv, d), torch.tensor([90, 33], dtype=torch.int32)
    q1 = rand(2, 1, hq, d, scale=4.0)
    out["noop_window_bitwise"] = {
        "dense-causal": bool(torch.equal(mod.flash_attn_func(qn, kn, vn, causal=True, softcap=7.0),
                                         mod.flash_attn_func(qn, kn, vn, causal=True, softcap=7.0,
                                                             window_size=(89, 5)))),
        "dense-both-sides": bool(torch.equal(mod.flash_attn_func(qn, kn, vn),
                                             mod.flash_attn_func(qn, kn, vn, window_size=(89, 39)))),
        "kvcache": bool(torch.equal(mod.flash_attn_with_kvcache(q1, kc, vc, cache_seqlens=lens, causal=True),
                                    mod.flash_attn_with_kvcache(q1, kc, vc, cache_seqlens=lens, causal=True,
                                                                window_size=(95, 0)))),
        # one short of every key: a real window, not the plain path's bits (a key is cut from the longest rows)
        "dense-one-short-differs": not torch.equal(mod.flash_attn_func(qn, kn, vn, causal=True),
                                                   mod.flash_attn_func(qn, kn, vn, causal=True, window_size=(88, 0))),
    }
    refusals = {}
    for arg, kw in (("window_size", dict(window_size=(3,))), ("window_size", dict(window_size=(-2, 0))),
                    ("softcap", dict(softcap=-1.0)), ("s_aux", dict(s_aux=torch.zeros(hq + 1))),
                    ("s_aux", dict(s_aux=torch.zeros(hq, dtype=torch.int32)))):
        try:
            mod.flash_attn_func(q, k, v, causal=True, **kw)
            refusals[str(kw)] = None
        except ValueError as err:
            refusals[str(kw)] = (arg, str(err))
    out["refusals"] = refusals
    # an explicit Gluon config: the one-warpgroup program computes no feature (refused for that, before any device
    # check), the dense warp-specialized one sinks alone; the varlen program takes them all (refused here only
    # because the CPU has no Gluon)
    gluon = {}
    sinks = torch.zeros(q.shape[2])
    for name, ws, varlen, kw in (("one-warpgroup", False, False, dict(softcap=5.0)),
                                 ("varlen", True, True, dict(softcap=5.0)),
                                 ("ws-softcap", True, False, dict(softcap=5.0)),
                                 ("ws-sinks", True, False, dict(s_aux=sinks)),
                                 ("ws-sinks-window", True, False, dict(s_aux=sinks, window_size=(3, 0))),
                                 ("persistent-softcap", True, None, dict(softcap=5.0)),
                                 ("persistent-sinks-window", True, None, dict(s_aux=sinks, window_size=(3, 0)))):
        cfg = mod.Config(block_m=128, block_n=128, num_warps=4, num_stages=3, gluon=True, warp_specialize=ws,
                         varlen=bool(varlen), persistent=varlen is None)  # None: the persistent program
        f = mod.parse_features("t", q, kw.get("softcap", 0.0), kw.get("window_size", (-1, -1)), kw.get("s_aux"))
        try:
            mod.attention(q, k, v, None, True, config=cfg, features=f, s_aux=kw.get("s_aux"))
            gluon[name] = None
        except ValueError as err:
            gluon[name] = str(err)
    out["gluon_refusals"] = gluon
    # Config.p_pack_alu (P rounded to bf16 on the integer pipe): the varlen Gluon program's switch, bf16 only;
    # anywhere else refused by name, never silently ignored
    packs = {}
    ws = dict(block_m=128, block_n=128, num_warps=4, num_stages=3, gluon=True, warp_specialize=True, p_pack_alu=True)
    cu = torch.tensor([0, 64], dtype=torch.int32)
    for name, cfg, dt, packed in (("triton", mod.Config(p_pack_alu=True), torch.bfloat16, False),
                                  ("dense-ws", mod.Config(**ws), torch.bfloat16, False),
                                  ("varlen-fp16", mod.Config(**ws, varlen=True), torch.float16, False),
                                  ("varlen-bf16", mod.Config(**ws, varlen=True), torch.bfloat16, False),
                                  ("packed-triton", mod.Config(p_pack_alu=True), torch.float16, True),
                                  ("packed-bf16", mod.Config(**ws), torch.bfloat16, True)):
        qd, kd, vd = (t.to(dt) for t in (q, k, v))
        try:
            if packed:
                mod.varlen_attention(qd[0], kd[0], vd[0], cu, cu, 64, causal=True, config=cfg)
            else:
                mod.attention(qd, kd, vd, None, True, config=cfg)
            packs[name] = None
        except ValueError as err:
            packs[name] = str(err)
    out["p_pack_refusals"] = packs
    # Config.cap_poly (one exp2 in 2 or 4 on the FMA pipes): an option of the varlen Gluon program's bounded softcap
    # only, refused by name anywhere else (the config itself), combinable with p_pack_alu; the launch switches it off
    # without the bound (a cap past CAP_BOUND_MAX, or no softcap)
    polys = {}
    ws = dict(block_m=128, block_n=128, num_warps=4, num_stages=3, gluon=True, warp_specialize=True)
    qb, kb, vb = (t.to(torch.bfloat16) for t in (q, k, v))
    for name, kw in (("triton", dict(cap_poly=4)), ("dense-ws", dict(ws, cap_poly=4)),
                     ("online-max", dict(ws, varlen=True, cap_bound=False, cap_poly=4)),
                     ("value-3", dict(ws, varlen=True, cap_poly=3)), ("varlen", dict(ws, varlen=True, cap_poly=4)),
                     ("varlen-alu-pack", dict(ws, varlen=True, cap_poly=4, p_pack_alu=True))):
        try:
            mod.attention(qb, kb, vb, None, True, config=mod.Config(**kw),
                          features=mod.parse_features("t", qb, 20.0, (-1, -1), None))
            polys[name] = None
        except ValueError as err:
            polys[name] = str(err)
    out["cap_poly_refusals"] = polys
    poly4 = mod.Config(**ws, varlen=True, cap_poly=4)
    meta = {cap: mod._features.varlen_gluon_meta(mod.parse_features("t", qb, cap, (-1, -1), None), poly4)
            for cap in (20.0, 80.0, 0.0)}
    out["cap_poly_meta"] = {str(cap): [m["CAP_BOUND"], m["CAP_POLY"]] for cap, m in meta.items()}
    # Config.exp_poly (the dense Gluon programs' online softmax, one exp2 in 2 or 4 on the FMA pipes): refused by name
    # on the varlen and persistent forms and the Triton program, and for another value
    exps = {}
    for name, kw in (("triton", dict(exp_poly=4)), ("varlen", dict(ws, varlen=True, exp_poly=4)),
                     ("persistent", dict(ws, persistent=True, exp_poly=2)), ("value-3", dict(ws, exp_poly=3)),
                     ("dense-ws", dict(ws, exp_poly=4)), ("one-wg", dict(block_m=64, block_n=128, gluon=True, exp_poly=2)),
                     # Config.split_mask: the dense warp-specialized program's only
                     ("split-one-wg", dict(block_m=64, block_n=128, gluon=True, split_mask=True)),
                     ("split-varlen", dict(ws, varlen=True, split_mask=True)), ("split-ws", dict(ws, split_mask=True)),
                     # Config.pingpong: the dense warp-specialized program's only
                     ("pingpong-one-wg", dict(block_m=64, block_n=128, gluon=True, pingpong=True)),
                     ("pingpong-varlen", dict(ws, varlen=True, pingpong=True)),
                     ("pingpong-persistent", dict(ws, persistent=True, pingpong=True)),
                     ("pingpong-ws", dict(ws, pingpong=True)),
                     # Config.v_wait_early: every Gluon program
                     ("v-wait-triton", dict(v_wait_early=True)),
                     ("v-wait-persistent", dict(ws, persistent=True, v_wait_early=True)),
                     ("v-wait-one-wg", dict(block_m=64, block_n=128, gluon=True, v_wait_early=True)),
                     ("v-wait-varlen", dict(ws, varlen=True, v_wait_early=True)),
                     ("v-wait-ws", dict(ws, v_wait_early=True))):
        try:
            exps[name] = mod.Config(**kw).label()
        except ValueError as err:
            exps[name] = str(err)
    out["exp_poly_refusals"] = exps
    # attention(timeline=): a diagnostic of the dense warp-specialized Gluon program, refused with the reason elsewhere
    try:
        mod.attention(qb, kb, vb, None, True, timeline=torch.zeros(4096, dtype=torch.int64))
        out["timeline_refusal"] = None
    except ValueError as err:
        out["timeline_refusal"] = str(err)
    return out


@pytest.fixture(scope="module")
def interp() -> dict:
    return run_child(__file__)


def test_child_ran_the_interpreter(interp):
    assert interp["interpreted"]


@pytest.mark.parametrize("entry", ["dense", "dense-long", "varlen", "kvcache-sq1", "kvcache-sq3", "paged"])
@pytest.mark.parametrize("feature", list(FEATURES))
def test_feature_matches_the_fp64_oracle(interp, entry, feature):
    r = interp[f"{entry}/{feature}"]
    assert r["finite"] and r["err"] <= 2 * r["eager"], f"kernel {r['err']:.3g} > 2 x fp16 PyTorch {r['eager']:.3g}"


def test_features_off_leave_the_plain_path_bit_for_bit(interp):
    assert interp["defaults_bitwise"]


def test_a_window_that_keeps_every_key_runs_the_plain_path(interp):
    assert all(interp["noop_window_bitwise"].values()), interp["noop_window_bitwise"]


def test_malformed_features_are_refused_by_name(interp):
    for kw, got in interp["refusals"].items():
        assert got is not None, f"{kw} was accepted"
        arg, message = got
        assert arg in message and "flash-triton flash_attn_func" in message, message


def test_an_explicit_gluon_config_takes_features_only_on_the_programs_that_compute_them(interp):
    refused = interp["gluon_refusals"]
    for name in ("one-warpgroup", "ws-softcap", "ws-sinks-window", "persistent-softcap"):
        assert "only the warp-specialized varlen one computes every model feature" in refused[name], refused[name]
    assert "softcap 5" in refused["one-warpgroup"] and "sinks" in refused["ws-sinks-window"]
    assert "softcap 5" in refused["persistent-softcap"], refused["persistent-softcap"]
    for name in ("varlen", "ws-sinks", "persistent-sinks-window"):  # taken: refused only for the CPU
        assert "model feature" not in refused[name] and "CUDA GPU" in refused[name], refused[name]


def test_p_pack_alu_is_refused_by_name_where_it_cannot_apply(interp):
    refused = interp["p_pack_refusals"]
    for name in ("triton", "dense-ws", "packed-triton"):
        assert "p_pack_alu is a switch of the warp-specialized varlen Gluon program" in refused[name], refused[name]
    assert "p_pack_alu rounds P to bf16 (got float16)" in refused["varlen-fp16"], refused["varlen-fp16"]
    for name in ("varlen-bf16", "packed-bf16"):  # taken: refused only for the CPU (no Gluon; bf16 in the interpreter)
        assert "p_pack_alu" not in refused[name] and ("CUDA GPU" in refused[name] or "interpreter" in refused[name])


def test_a_timeline_is_refused_where_the_warp_specialized_program_does_not_run(interp):
    refused = interp["timeline_refusal"]
    assert refused and "timeline= is a diagnostic of the dense warp-specialized Gluon program" in refused, refused


def test_exp_poly_is_refused_by_name_where_no_program_takes_it(interp):
    made = interp["exp_poly_refusals"]
    for name in ("triton", "varlen", "persistent"):
        assert "exp_poly is an option of the dense Gluon programs" in made[name], made[name]
    assert "exp_poly is 0" in made["value-3"] and "got 3" in made["value-3"], made["value-3"]
    assert made["dense-ws"].endswith("exp-poly/4") and made["one-wg"].endswith("exp-poly/2"), made
    for name in ("split-one-wg", "split-varlen"):
        assert "split_mask is an option of the dense warp-specialized Gluon program" in made[name], made[name]
    assert made["split-ws"].endswith("split-mask"), made["split-ws"]
    for name in ("pingpong-one-wg", "pingpong-varlen"):
        assert "pingpong is an option of the dense warp-specialized Gluon program" in made[name], made[name]
    assert made["pingpong-ws"].endswith("pingpong") and made["pingpong-persistent"].endswith("persistent pingpong")
    assert "v_wait_early is an option of the Gluon programs" in made["v-wait-triton"], made["v-wait-triton"]
    for name in ("v-wait-one-wg", "v-wait-varlen", "v-wait-ws", "v-wait-persistent"):
        assert made[name].endswith("v-wait-early"), made[name]


def test_cap_poly_is_refused_by_name_where_it_cannot_apply(interp):
    refused = interp["cap_poly_refusals"]
    for name in ("triton", "dense-ws", "online-max"):
        assert "cap_poly is an option of the varlen Gluon program's bounded softcap" in refused[name], refused[name]
    assert "cap_poly is 0" in refused["value-3"] and "got 3" in refused["value-3"], refused["value-3"]
    for name in ("varlen", "varlen-alu-pack"):  # taken: refused only for the CPU (no Gluon; bf16 in the interpreter)
        assert "cap_poly" not in refused[name] and ("CUDA GPU" in refused[name] or "interpreter" in refused[name])
    # the launch's switch: CAP_POLY only with the bound (a cap up to CAP_BOUND_MAX)
    assert interp["cap_poly_meta"] == {"20.0": [True, 4], "80.0": [False, 0], "0.0": [False, 0]}, interp["cap_poly_meta"]


if __name__ == "__main__":
    assert os.environ.get("TRITON_INTERPRET") == "1", "run the child with TRITON_INTERPRET=1"
    print(json.dumps(_child()))


@pytest.mark.cuda
@pytest.mark.parametrize("feature", list(FEATURES))
def test_features_on_the_gpu_match_the_fp64_oracle(feature):
    """The same cases compiled for the GPU in bf16 (dense, varlen, decode over a dense and a paged cache)."""
    import torch

    from attnprof.variants import kernel_hub

    mod = kernel_hub.load(kernel_hub.parse_spec(str(REPO)))
    causal, cap, window, with_sinks = FEATURES[feature]
    gen = torch.Generator().manual_seed(5)

    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen) * scale).to("cuda", torch.bfloat16)

    hq, hkv, d = 8, 2, 128
    sinks = (torch.randn(hq, generator=gen) * 2 + 9).cuda() if with_sinks else None
    kw = dict(softcap=cap, window_size=window, s_aux=sinks)
    q, k, v = rand(2, 300, hq, d, scale=4.0), rand(2, 1025, hkv, d), rand(2, 1025, hkv, d)
    got = mod.flash_attn_func(q, k, v, causal=causal, **kw)
    e = Errors()
    for i in range(2):
        e.add(got[i].cpu(), q[i].cpu(), k[i].cpu(), v[i].cpu(), causal, d ** -0.5, cap, window,
              None if sinks is None else sinks.cpu())
    r = e.result()
    assert r["finite"] and r["err"] <= 2 * r["eager"] + 2e-3, r  # bf16: the fp16 baseline plus bf16's rounding
    kc, vc = rand(3, 4096, hkv, d), rand(3, 4096, hkv, d)
    lens = torch.tensor([3000, 1, 4096], dtype=torch.int32, device="cuda")
    qd = rand(3, 1, hq, d, scale=4.0)
    got = mod.flash_attn_with_kvcache(qd, kc, vc, cache_seqlens=lens, causal=causal, **kw)
    e = Errors()
    for i, n in enumerate(lens.tolist()):
        e.add(got[i].cpu(), qd[i].cpu(), kc[i, :n].cpu(), vc[i, :n].cpu(), causal, d ** -0.5, cap, window,
              None if sinks is None else sinks.cpu())
    r = e.result()
    assert r["finite"] and r["err"] <= 2 * r["eager"] + 2e-3, r


GLUON_FEATURES = dict(FEATURES, **{"window-wide": (True, 0.0, (300, 0), False),  # a window over several blocks
                                    "plain": (True, 0.0, (-1, -1), False)})


GLUON_CASES = ([(f, 128, False, 0) for f in GLUON_FEATURES if f != "plain"]
               + [("all", 64, False, 0), ("sinks", 64, False, 0), ("all", 256, False, 0),
                  ("window-both-sides", 256, False, 0)]
               + [("plain", 128, True, 0), ("softcap", 128, True, 0), ("all", 256, True, 0)]  # P packed on the ALU
               + [("softcap", 128, False, 4), ("softcap", 128, True, 4)])  # Config.cap_poly, alone and with the pack


@pytest.mark.cuda
@pytest.mark.parametrize("feature,d,pack,poly", GLUON_CASES,
                         ids=[f"{f}-d{d}" + ("-alu-pack" if p else "") + (f"-poly{n}" if n else "")
                              for f, d, p, n in GLUON_CASES])
def test_features_on_the_gluon_varlen_program_match_the_fp64_oracle(feature, d, pack, poly):
    """The varlen Gluon program (the only Gluon one that takes the features, and their default where the plain call
    takes a Gluon program) named explicitly: a dense call in both TMA layouts with ragged lengths (the shifted last key block), and
    packed sequences, bf16, at gpt-oss's, Mistral's and Gemma 2's head dims; `pack`: with `Config.p_pack_alu`;
    `poly`: `Config.cap_poly` (masked, -inf, scores through the polynomial too)."""
    import torch

    from attnprof.variants import kernel_hub

    mod = kernel_hub.load(kernel_hub.parse_spec(str(REPO)))
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the Gluon programs are sm_90 only")
    causal, cap, window, with_sinks = GLUON_FEATURES[feature]
    cfg = mod.Config(block_m=128, block_n=64 if d == 256 else 128, num_warps=4, num_stages=2 if d == 256 else 3,
                     gluon=True, warp_specialize=True, varlen=True, p_pack_alu=pack, cap_poly=poly)
    gen = torch.Generator().manual_seed(7)

    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen) * scale).to("cuda", torch.bfloat16)

    hq, hkv = 8, 2
    sinks = (torch.randn(hq, generator=gen) * 2 + 9).cuda() if with_sinks else None
    f = mod.parse_features("test", rand(1, 1, hq, d), cap, window, sinks)
    scale = d ** -0.5

    def check(got, qs, ks, vs):
        e = Errors()
        for o, q1, k1, v1 in zip(got, qs, ks, vs):
            e.add(o.cpu(), q1.cpu(), k1.cpu(), v1.cpu(), causal, scale, f.softcap, f.window,
                  None if sinks is None else sinks.cpu())
        r = e.result()
        assert r["finite"] and r["err"] <= 2 * r["eager"] + 2e-3, r  # bf16: as the Triton program's cuda test

    q, k, v = rand(2, 300, hq, d, scale=4.0), rand(2, 1025, hkv, d), rand(2, 1025, hkv, d)
    check(mod.attention(q, k, v, scale, causal, config=cfg, features=f, s_aux=sinks), q, k, v)  # [B, S, H, D] rows
    qh, kh, vh = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))  # views of [B, H, S, D]
    check(mod.attention(qh, kh, vh, scale, causal, config=cfg, features=f, s_aux=sinks), q, k, v)
    # packed: a sequence shorter than its queries' causal reach, ragged ends, and one with more queries than keys (its
    # first 50 rows see no key under the causal mask: zeros)
    lq, lk = [300, 77, 513, 200], [1025, 130, 700, 150]
    qp, kp, vp = rand(sum(lq), hq, d, scale=4.0), rand(sum(lk), hkv, d), rand(sum(lk), hkv, d)
    cu_q = torch.tensor([0, *torch.tensor(lq).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0, *torch.tensor(lk).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    got = mod.varlen_attention(qp, kp, vp, cu_q, cu_k, max(lq), scale, causal, config=cfg, features=f, s_aux=sinks)
    check(got.split(lq), qp.split(lq), kp.split(lk), vp.split(lk))


CAP_CASES = [(50.0, True, 128, 0), (50.0, True, 256, 0), (80.0, True, 128, 0), (50.0, False, 128, 0),
             (30.0, True, 128, 4)]


@pytest.mark.cuda
@pytest.mark.parametrize("cap,cap_bound,d,cap_poly", CAP_CASES,
                         ids=[f"cap{c:g}-{'bound' if b else 'online'}-d{d}" + (f"-poly{n}" if n else "")
                              for c, b, d, n in CAP_CASES])
def test_softcap_at_saturating_logits_matches_the_fp64_oracle(cap, cap_bound, d, cap_poly):
    """Soft-capping on the varlen Gluon program without a running max (`CAP_BOUND`: a cap up to
    `_features.CAP_BOUND_MAX`, exp2 against a fixed reference) and with one (a cap of 80, or `cap_bound=False`), at
    logits of several hundred that saturate the tanh, including query rows whose every logit is near -cap: their
    exps sit at e^(-cap - reference), and an implementation that let them underflow would return zeros there, not
    the average of the values."""
    import torch

    from attnprof.variants import kernel_hub

    mod = kernel_hub.load(kernel_hub.parse_spec(str(REPO)))
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the Gluon programs are sm_90 only")
    cfg = mod.Config(block_m=128, block_n=64 if d == 256 else 128, num_warps=4, num_stages=2 if d == 256 else 3,
                     gluon=True, warp_specialize=True, varlen=True, cap_bound=cap_bound, cap_poly=cap_poly)
    gen = torch.Generator().manual_seed(11)
    hq, hkv, sq, sk = 4, 2, 256, 1000
    u = torch.randn(d, generator=gen)
    k = (u + 0.3 * torch.randn(1, sk, hkv, d, generator=gen)).to(torch.bfloat16)  # keys share a direction u
    q = torch.randn(1, sq, hq, d, generator=gen) * 3.0
    q[:, :64] = -8.0 * u  # these rows' logits all lie near -8 |u|^2 / sqrt(d): tanh ~ -1 everywhere
    q = q.to(torch.bfloat16)
    v = torch.randn(1, sk, hkv, d, generator=gen).to(torch.bfloat16)
    f = mod.parse_features("test", q, cap, (-1, -1), None)
    scale = d ** -0.5
    got = mod.attention(q.cuda(), k.cuda(), v.cuda(), scale, False, config=cfg, features=f).cpu()
    e = Errors()
    e.add(got[0], q[0], k[0], v[0], False, scale, cap, (-1, -1), None)
    r = e.result()
    assert r["finite"] and r["err"] <= 2 * r["eager"] + 2e-3, r
    want = oracle(q[0, :64], k[0], v[0], False, scale, cap, (-1, -1), None, torch.float64)
    rows = (got[0, :64].double() - want).norm() / want.norm()
    assert rows <= 2e-2, f"rows with every logit near -cap: relative error {rows:.3g}"


@pytest.mark.cuda
@pytest.mark.parametrize("d", [128, 256])
def test_sinks_on_the_dense_warp_specialized_program_match_the_fp64_oracle(d):
    """Sinks alone run on the dense warp-specialized Gluon program (the one the plain call takes at these shapes),
    named explicitly in both TMA layouts, causal and not, and by default."""
    import torch

    from attnprof.variants import kernel_hub

    mod = kernel_hub.load(kernel_hub.parse_spec(str(REPO)))
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the Gluon programs are sm_90 only")
    cfg = mod.Config(block_m=128, block_n=64 if d == 256 else 128, num_warps=4, num_stages=2 if d == 256 else 3,
                     gluon=True, warp_specialize=True)
    gen = torch.Generator().manual_seed(11)

    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen) * scale).to("cuda", torch.bfloat16)

    hq, hkv = 8, 2
    sinks = (torch.randn(hq, generator=gen) * 2 + 9).cuda()
    f = mod.parse_features("test", rand(1, 1, hq, d), 0.0, (-1, -1), sinks)
    scale = d ** -0.5

    def check(got, q, k, v, causal):
        e = Errors()
        for o, q1, k1, v1 in zip(got, q, k, v):
            e.add(o.cpu(), q1.cpu(), k1.cpu(), v1.cpu(), causal, scale, 0.0, (-1, -1), sinks.cpu())
        r = e.result()
        assert r["finite"] and r["err"] <= 2 * r["eager"] + 2e-3, r

    q, k, v = rand(2, 256, hq, d, scale=4.0), rand(2, 1024, hkv, d), rand(2, 1024, hkv, d)
    qh, kh, vh = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))  # views of [B, H, S, D]
    for causal in (True, False):
        check(mod.attention(q, k, v, scale, causal, config=cfg, features=f, s_aux=sinks), q, k, v, causal)
        check(mod.attention(qh, kh, vh, scale, causal, config=cfg, features=f, s_aux=sinks), q, k, v, causal)
    q, k, v = rand(1, 2048, hq, d, scale=4.0), rand(1, 2048, hkv, d), rand(1, 2048, hkv, d)
    check(mod.flash_attn_func(q, k, v, causal=True, s_aux=sinks), q, k, v, True)
    plan = next(p for key, p in mod._PLANS.items() if key[0] == q.shape and key[-1] is not None)
    assert plan.kind == "gluon" and plan.cfg.warp_specialize and not plan.cfg.varlen, plan


@pytest.mark.cuda
@pytest.mark.parametrize("tiles", [(64, 64, 3, 64), (64, 64, 2, 64), (64, 64, 3, 128)],
                         ids=lambda t: f"{t[0]}x{t[1]}-s{t[2]}-d{t[3]}")
@pytest.mark.parametrize("lpt", [False, True], ids=["grid", "lpt"])
def test_window_and_sinks_on_the_one_warpgroup_program_match_the_fp64_oracle(tiles, lpt):
    """A sliding window and sinks on the one-warpgroup Gluon program (gpt-oss's small windows), named explicitly:
    gpt-oss's pattern (causal, window (128, 0), sinks), a window alone, a window on both sides without causal, Sq <
    Sk; both TMA layouts; the grid and the LPT order."""
    import torch

    from attnprof.variants import kernel_hub

    mod = kernel_hub.load(kernel_hub.parse_spec(str(REPO)))
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the Gluon programs are sm_90 only")
    bm, bn, stages, d = tiles
    cfg = mod.Config(block_m=bm, block_n=bn, num_warps=4, num_stages=stages, gluon=True, lpt=lpt)
    check_window_and_sinks(mod, cfg, d, 13, [(True, (128, 0), True, 2, 1024, 1024), (True, (200, 0), False, 2, 512, 1024),
                                             (False, (70, 33), True, 2, 1024, 1024), (True, (-1, -1), True, 2, 512, 1024)])


@pytest.mark.cuda
@pytest.mark.parametrize("program", ["one-wg", "varlen", "persistent-64", "persistent-128"])
def test_window_and_sinks_with_the_values_waited_for_early_match_the_fp64_oracle(program):
    """`Config.v_wait_early` (each key block's values waited for at the end of its softmax) where a window moves the
    walk's first block: the one-warpgroup program in gpt-oss's default tiles (64x64, 2 stages, head dim 64), the
    warp-specialized varlen program (128x128, head dim 128) and the persistent one (the ring of key blocks carried
    across tiles, head dims 64 and 128); the cases of the tests above, both TMA layouts."""
    import torch

    from attnprof.variants import kernel_hub

    mod = kernel_hub.load(kernel_hub.parse_spec(str(REPO)))
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the Gluon programs are sm_90 only")
    if program == "one-wg":
        d, cfg = 64, mod.Config(block_m=64, block_n=64, num_warps=4, num_stages=2, gluon=True, v_wait_early=True)
    elif program.startswith("persistent"):
        d, cfg = int(program[-3:].lstrip("-")), mod.Config(block_m=128, block_n=128, num_warps=4, num_stages=3,
                                                           gluon=True, warp_specialize=True, persistent=True,
                                                           v_wait_early=True)
    else:
        d, cfg = 128, mod.Config(block_m=128, block_n=128, num_warps=4, num_stages=3, gluon=True,
                                 warp_specialize=True, varlen=True, v_wait_early=True)
    check_window_and_sinks(mod, cfg, d, 19, [(True, (128, 0), True, 2, 1024, 1024), (True, (200, 0), False, 2, 512, 1024),
                                             (False, (70, 33), True, 2, 1024, 1024), (True, (-1, -1), True, 2, 512, 1024)])


def check_window_and_sinks(mod, cfg, d: int, seed: int, cases: list) -> None:
    """`cfg` on each (causal, window, sinks?, B, Sq, Sk) case at head dim d, 8 query heads over 2, in both TMA layouts,
    within 2x fp16 eager's error against the fp64 oracle."""
    import torch

    gen = torch.Generator().manual_seed(seed)

    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen) * scale).to("cuda", torch.bfloat16)

    hq, hkv = 8, 2
    sinks = (torch.randn(hq, generator=gen) * 2 + 3).cuda()
    scale = d ** -0.5
    for causal, window, with_sinks, b, sq, sk in cases:
        s_aux = sinks if with_sinks else None
        q, k, v = rand(b, sq, hq, d, scale=3.0), rand(b, sk, hkv, d), rand(b, sk, hkv, d)
        f = mod.parse_features("test", q, 0.0, window, s_aux)
        for qq, kk, vv in ((q, k, v), tuple(t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))):
            got = mod.attention(qq, kk, vv, scale, causal, config=cfg, features=f, s_aux=s_aux)
            e = Errors()
            for o, q1, k1, v1 in zip(got, q, k, v):
                e.add(o.cpu(), q1.cpu(), k1.cpu(), v1.cpu(), causal, scale, 0.0, window,
                      None if s_aux is None else s_aux.cpu())
            r = e.result()
            assert r["finite"] and r["err"] <= 2 * r["eager"] + 2e-3, (causal, window, with_sinks, sq, sk, r)


@pytest.mark.cuda
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("pingpong", [False, True], ids=["", "pingpong"])
def test_window_and_sinks_on_the_persistent_program_match_the_fp64_oracle(d, pingpong):
    """A sliding window and sinks on the persistent Gluon program (`Config.persistent`: each tile walks the key blocks
    its rows' windows reach, from a plan made for them): gpt-oss's pattern, a long window over many tiles per CTA
    with GQA, a window on both sides without causal, sinks alone with Sq < Sk; both TMA layouts."""
    import torch

    from attnprof.variants import kernel_hub

    mod = kernel_hub.load(kernel_hub.parse_spec(str(REPO)))
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the Gluon programs are sm_90 only")
    cfg = mod.Config(block_m=128, block_n=128, num_warps=4, num_stages=3, gluon=True, warp_specialize=True,
                     persistent=True, pingpong=pingpong)
    check_window_and_sinks(mod, cfg, d, 17, [(True, (128, 0), True, 2, 1024, 1024), (True, (1000, 0), True, 4, 2048, 2048),
                                             (False, (70, 33), True, 2, 1024, 1024), (True, (200, 0), False, 2, 512, 1024),
                                             (True, (-1, -1), True, 2, 512, 1024)])


@pytest.mark.cuda
def test_small_windows_take_the_one_warpgroup_program_by_default():
    """The default route of a windowed call (TUNING.md step 25): gpt-oss's 128-key window with sinks at head dim 64
    and 512- and 1024-key windows at 128 on the one-warpgroup program (64x64 tiles), 2048- and 4096-key windows and a
    ragged length on the warp-specialized varlen program; the default call matches the fp64 oracle."""
    import torch

    from attnprof.variants import kernel_hub

    mod = kernel_hub.load(kernel_hub.parse_spec(str(REPO)))
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the Gluon programs are sm_90 only")
    gen = torch.Generator().manual_seed(17)

    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen) * scale).to("cuda", torch.bfloat16)

    def program(q, window, sinks=None):
        mod.flash_attn_func(q, q, q, causal=True, window_size=window, s_aux=sinks)
        return next(p for key, p in reversed(mod._PLANS.items()) if key[0] == q.shape).cfg.label()

    sinks = (torch.randn(16, generator=gen) + 3).cuda()
    assert program(rand(1, 1024, 16, 64), (128, 0), sinks) == "64x64 w4 s2 tma gluon"
    assert program(rand(1, 1024, 16, 128), (512, 0)) == "64x64 w4 s3 tma gluon"
    assert program(rand(1, 4096, 16, 128), (1024, 0)) == "64x64 w4 s3 tma gluon"
    assert program(rand(1, 4096, 16, 128), (2048, 0)).endswith("ws gluon varlen")
    assert program(rand(1, 8192, 16, 128), (4096, 0)).endswith("ws gluon varlen")
    assert program(rand(1, 1000, 16, 128), (128, 0)).endswith("ws gluon varlen")  # ragged
    q, k, v = rand(2, 1024, 16, 64, scale=3.0), rand(2, 1024, 4, 64), rand(2, 1024, 4, 64)
    got = mod.flash_attn_func(q, k, v, causal=True, window_size=(128, 0), s_aux=sinks)
    e = Errors()
    for o, q1, k1, v1 in zip(got, q, k, v):
        e.add(o.cpu(), q1.cpu(), k1.cpu(), v1.cpu(), True, 64 ** -0.5, 0.0, (128, 0), sinks.cpu())
    r = e.result()
    assert r["finite"] and r["err"] <= 2 * r["eager"] + 2e-3, r


def test_small_window_rule():
    """`_features.small_window`: a window spanning at most SMALL_WINDOW keys, no softcap; under causal an unbounded
    right side adds nothing, without causal it is unbounded."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("ft_features", REPO / "torch-ext" / "flash_triton" / "_features.py")
    m = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = m  # its dataclass resolves its annotations through sys.modules
    try:
        spec.loader.exec_module(m)
    finally:
        del sys.modules[spec.name]
    small = m.SMALL_WINDOW
    assert m.small_window(m.Features(window=(128, -1)), causal=True)
    assert m.small_window(m.Features(window=(small, -1), sinks=True), causal=True)
    assert not m.small_window(m.Features(window=(small + 1, -1)), causal=True)
    assert m.small_window(m.Features(window=(100, 100)), causal=False)
    assert not m.small_window(m.Features(window=(small, 1)), causal=False)
    assert not m.small_window(m.Features(window=(128, -1)), causal=False)  # unbounded to the right
    assert not m.small_window(m.Features(window=(-1, -1), sinks=True), causal=True)
    assert not m.small_window(m.Features(softcap=30.0, window=(128, -1)), causal=True)


def test_default_arguments_take_the_one_plain_features_object():
    """`is_plain` lets a plain call skip parsing (host time per call), and whatever spells the defaults parses to the
    one `PLAIN` the launch paths test by identity; anything else still goes through `parse_features`' checks."""
    import importlib.util

    import torch

    spec = importlib.util.spec_from_file_location("flash_triton_features", REPO / "torch-ext" / "flash_triton" /
                                                  "_features.py")
    feat = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = feat  # a dataclass looks its module up while the class is made
    spec.loader.exec_module(feat)
    q = torch.zeros(1, 1, 4, 64)
    assert feat.is_plain(0.0, (-1, -1), None) and feat.is_plain(None, None, None) and feat.is_plain(0, (-1, -1), None)
    assert not feat.is_plain(0.0, [-1, -1], None)  # not the tuple: parsed, and still plain
    assert feat.parse_features("t", q, 0, [-1, -1], None) is feat.PLAIN
    assert not feat.is_plain(False, (-1, -1), None)  # a bool is refused by the parser, as before
    with pytest.raises(ValueError, match="softcap=False"):
        feat.parse_features("t", q, False)
    for args in ((5.0, (-1, -1), None), (0.0, (3, 0), None), (0.0, (-1, -1), torch.zeros(4))):
        assert not feat.is_plain(*args)
    assert feat.kernel_args(feat.PLAIN, 0.125) == feat.PLAIN_ARGS
    # `effective`: window sides that keep every key go (sq queries over sk keys, bottom-right)
    w = lambda left, right, cap=0.0: feat.Features(cap, (left, right), False)  # noqa: E731
    assert feat.effective(w(99, 0), 10, 100, True) is feat.PLAIN  # left >= sk - 1; right under causal
    assert feat.effective(w(98, 0), 10, 100, True).window == (98, -1)  # the last query would lose key 0
    assert feat.effective(w(99, 9), 10, 100, False) is feat.PLAIN  # right >= sq - 1
    assert feat.effective(w(99, 8), 10, 100, False).window == (-1, 8)  # the first query would lose key 99
    assert feat.effective(w(500, 0, 30.0), 10, 100, True) == feat.Features(30.0, (-1, -1), False)


def test_a_default_softcap_alone_at_head_dims_80_to_128_takes_the_polynomial_and_the_integer_pack():
    """`_features.softcap_switches`: the default varlen Gluon config of a bounded softcap alone at head dims 80-128
    gets `cap_poly=4` and, in bf16 only, `p_pack_alu` (measured faster there, TUNING.md step 22); the cap beside a
    window or sinks (slower there), head dim 64 (not measured), 256 (slower), a cap past the bound, no softcap, the
    online form and other programs keep theirs."""
    import torch

    from attnprof.variants import kernel_hub

    mod = kernel_hub.load(kernel_hub.parse_spec(str(REPO)))
    cfgs, feats = mod._config, mod._features
    cap30, cap80 = feats.Features(softcap=30.0), feats.Features(softcap=80.0)
    pick = feats.softcap_switches
    ws = cfgs.GLUON_WS_VARLEN
    assert pick(ws, cap30, 128, torch.bfloat16).label() == ws.label() + " poly/4 alu-pack"
    assert pick(ws, cap30, 96, torch.bfloat16).label() == ws.label() + " poly/4 alu-pack"
    assert pick(ws, cap30, 128, torch.float16).label() == ws.label() + " poly/4"
    assert pick(ws, cap30, 80, torch.bfloat16).cap_poly == 4
    online = cfgs.Config(**{**ws.__dict__, "cap_bound": False})
    with_window = feats.Features(softcap=30.0, window=(1023, 0))
    with_sinks = feats.Features(softcap=30.0, sinks=True)
    for cfg, f, d in ((ws, with_window, 128), (ws, with_sinks, 128), (ws, cap30, 64),
                      (cfgs.GLUON_WS_256_VARLEN, cap30, 256), (ws, cap80, 128),
                      (ws, feats.Features(window=(7, 0)), 128), (online, cap30, 128), (cfgs.GLUON_WS, cap30, 128),
                      (cfgs.Config(), cap30, 128)):
        assert pick(cfg, f, d, torch.bfloat16) is cfg, (cfg.label(), f, d)
