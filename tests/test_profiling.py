"""The real profiler on the CPU: naive shows the out-of-place copy, in-place does not, SDPA is one fused op."""

import pytest

from attnprof.profiling.capture import capture
from attnprof.profiling.summary import summarize
from attnprof.profiling.trace import load_trace
from attnprof.variants import VARIANTS
from attnprof.workload import Workload


@pytest.fixture(scope="module")
def summaries(tmp_path_factory):
    folder = tmp_path_factory.mktemp("traces")
    inputs = Workload(batch=1, heads=2, seq=64, head_dim=32).make_inputs()
    out = {}
    for name in ("naive", "inplace", "sdpa", "sdpa-math"):
        path = capture(lambda n=name: VARIANTS[n](inputs), folder / f"{name}.json", device="cpu", steps=3, warmup=1)
        out[name] = summarize(load_trace(path))
    return out


def roles(summary):
    return summary.per_role()


def test_steps_are_found_and_counted(summaries):
    assert all(s.steps == 3 for s in summaries.values())


def test_naive_has_the_score_copy_and_inplace_does_not(summaries):
    naive = {k.name for k in summaries["naive"].kernels if k.role == "copy"}
    assert "aten::copy_" in naive
    assert roles(summaries["inplace"]).get("copy", 0) == 0
    assert summaries["naive"].kernels_per_step == summaries["inplace"].kernels_per_step + 1


def test_naive_rebuilds_the_mask_every_step(summaries):
    assert roles(summaries["naive"])["mask_build"] >= 1


def test_sdpa_is_one_fused_op_and_math_is_not(summaries):
    sdpa = summaries["sdpa"]
    assert sdpa.kernels_per_step == 1 and sdpa.kernels[0].role == "fused_attention"
    assert sdpa.backends == ["cpu_flash"]
    math = roles(summaries["sdpa-math"])
    assert "fused_attention" not in math and math["gemm"] == 2 and math["softmax"] == 1


def test_stages_say_why_sdpa_did_not_get_the_fastest_backend(tmp_path):
    from attnprof.report.stages_report import dispatch_lines
    from attnprof.stages import run_stages

    w = Workload(batch=1, heads=2, seq=32, head_dim=16)
    auto, pinned = run_stages(w, [VARIANTS["sdpa"], VARIANTS["sdpa-math"]], tmp_path, steps=1, reps=20)
    assert not auto.dispatch  # PyTorch's own choice here is the fastest backend: nothing to explain
    (fallback,) = pinned.dispatch
    assert (fallback["ran"], fallback["preferred"]) == ("math", "cpu_flash")
    assert "switched off" in fallback["refusals"]["cpu_flash"]
    assert dispatch_lines(pinned)[0].startswith("SDPA ran math, not cpu_flash")


# --- attribution: every kernel → the op that launched it, and the cause from that op --------------------------

def _layout_copy_then_masked_fill(q):
    """A layout copy (transpose + contiguous) and an out-of-place masked_fill: both make a copy_."""
    import torch

    k = q.transpose(1, 2).contiguous()
    mask = torch.zeros(q.shape[-1], dtype=torch.bool)
    return k.sum() + q.masked_fill(mask, 0.0).sum()


def test_a_layout_copy_and_a_masked_fill_copy_are_explained_differently(tmp_path):
    import torch

    q = torch.randn(1, 2, 16, 8)
    path = capture(lambda: _layout_copy_then_masked_fill(q), tmp_path / "t.json", device="cpu", steps=2, warmup=1)
    summary = summarize(load_trace(path))
    copies = [k for k in summary.kernels if k.role == "copy"]
    by_op = {k.op: k for k in copies}
    assert {"contiguous", "masked_fill"} <= set(by_op), copies
    layout, masked = by_op["contiguous"].cause, by_op["masked_fill"].cause
    assert "layout" in layout.what and "masked_fill_" in masked.fix
    assert layout.text() != masked.text()
    assert all(k.per_step == 1 for k in by_op.values())  # one row per (kernel, launching op), counted per step


def test_h200_kernels_are_attributed_to_the_aten_op_that_launched_them():
    """A real H200 trace (naive, bf16): the device copy comes from masked_fill, the memset from the GEMM."""
    from pathlib import Path

    from attnprof.profiling.causes import explain

    summary = summarize(load_trace(Path(__file__).parent / "data" / "h200-naive.trace.json.gz"))
    by_role = {k.role: k for k in summary.kernels}
    copy = by_role["copy"]
    assert copy.name.startswith("Memcpy DtoD") and copy.origin.chain[0] == "masked_fill"
    assert copy.cause.op == "masked_fill"
    assert by_role["softmax"].origin.chain[0] == "softmax"
    assert by_role["mask_build"].cause.what.startswith("the causal mask is rebuilt")
    memset = by_role["memset"]
    assert memset.origin.chain[0] == "matmul" and "cuBLAS" in explain(memset.name, "memset", memset.origin).what
    js = copy.to_json()
    assert js["name"] == copy.name and js["launched_by"]["ops"][0] == "masked_fill" and js["cause"]["op"]


def test_a_quantize_kernel_has_its_own_role_and_cause():
    from attnprof.profiling.attribution import Origin
    from attnprof.profiling.causes import explain
    from attnprof.profiling.classify import classify_gpu

    for name in ("quant_per_block_int8_kernel", "void QuantInt8Kernel<64u, 128u>(half*, signed char*)",
                 "void MeanScaleKernel<64u, false, __nv_bfloat16>(__nv_bfloat16*, signed char*)",
                 "void TransposePadPermuteKernel<128u, 64u, true, half>(half*, half*, unsigned int)"):
        assert classify_gpu(name).role == "quantize", name
    assert classify_gpu("qk_int8_sv_f8_accum_f32_attn_inst_buf").role == "fused_attention"
    cause = explain("quant_per_block_int8_kernel", "quantize", Origin())
    assert "quantization" in cause.what and cause.op is None


def test_the_python_call_site_is_read_when_the_trace_has_the_stack(tmp_path):
    import torch
    from torch.profiler import ProfilerActivity, profile

    from attnprof.profiling.attribution import attribute

    q = torch.randn(1, 2, 16, 8)
    with profile(activities=[ProfilerActivity.CPU], with_stack=True) as prof:
        _layout_copy_then_masked_fill(q)
    prof.export_chrome_trace(str(tmp_path / "s.json"))
    trace = load_trace(tmp_path / "s.json")
    origins = attribute(trace)
    sites = {origins[id(e)].site for e in trace.events if e.name == "aten::contiguous" and id(e) in origins}
    assert any(s and "test_profiling.py" in s and "_layout_copy_then_masked_fill" in s for s in sites), sites


def test_attnprof_trace_names_the_launching_op():
    from pathlib import Path

    from attnprof.audit.tracecheck import analyze

    report = analyze(load_trace(Path(__file__).parent / "data" / "h200-naive.trace.json.gz"))
    causes = [c for s in report.steps for c in s.causes]
    assert any(c.startswith("Memcpy DtoD") and "aten::masked_fill" in c for c in causes), causes
    assert report.to_json()["steps"][0]["causes"]
