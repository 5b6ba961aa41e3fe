"""flash-triton's FP8 Gluon program (`_gluon_fp8.py`, sm_90) on a real GPU: `fp8_attention(..., program="gluon")`
against fp64 attention over the dequantised inputs and against the Triton FP8 program (`make test-gpu` runs these).

The rule is tests/test_kernel_fp8_prefill.py's: P is quantized to e4m3 for P·V, so the error may be up to 1.5x
(+1e-3) that of an fp64 emulation with the same P quantization (P relative to the row max, cast to e4m3 by torch).
The Triton program obeys the same rule, so the two programs may differ by up to twice that (their running maxima,
hence their quantized P, differ: key blocks of 64 there, 128 here). A wrong key order between P and Vᵀ
(`p_operand_keys` / `permuted_vt`), a wrong descale or a wrong tile coordinate is far outside either bound.
"""

from __future__ import annotations

import importlib

import pytest
import torch

from attnprof.variants import kernel_hub
from test_kernel_fp8_prefill import _quantize

pytestmark = pytest.mark.cuda

CASES = [  # (B, Sq, Sk, Hq, Hkv, D, causal, per-tensor descales, layout)
    *[(2 if s == 1024 else 1, s, s, 32, 8, d, causal, False, "rows")
      for s in (1024, 4096) for d in (64, 128) for causal in (True, False)],
    (2, 512, 2048, 32, 8, 128, True, False, "rows"),  # a chunk of prefill: Sq < Sk, bottom-right causal
    (2, 1024, 1024, 32, 8, 64, True, True, "rows"),  # one descale per tensor
    (2, 1024, 1536, 16, 4, 128, False, False, "heads"),  # [B, S, H, D] views of [B, H, S, D]; v keys-contiguous
]


def _id(c) -> str:
    return (f"b{c[0]}-{c[1]}x{c[2]}-h{c[3]}of{c[4]}-d{c[5]}-{'causal' if c[6] else 'full'}"
            + ("-per-tensor" if c[7] else "") + ("-heads" if c[8] == "heads" else ""))


@pytest.fixture(scope="module")
def fp8():
    module = kernel_hub.load()
    assert hasattr(module, "fp8_attention"), module
    return importlib.import_module(module.__name__ + "._fp8")


def _inputs(case, seed: int = 0):
    b, sq, sk, hq, hkv, d, causal, per_tensor, layout = case
    gen = torch.Generator(device="cuda").manual_seed(seed)
    g = hq // hkv
    q, k, v = (torch.randn(b, s, h, d, generator=gen, device="cuda") for s, h in ((sq, hq), (sk, hkv), (sk, hkv)))
    (q8, qd, qx), (k8, kd, kx), (v8, vd, vx) = (_quantize(q, g, per_tensor), _quantize(k, 1, per_tensor),
                                                _quantize(v, 1, per_tensor))
    if layout == "heads":  # q, k as views of [B, H, S, D] storage (PyTorch's layout); v with the keys contiguous
        q8, k8 = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q8, k8))
        v8 = v8.transpose(1, 3).contiguous().transpose(1, 3)
    return (q8, k8, v8, qd, kd, vd), (qx, kx, vx)


def _oracle(qx, kx, vx, causal: bool):
    """fp64 attention over the dequantised inputs, and its emulation with P cast to e4m3 (relative to the row max),
    one kv head's query group at a time (fp64 scores of 32 heads x 4096² would be 4 GiB)."""
    b, sq, hq, d = qx.shape
    sk, hkv = kx.shape[1], kx.shape[2]
    g = hq // hkv
    ref, emu = torch.empty_like(qx), torch.empty_like(qx)
    mask = torch.arange(sk, device=qx.device)[None, :] > torch.arange(sq, device=qx.device)[:, None] + sk - sq
    for j in range(hkv):
        heads = slice(j * g, (j + 1) * g)
        s = torch.einsum("bqhd,bkd->bhqk", qx[:, :, heads], kx[:, :, j]) * d ** -0.5
        if causal:
            s = s.masked_fill(mask, float("-inf"))
        ref[:, :, heads] = torch.einsum("bhqk,bkd->bqhd", s.softmax(-1).nan_to_num(0.0), vx[:, :, j])
        pe = torch.exp(s - s.amax(-1, keepdim=True)).nan_to_num(0.0)
        out = torch.einsum("bhqk,bkd->bqhd", pe.float().to(torch.float8_e4m3fn).double(), vx[:, :, j])
        emu[:, :, heads] = out / pe.sum(-1).clamp_min(1e-300).transpose(1, 2)[..., None]
        del s, pe
    return ref, emu


def _rel(out, ref) -> float:
    return ((out.double().nan_to_num(nan=float("inf")) - ref).norm() / ref.norm()).item()


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_gluon_fp8_matches_the_oracle_and_the_triton_program(fp8, case):
    (q8, k8, v8, qd, kd, vd), (qx, kx, vx) = _inputs(case)
    causal = case[6]
    why = fp8._gluon_problem(q8, k8, v8, causal)
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip(f"sm_90 only: {why}")
    assert why is None, why
    out = fp8.fp8_attention(q8, k8, v8, None, causal, qd, kd, vd, program="gluon")
    triton_out = fp8.fp8_attention(q8, k8, v8, None, causal, qd, kd, vd, program="triton")
    ref, emu = _oracle(qx, kx, vx, causal)
    emulated = _rel(emu, ref)
    r = {"gluon": _rel(out, ref), "triton": _rel(triton_out, ref), "emulated": emulated,
         "gluon-vs-triton": _rel(out, triton_out.double())}
    assert out.dtype == torch.bfloat16 and out.shape == q8.shape and out.is_contiguous(), r
    assert bool(out.float().isfinite().all()), r
    assert r["gluon"] <= 1.5 * emulated + 1e-3, r
    assert r["triton"] <= 1.5 * emulated + 1e-3, r  # the rule holds for the program it replaces
    assert r["gluon-vs-triton"] <= 3 * emulated + 2e-3, r
    # every (batch, query head) is right, not only the norm over all of them: a wrong tile coordinate shows here
    per_head = ((out.double() - ref).norm(dim=(1, 3)) / ref.norm(dim=(1, 3))).max().item()
    assert per_head <= 3 * emulated + 2e-3, (per_head, r)


@pytest.mark.parametrize("exp_poly", [0, 2, 4])
def test_exponentials_on_the_fma_pipes_keep_the_oracle(fp8, exp_poly):
    """`exp_poly`: one score exponential in 2 or 4 from the polynomial (relative error 1e-4, under e4m3's rounding of
    P; 4 is the default, `FP8_EXP_POLY`) or none (0) within the same bound, at head dims 64 and 128."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("sm_90 only")
    for case in (CASES[0], CASES[2]):  # head dims 64 and 128, causal
        (q8, k8, v8, qd, kd, vd), (qx, kx, vx) = _inputs(case)
        causal = case[6]
        out = fp8.fp8_attention(q8, k8, v8, None, causal, qd, kd, vd, exp_poly=exp_poly)
        ref, emu = _oracle(qx, kx, vx, causal)
        assert _rel(out, ref) <= 1.5 * _rel(emu, ref) + 1e-3, (case, _rel(out, ref), _rel(emu, ref))


@pytest.mark.parametrize("option", ["pingpong", "v_wait_early"])
def test_the_schedule_options_keep_the_oracle(fp8, option):
    """The schedule alone changes, within the same bound, at head dims 64 and 128, causal and not, a prefill chunk
    (Sq < Sk) and head-major views, with the default exponentials: `pingpong` (the consumers' products issued in
    turns), `v_wait_early` (each key block's values waited for at the end of its softmax)."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("sm_90 only")
    for case in (*CASES[:4], CASES[8], CASES[10]):
        (q8, k8, v8, qd, kd, vd), (qx, kx, vx) = _inputs(case)
        causal = case[6]
        out = fp8.fp8_attention(q8, k8, v8, None, causal, qd, kd, vd, **{option: True})
        ref, emu = _oracle(qx, kx, vx, causal)
        assert _rel(out, ref) <= 1.5 * _rel(emu, ref) + 1e-3, (case, _rel(out, ref), _rel(emu, ref))


def test_gluon_fp8_applies_the_descales(fp8):
    """A value descale off by 2x, or a query descale off by 4x (the logits' scale), is far outside the rule."""
    case = (2, 1024, 1024, 32, 8, 128, True, False, "rows")
    (q8, k8, v8, qd, kd, vd), (qx, kx, vx) = _inputs(case, seed=1)
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("sm_90 only")
    ref, emu = _oracle(qx, kx, vx, True)
    good = _rel(fp8.fp8_attention(q8, k8, v8, None, True, qd, kd, vd, program="gluon"), ref)
    broken_v = _rel(fp8.fp8_attention(q8, k8, v8, None, True, qd, kd, vd * 2, program="gluon"), ref)
    broken_q = _rel(fp8.fp8_attention(q8, k8, v8, None, True, qd * 4, kd, vd, program="gluon"), ref)
    assert good <= 1.5 * _rel(emu, ref) + 1e-3
    assert broken_v > 10 * good + 0.1 and broken_q > 5 * good, (good, broken_v, broken_q)


def test_auto_takes_the_gluon_program_where_it_runs_and_gluon_refuses_with_the_reason(fp8):
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("sm_90 only")
    (q8, k8, v8, qd, kd, vd), _ = _inputs((1, 1024, 1024, 8, 2, 128, True, False, "rows"), seed=2)
    gluon = fp8.fp8_attention(q8, k8, v8, None, True, qd, kd, vd, program="gluon")
    assert torch.equal(fp8.fp8_attention(q8, k8, v8, None, True, qd, kd, vd, program="auto"), gluon)
    assert torch.equal(fp8.fp8_attention(q8, k8, v8, None, True, qd, kd, vd, program="gluon"), gluon)  # deterministic
    ragged = q8[:, :1000]
    with pytest.raises(ValueError, match="multiple of 128"):
        fp8.fp8_attention(ragged, k8, v8, None, True, qd, kd, vd, program="gluon")
    assert torch.equal(fp8.fp8_attention(ragged, k8, v8, None, True, qd, kd, vd, program="auto"),
                       fp8.fp8_attention(ragged, k8, v8, None, True, qd, kd, vd))  # the Triton program


def test_the_permuted_vt_kernel_matches_its_torch_reference(fp8):
    """`_transpose_keys_permuted` (Vᵀ in the key order `p_operand_keys` gives P) against `permuted_vt_reference`,
    from both v layouts it is handed (head dim contiguous, keys contiguous)."""
    g = importlib.import_module(fp8.__name__.rsplit(".", 1)[0] + "._gluon_fp8")
    v = torch.randn(2, 512, 4, 128, device="cuda").to(torch.float8_e4m3fn)
    want = g.permuted_vt_reference(v)
    for t in (v, v.transpose(1, 3).contiguous().transpose(1, 3)):
        got = g.permuted_vt(t)
        assert got.is_contiguous() and torch.equal(got.view(torch.uint8), want.contiguous().view(torch.uint8))
