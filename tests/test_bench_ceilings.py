"""Ceilings: measured here (tiny sizes on the CPU), cached per device and software, unknown when never measured."""

import json
from pathlib import Path

import pytest
import torch

from attnprof.bench import ceilings as C
from attnprof.cli import main
from attnprof.errors import UsageError


@pytest.fixture(autouse=True)
def cache_dir(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.setenv("ATTNPROF_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def tiny() -> C.Ceilings:
    return C.measure_ceilings("cpu", matmul_n=128, copy_mib=4, reps=5)


def test_unknown_until_measured_then_cached(cache_dir: Path):
    assert C.get_ceilings("cpu") is None  # never guessed
    found = tiny()
    C.store(found)
    again = C.get_ceilings("cpu")
    assert again is not None and again.matmul_tflops == found.matmul_tflops and again.copy_gbps == found.copy_gbps
    data = json.loads((cache_dir / "ceilings.json").read_text())
    assert data["schema"] == "attnprof.ceilings/1"
    assert list(data["entries"]) == [C.cache_key("cpu")]
    assert f"torch {torch.__version__}" in C.cache_key("cpu")


def test_measured_rates_are_plausible_for_this_cpu():
    found = tiny()
    assert found.matmul("fp32") is not None and 1e-5 < found.matmul("fp32") < 50  # TFLOP/s of a CPU
    assert found.copy_gbps is not None and 0.05 < found.copy_gbps < 5000
    assert set(found.matmul_tflops) | {k.removeprefix("matmul_") for k in found.unknown} == set(C.MATMUL_DTYPES)
    assert set(C.MATMUL_DTYPES) == {"bf16", "fp16", "fp32", "fp8"}
    assert found.provenance["device"] == found.device


def test_another_software_stack_is_a_new_measurement(cache_dir: Path):
    found = tiny()
    other = C.Ceilings(device=found.device, key=found.key.replace(f"torch {torch.__version__}", "torch 0.0.1"),
                       matmul_tflops={"fp32": 1.0}, copy_gbps=1.0)
    C.store(other)
    assert C.get_ceilings("cpu") is None  # the entry for torch 0.0.1 is not ours


def test_percent_is_none_when_unknown():
    assert C.percent(50.0, 100.0) == 50.0
    assert C.percent(50.0, None) is None
    assert C.percent(None, 100.0) is None
    assert C.percent(float("nan"), 100.0) is None


def test_corrupt_cache_is_a_usage_error(cache_dir: Path):
    cache_dir.mkdir(parents=True)
    (cache_dir / "ceilings.json").write_text("{not json")
    with pytest.raises(UsageError, match="ceilings cache .* unreadable"):
        C.get_ceilings("cpu")


def test_cli_show_says_unknown_then_shows_cached(tmp_path: Path, capsys):
    assert main(["ceilings", "--device", "cpu", "--show", "--json"]) == 0
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert last["known"] is False
    C.store(tiny())
    assert main(["ceilings", "--device", "cpu", "--json", "--out", str(tmp_path / "o")]) == 0
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert last["known"] is True and last["source"] == "cached" and last["matmul_tflops"]["fp32"] > 0


def test_fp8_on_the_cpu_is_unknown_with_why_decided_before_any_fp8_work(monkeypatch):
    tried: list[str] = []
    real = C.measure_matmul

    def spy(device, dtype, n, **kw):
        tried.append(dtype)
        return real(device, dtype, n, **kw)

    monkeypatch.setattr(C, "measure_matmul", spy)
    found = tiny()
    assert "fp8" not in tried and "fp8" not in found.matmul_tflops  # refused from the device, never run for seconds
    why = found.unknown["matmul_fp8"]
    assert "CUDA GPU of compute capability 8.9" in why and "_scaled_mm" in why and "cpu" in why, why
    assert "\n" not in why
    assert "e4m3 × e4m3 → bf16" in found.method["fp8"] and "torch._scaled_mm" in found.method["fp8"]
    assert "scales 1.0" in found.method["fp8"]


def test_fp8_refused_below_compute_capability_8_9_and_without_scaled_mm(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))  # an A100
    assert C.fp8_refusal("cuda") == ("FP8 matmul needs a CUDA GPU of compute capability 8.9 or newer "
                                     "(torch._scaled_mm); this one is 8.0")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))  # an H100 / H200
    assert C.fp8_refusal("cuda:0") is None
    monkeypatch.delattr(torch, "_scaled_mm")
    assert "torch._scaled_mm" in C.fp8_refusal("cuda")


def test_a_raising_scaled_mm_is_an_unknown_in_one_line_not_a_traceback(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("scaled_mm: this build has no fp8 kernels\nat line 1\nat line 2")

    monkeypatch.setattr(C, "fp8_refusal", lambda device: None)  # as if the CPU were an H100
    monkeypatch.setattr(torch, "_scaled_mm", broken)
    found = tiny()
    assert found.unknown["matmul_fp8"] == "scaled_mm: this build has no fp8 kernels"
    assert "fp8" not in found.matmul_tflops and found.matmul("fp32") is not None


def test_fp8_call_is_what_scaled_mm_takes():
    """The arguments (column-major B, fp32 scalar scales, bf16 out) as this torch accepts them; the CPU has an
    emulation of `_scaled_mm`, slow but enough to check the call."""
    assert C.measure_matmul("cpu", "fp8", 32, reps=2, warmup=1) > 0


def test_cli_shows_fp8_unknown_with_why(tmp_path: Path, capsys):
    C.store(tiny())
    assert main(["ceilings", "--device", "cpu", "--json", "--out", str(tmp_path / "o")]) == 0
    printed = capsys.readouterr().out
    last = json.loads(printed.strip().splitlines()[-1])
    assert "fp8" not in last["matmul_tflops"] and "8.9" in last["unknown"]["matmul_fp8"]
    assert "_scaled_mm" in last["method"]["fp8"]
    table = " ".join(printed.split())  # the table wraps at 80 columns
    assert "fp8 matmul" in table and "unknown: FP8 matmul" in table


@pytest.mark.cuda
def test_fp8_ceiling_beats_bf16_on_an_fp8_gpu():
    """On Hopper FP8 tensor cores run about twice bf16's rate; 1.2× leaves room for clocks and noise."""
    if C.fp8_refusal("cuda"):
        pytest.skip(C.fp8_refusal("cuda"))
    found = C.measure_ceilings("cuda", reps=10)
    assert "matmul_fp8" not in found.unknown, found.unknown
    assert found.matmul("fp8") > 1.2 * found.matmul("bf16"), found.matmul_tflops
