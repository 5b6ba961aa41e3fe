"""`--dtype fp8`: FP8 attention (e4m3 q, k, v, bf16 activations and output) across the commands, on the CPU.

The inputs are quantized once with power-of-two descales (so the dequantised values, what the oracle takes, are exact)
and a variant with an FP8 path quantizes them again inside its call (`attnprof::quantize_fp8`, counted in its profile
as role `quantize`). Variants without one are rejected with their reason, never run in bf16 under the fp8 name. The
gate judges FP8 attention against `plain_fp8_attention` (FlashAttention-3's arithmetic written out), so a correct
FP8 function passes and a wrong descale fails; the lossy factor says what FP8 costs against bf16. Our kernel (its
FP8 prefill) runs under Triton's interpreter in a child process.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

import pytest
import torch

from attnprof.audit.envelope import Cell, probe
from attnprof.cli import main
from attnprof.errors import UsageError
from attnprof.profiling.attribution import Origin
from attnprof.profiling.summary import _gpu_role
from attnprof.profiling.trace import Event
from attnprof.run import Status, run
from attnprof.variants import fp8 as fp8_module
from attnprof.variants.fp8 import quantize_fp8
from attnprof.variants.naive import NAIVE
from attnprof.variants.sdpa import SDPA
from attnprof.variants.user import load_user_variant
from attnprof.workload import Workload, fp8_quantize
from interpreter_child import child_report

INTERPRETER_CHILD = True  # its child starts in the background once tests are collected (conftest.py)

CORRECT = "tests.broken:fp8_attn_correct"
BROKEN = ("tests.broken:fp8_attn_q_descale_2x", "tests.broken:fp8_attn_v_descale_ignored",
          "tests.broken:fp8_attn_scale_off_1pct")  # the last: caught by the scale check alone


def test_fp8_inputs_are_exact_bf16_values_and_the_quantize_op_gives_back_their_bytes(monkeypatch):
    w = Workload(batch=2, heads=4, kv_heads=2, seq=24, head_dim=64, dtype="e4m3", causal=True)
    assert w.dtype == "fp8" and w.torch_dtype == torch.bfloat16 and w.fp8_attention == torch.float8_e4m3fn
    assert "fp8" in w.label() and w.to_json()["dtype"] == "fp8"
    i = w.make_inputs(0)
    c = i.fp8_qkv
    assert i.q.dtype == torch.bfloat16 and c.q_descale.shape == (2, 2) == c.k_descale.shape  # [B, Hkv], FA3's
    for d in (c.q_descale, c.k_descale, c.v_descale):
        assert torch.equal(torch.exp2(torch.log2(d).round()), d)  # powers of two
    q8 = quantize_fp8(i.q, c.q_descale, c.fmt)
    per_head = c.q_descale_per_head(4)
    assert torch.equal(q8.view(torch.uint8), fp8_quantize(c.q_orig, per_head, c.fmt).view(torch.uint8))
    assert torch.equal(i.q.double(), q8.double() * per_head.double()[:, :, None, None])  # exact in bf16
    assert q8.float().abs().amax() > 224  # the range is used
    monkeypatch.setitem(fp8_module._ONE_KERNEL, "cpu", False)  # a device that cannot store FP8 from a division
    assert torch.equal(quantize_fp8(i.q, c.q_descale, c.fmt).view(torch.uint8), q8.view(torch.uint8))
    err = ((i.k - c.k_orig).double().norm() / c.k_orig.double().norm()).item()
    assert 0.005 < err < 0.05, err  # quantized, by e4m3's 3 mantissa bits
    assert i.unquantized().q is c.q_orig and i.unquantized().fp8_qkv is None
    assert w.input_bytes() < w.replace(dtype="bf16").input_bytes()  # q, k, v one byte each, the output two
    strided = w.replace(transposed=True).make_inputs(0)  # [B, S, H, D] storage seen as [B, H, S, D], as models do
    assert strided.q.stride()[1:] == (64, 4 * 64, 1) and strided.k.stride()[1:] == (64, 2 * 64, 1)


@pytest.mark.parametrize("bad, words", [
    (dict(dtype="fp7"), "choose one of fp32, fp16, bf16, fp64, fp8"),
    (dict(dtype="fp8", kv_dtype="fp8"), "already quantizes the keys and values"),
])
def test_bad_fp8_workloads_are_usage_errors(bad, words):
    with pytest.raises(UsageError, match=words):
        Workload(**bad)


@pytest.mark.parametrize("argv", [
    ["serve", "--model", "tiny-llama"], ["verify", "--model", "tiny-llama"], ["audit", "--model", "tiny-llama"],
])
def test_fp8_as_a_model_dtype_is_one_line_and_exit_2(tmp_path, capsys, argv):
    assert main([*argv, "--device", "cpu", "--dtype", "fp8", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "a model's weights take bf16, fp16 or fp32" in err[0], err
    assert not (tmp_path / "o").exists()


def test_variants_without_an_fp8_path_are_rejected_with_their_reason():
    w = Workload(seq=16, dtype="fp8")
    assert "no FP8 attention path" in NAIVE.check(w).reason
    sdpa = SDPA.check(w).reason
    assert "no FP8 attention" in sdpa and torch.__version__ in sdpa and "experimental" in sdpa  # torch 2.13 has one
    assert load_user_variant(CORRECT).check(w).ok
    assert "no FP8 attention path" in load_user_variant("tests.broken:correct").check(w).reason
    assert NAIVE.check(w.replace(dtype="bf16")).ok  # only FP8 attention is refused


def test_the_gate_passes_correct_fp8_attention_and_catches_a_wrong_descale(tmp_path):
    out = tmp_path / "v"
    rc = main(["verify", "--device", "cpu", "--dtype", "fp8", "--cases", "gqa,chunk",
               "--variants", ",".join(["sdpa", CORRECT, *BROKEN]), "--seed", "3", "--out", str(out)])
    assert rc == 1  # the broken descales fail
    data = json.loads((out / "verify.json").read_text())
    summary = data["kernel"]["summary"]
    assert summary[CORRECT]["status"] == "pass", summary[CORRECT]
    for name in BROKEN:
        assert summary[name]["status"] == "fail", name
    rows = [r for c in data["kernel"]["cases"] for r in c["results"]]
    assert all(r["status"] == "rejected" and "no FP8 attention" in r["reason"] for r in rows if r["variant"] == "sdpa")
    correct = [r for r in rows if r["variant"] == CORRECT]
    assert all(r["lossy_factor"] > 3 and r["kv_read"] is None for r in correct), correct  # e4m3 costs >> bf16
    assert "FP8 attention: q, k and v were quantized to e4m3" in (out / "verify.md").read_text()


def test_the_quantize_steps_are_counted_and_named_in_the_profile(tmp_path):
    w = Workload(batch=1, heads=4, kv_heads=2, seq=32, head_dim=64, dtype="fp8")
    r = run(load_user_variant(CORRECT), w, profile=tmp_path / "trace.json", steps=2)
    assert r.status is Status.OK, r.reason
    quantize = [k for k in r.summary.kernels if k.role == "quantize"]
    assert sum(k.per_step for k in quantize) >= 3, r.summary.kernels  # q, k and v, each at least one kernel
    assert all(k.cause.op == "attnprof::quantize_fp8" for k in quantize), quantize
    assert "attnprof::quantize_fp8: quantization of the inputs" in quantize[0].cause.text()


def test_bench_times_fp8_attention_against_sdpa_bf16_of_the_same_shape(tmp_path):
    """SDPA has no FP8 path, so an FP8 cell's `× sdpa` is against SDPA's bf16 cell of the same shape."""
    out = tmp_path / "b"
    rc = main(["bench", "--device", "cpu", "--dtype", "bf16,fp8", "--variants", f"sdpa,{CORRECT}", "--batch", "1",
               "--heads", "2", "--seq", "64", "--head-dim", "64", "--reps", "5", "--warmup", "1", "--out", str(out)])
    assert rc == 0
    rows = {(r["variant"], r["workload"]["dtype"]): r for r in map(json.loads, (out / "results.jsonl").open())}
    assert rows[("sdpa", "fp8")]["status"] == "rejected" and "no FP8 attention" in rows[("sdpa", "fp8")]["reason"]
    fp8 = rows[(CORRECT, "fp8")]
    assert fp8["status"] == "ok" and fp8["speedup"]["vs_sdpa"] > 0, fp8
    bf16 = rows[(CORRECT, "bf16")]  # its descales have no defaults: FP8 attention only, said before it runs
    assert bf16["status"] == "rejected" and "FP8 attention only" in bf16["reason"], bf16


def test_a_gpu_kernel_inside_the_quantize_op_is_a_quantize_step():
    """On the GPU the op's kernel is an elementwise division: its launching op names it, not its own name."""
    div = Event("void at::native::vectorized_elementwise_kernel<4, at::native::BinaryFunctor<float, float, float, "
                "at::native::binary_internal::DivFunctor<float> > >", "kernel", 0.0, 1.0, {})
    assert _gpu_role(div, Origin(("attnprof::quantize_fp8", "div"))) == ("quantize", None)
    assert _gpu_role(div, Origin(("div",)))[0] == "scale"


def test_the_audit_says_sdpa_has_no_fp8_path_and_whether_the_kernel_has():
    r = probe(Cell("head_dim×dtype", Workload(seq=16, dtype="fp8")))
    assert r.status == "error" and "no FP8 attention" in r.error
    assert "the kernel cannot either" in r.error  # no GPU, no interpreter here: the kernel's own reason follows


def _child() -> dict:
    """Our kernel's FP8 prefill under Triton's interpreter: `verify --dtype fp8` and `stages --dtype fp8`."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `tests.broken` as the main process imports it
    out = tempfile.mkdtemp(prefix="fp8-attention-")
    verify_rc = main(["verify", "--device", "cpu", "--dtype", "fp8", "--cases", "gqa,chunk,odd-causal",
                      "--variants", f"kernel,{CORRECT}", "--seed", "4", "--out", out + "/verify"])
    stages_rc = main(["stages", "--device", "cpu", "--dtype", "fp8", "--batch", "1", "--heads", "4", "--kv-heads", "2",
                      "--seq", "64", "--head-dim", "64", "--out", out + "/stages"])
    return {"verify_rc": verify_rc, "stages_rc": stages_rc, "tmp": out}


@pytest.fixture(scope="module")
def kernel_child():
    yield from child_report(__file__)


def test_the_kernel_runs_fp8_attention_within_the_gate_and_says_what_it_costs(kernel_child):
    last, tmp = kernel_child, Path(kernel_child["tmp"])
    assert last["verify_rc"] == 0, last
    rows = {(c["name"], r["variant"]): r for c in json.loads((tmp / "verify" / "verify.json").read_text())["kernel"][
        "cases"] for r in c["results"]}
    for case in ("gqa", "chunk"):
        r = rows[(case, "kernel")]
        assert r["status"] == "pass" and r["lossy_factor"] > 3, r
        # the kernel's error is FP8 attention's own: about the plain FP8 arithmetic's (limit = 2x it)
        assert abs(r["lossy_factor"] / rows[(case, CORRECT)]["lossy_factor"] - 1) < 0.5, (r, rows[(case, CORRECT)])
    odd = rows[("odd-causal", "kernel")]  # head dim 80
    assert odd["status"] == "rejected" and "head dims 64, 128" in odd["reason"], odd


def test_stages_runs_only_the_kernel_and_counts_its_quantize_steps(kernel_child):
    last, tmp = kernel_child, Path(kernel_child["tmp"])
    assert last["stages_rc"] == 0, last
    results = json.loads((tmp / "stages" / "results.json").read_text())
    stages = {s["variant"]: s for s in results["stages"]}
    assert all(stages[n]["status"] == "rejected" and "no FP8 attention" in stages[n]["reason"]
               for n in ("naive", "inplace", "sdpa")), stages
    kernel = stages["kernel"]
    assert kernel["status"] == "ok", kernel
    quantize = [k for k in kernel["kernels"] if k["role"] == "quantize"]
    assert sum(k["per_step"] for k in quantize) >= 3, kernel["kernels"]  # q, k, v
    assert all(k["cause"]["op"] == "attnprof::quantize_fp8" for k in quantize), quantize


if __name__ == "__main__":
    assert os.environ.get("TRITON_INTERPRET") == "1", "run the child with TRITON_INTERPRET=1"
    print(json.dumps(_child()))
