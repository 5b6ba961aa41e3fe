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
