"""`attnprof stages` end to end in a subprocess, the way a user runs it, and every bad input it must refuse
(in-process through `cli.main`: the same code path, without paying for a fresh interpreter per case)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from attnprof.cli import main

SRC = str(Path(__file__).resolve().parents[1] / "src")
TINY = ["--batch", "1", "--heads", "2", "--seq", "48", "--head-dim", "32", "--reps", "20", "--steps", "2"]


def attnprof(*args, cwd=None):
    env = {**os.environ, "PYTHONPATH": SRC}
    return subprocess.run([sys.executable, "-m", "attnprof", *args], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=300)


def test_stages_end_to_end_with_json(tmp_path):
    out = tmp_path / "report"
    run = attnprof("stages", *TINY, "--variants", "naive,inplace,sdpa,sdpa-efficient,kernel", "--out", str(out),
                   "--json", "--device", "cpu")
    assert run.returncode == 0, run.stderr
    last = json.loads(run.stdout.strip().splitlines()[-1])
    assert last["schema"] == "attnprof.stages/1"
    by = {s["variant"]: s for s in last["stages"]}
    assert by["naive"]["kernels_per_step"] == by["inplace"]["kernels_per_step"] + 1
    assert by["sdpa"]["backend"] == "cpu_flash"
    assert by["sdpa-efficient"]["status"] == "rejected" and "CPU" in by["sdpa-efficient"]["reason"]
    assert by["kernel"]["status"] == "rejected" and by["kernel"]["reason"]
    results = json.loads((out / "results.json").read_text())
    assert results["provenance"]["torch"] and results["provenance"]["argv"]
    assert results["workload"]["seq"] == 48
    for stage in results["stages"]:
        if stage["status"] == "ok":
            assert stage["max_rel_err"] < 1e-5
            assert stage["latency_ms"]["reps"] >= 20
            assert (out / stage["trace"]).exists()
            json.loads((out / stage["trace"]).read_text())  # Perfetto / chrome://tracing open this JSON
    assert "Stage to stage" in (out / "report.md").read_text()
    assert "USDT" not in run.stderr  # Kineto's chatter is filtered


def test_default_workload_is_explained(tmp_path):
    run = attnprof("variants", "--device", "cpu")
    assert run.returncode == 0
    assert "default for CPU" in run.stdout + run.stderr


def _stages(capsys, *args) -> tuple[int, list[str], str]:
    """`attnprof stages TINY …` in this process: exit code, stderr lines, stdout."""
    code = main(["stages", *TINY, *args])
    captured = capsys.readouterr()
    return code, captured.err.strip().splitlines(), captured.out


@pytest.mark.parametrize("args,needle", [
    (["--variants", "nope"], "unknown variant"),
    (["--heads", "6", "--kv-heads", "4"], "divisible"),
    (["--head-dim", "0"], "head-dim"),
    (["--seq", "-3"], "seq"),
    (["--device", "cuda"], "CUDA"),
    (["--dtype", "fp7"], "dtype"),
    (["--variants", "os.path:nonexistent_fn"], "no attribute"),
    (["--variants", "no_such_module_xyz:f"], "cannot import"),
    (["--steps", "0"], "--steps must be >= 1"),
    (["--kernel", "not a repo!"], "neither an existing kernel repo"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, args, needle):
    if "cuda" in args and __import__("torch").cuda.is_available():
        pytest.skip("this machine has CUDA")
    code, err, _ = _stages(capsys, "--out", str(tmp_path / "r"), *args)
    assert code == 2, err
    assert len(err) == 1 and err[0].startswith("attnprof: error:") and needle in err[0]
    assert not (tmp_path / "r" / "results.json").exists()


def test_unwritable_output_folder_is_exit_2(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    code, err, _ = _stages(capsys, "--out", str(blocker / "sub"), "--variants", "sdpa")
    assert code == 2 and err[-1].startswith("attnprof: error: cannot create report folder")


def test_user_function_with_wrong_output_shape_is_an_error_row(tmp_path, capsys, monkeypatch):
    (tmp_path / "mine_wrong_shape.py").write_text(
        "def attn(q, k, v, *, causal, scale):\n    return q[:, :, :1]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    code, err, _ = _stages(capsys, "--variants", "mine_wrong_shape:attn,sdpa", "--out", str(tmp_path / "r"))
    assert code == 1 and err[-1].startswith("attnprof: check failed:") and "expected a tensor of shape" in err[-1]
    rows = {s["variant"]: s for s in json.loads((tmp_path / "r" / "results.json").read_text())["stages"]}
    assert rows["mine_wrong_shape:attn"]["status"] == "error" and rows["sdpa"]["status"] == "ok"


def test_a_stage_that_runs_out_of_memory_is_reported_and_the_others_still_run(tmp_path, capsys, monkeypatch):
    (tmp_path / "greedy_alloc.py").write_text(
        "import torch\n"
        "def attn(q, k, v, *, causal, scale):\n"
        "    torch.empty(1 << 50, dtype=torch.uint8)  # a petabyte: the allocator refuses\n"
        "    return q\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    code, err, out = _stages(capsys, "--variants", "greedy_alloc:attn,sdpa", "--out", str(tmp_path / "r"), "--json",
                             "--device", "cpu")
    assert code == 0, err
    stages = {s["variant"]: s for s in json.loads(out.strip().splitlines()[-1])["stages"]}
    assert stages["greedy_alloc:attn"]["status"] == "oom"
    assert "1125899906842624 bytes" in stages["greedy_alloc:attn"]["reason"]  # the bytes it asked for
    assert stages["sdpa"]["status"] == "ok"


def test_a_stage_with_a_nan_output_is_an_error_and_exit_1(tmp_path, capsys, monkeypatch):
    (tmp_path / "nan_out.py").write_text(
        "import torch\n"
        "def attn(q, k, v, *, causal, scale):\n"
        "    return torch.full_like(q, float('nan'))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    code, err, _ = _stages(capsys, "--variants", "nan_out:attn,sdpa", "--out", str(tmp_path / "r"))
    assert code == 1 and "nan_out:attn: non-finite output" in err[-1]
    stages = {s["variant"]: s for s in json.loads((tmp_path / "r" / "results.json").read_text())["stages"]}
    assert stages["nan_out:attn"]["status"] == "error" and stages["sdpa"]["status"] == "ok"


def test_help_does_not_import_torch():
    """`attnprof --help` must be instant: every command keeps its heavy imports inside its handler."""
    code = "import sys; from attnprof.cli import build_parser; build_parser(); print('torch' in sys.modules)"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": SRC}, timeout=60)
    assert run.stdout.strip() == "False", run.stderr


def test_a_lossy_stage_is_marked_with_its_factor_and_a_pointer_to_verify(tmp_path, capsys, monkeypatch):
    """A function that rounds q, k, v through bf16 on an fp32 workload (what a quantizing kernel does) runs and is
    finite, but its error vs fp64 is far above plain PyTorch's in fp32: `ok, lossy ×N`, not a silent ok."""
    (tmp_path / "rounds_bf16.py").write_text(
        "import torch\n"
        "def attn(q, k, v, *, causal, scale):\n"
        "    r = lambda t: t.to(torch.bfloat16).to(t.dtype)\n"
        "    return torch.nn.functional.scaled_dot_product_attention(r(q), r(k), r(v), is_causal=causal,"
        " scale=scale)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    code, err, out = _stages(capsys, "--variants", "rounds_bf16:attn,sdpa", "--out", str(tmp_path / "r"))
    assert code == 0, err  # lossy is reported, not a failed run
    stages = {s["variant"]: s for s in json.loads((tmp_path / "r" / "results.json").read_text())["stages"]}
    lossy, sdpa = stages["rounds_bf16:attn"], stages["sdpa"]
    assert lossy["status"] == "lossy" and sdpa["status"] == "ok" and sdpa["lossy"] is None
    assert lossy["lossy"] == pytest.approx(lossy["max_rel_err"] / lossy["baseline_rel_err"]) and lossy["lossy"] > 10
    assert f"ok, lossy ×{lossy['lossy']:.0f}" in out
    assert "attnprof verify --variants rounds_bf16:attn" in (tmp_path / "r" / "report.md").read_text()


def test_third_party_kernels_are_rejected_rows_on_the_cpu_and_naive_compiled_runs(tmp_path, capsys):
    """sageattention/flash-attn/flashinfer/xformers need CUDA: rejected rows with the reason (and the pip command
    where the package is missing); a module:function@convention spec is one too; naive-compiled runs under
    inductor (one tiny compile) and agrees with fp64."""
    code, err, out = _stages(capsys, "--variants", "sageattention,flash-attn,flash-attn-4,flashinfer,xformers,"
                             "flash_attn:flash_attn_func@flash-attn", "--compile", "--out", str(tmp_path / "r"))
    assert code == 0, err
    stages = {s["variant"]: s for s in json.loads((tmp_path / "r" / "results.json").read_text())["stages"]}
    for name in ("sageattention", "flash-attn", "flash-attn-4", "flashinfer", "xformers",
                 "flash_attn:flash_attn_func@flash-attn"):
        assert stages[name]["status"] == "rejected" and "CUDA only" in stages[name]["reason"], stages[name]
    import importlib.util

    if importlib.util.find_spec("xformers") is None:
        assert "pip install xformers" in stages["xformers"]["reason"]
    if importlib.util.find_spec("flash_attn") is None:
        assert "pip install flash-attn-4" in stages["flash-attn-4"]["reason"]
    compiled = stages["naive-compiled"]
    assert compiled["status"] == "ok" and compiled["backend"] == "inductor" and compiled["max_rel_err"] < 1e-5


def test_a_bad_convention_spec_is_exit_2(tmp_path, capsys):
    code, err, _ = _stages(capsys, "--variants", "os:getcwd@nope", "--out", str(tmp_path / "r"))
    assert code == 2 and "module:function@convention" in err[-1]


def test_a_missing_third_party_package_is_a_rejected_row_with_the_pip_command():
    from attnprof.variants.adapters import Library, adapter_variant
    from attnprof.workload import Workload

    v = adapter_variant("nope", Library("attnprof_no_such_pkg", "attn", "flash-attn", "attnprof-no-such-pkg"))
    verdict = v.supports(Workload(device="cuda", dtype="bf16"))
    assert not verdict.ok and verdict.reason == "attnprof_no_such_pkg is not installed: pip install attnprof-no-such-pkg"


def test_the_terminal_view_fits_80_columns_and_wide_shows_every_column(tmp_path, capsys):
    code, err, out = _stages(capsys, "--variants", "naive,sdpa,sageattention", "--out", str(tmp_path / "r"))
    assert code == 0, err
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= 80, max(lines, key=len)
    assert any("← masked_fill" in line for line in lines)  # each kernel with the op that launched it
    assert "TFLOP/s" not in out and "sageattention rejected: " in out
    assert sum("default for CPU" in line for line in err + lines) <= 1  # the workload note, once
    code, err, wide = _stages(capsys, "--variants", "naive,sdpa", "--out", str(tmp_path / "w"), "--wide")
    assert code == 0 and "TFLOP/s" in wide and "peak MiB" in wide
