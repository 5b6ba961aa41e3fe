"""On a CUDA GPU: the tutorial's kernel story, counted by role (names differ across GPUs and shapes)."""

import pytest
import torch

from attnprof.stages import run_stages
from attnprof.variants import VARIANTS
from attnprof.workload import Workload

pytestmark = pytest.mark.cuda


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    w = Workload(batch=1, heads=16, seq=1024, head_dim=64, dtype="bf16", device="cuda")
    names = ["naive", "inplace", "sdpa", "sdpa-math", "flex"]
    stages = run_stages(w, [VARIANTS[n] for n in names], tmp_path_factory.mktemp("gpu"), steps=3, reps=20)
    return {r.variant: r for r in stages}


def per_role(r):
    return r.summary.per_role()


def test_naive_launches_a_device_copy_that_inplace_does_not(results):
    assert any(k.role == "copy" and "Memcpy" in k.name for k in results["naive"].summary.kernels)
    assert per_role(results["inplace"]).get("copy", 0) == 0
    assert per_role(results["naive"])["gemm"] == 2 and per_role(results["naive"])["softmax"] == 1


def test_sdpa_is_one_fused_kernel_and_the_watcher_agrees_with_the_trace(results):
    sdpa = results["sdpa"]
    fused = [k for k in sdpa.summary.kernels if k.role == "fused_attention"]
    assert len(fused) == 1 and fused[0].per_step == 1
    assert sdpa.backend == fused[0].backend  # dispatch watcher == kernel name in the profiler trace


def test_forced_math_has_no_fused_kernel(results):
    math = results["sdpa-math"]
    assert math.backend == "math"
    assert "fused_attention" not in per_role(math) and per_role(math)["gemm"] >= 2


def test_flex_is_one_triton_kernel(results):
    assert per_role(results["flex"]).get("fused_attention") == 1


def test_every_stage_matches_the_oracle(results):
    for r in results.values():
        assert r.status == "ok", r.reason
        assert r.max_rel_err < 2e-2
    assert torch.cuda.is_available()
