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
    assert set(found.matmul_tflops) | {k.removeprefix("matmul_") for k in found.unknown} == {"bf16", "fp16", "fp32"}
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
