"""`attnprof stages` end to end in a subprocess, the way a user runs it, and every bad input it must refuse."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

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


@pytest.mark.parametrize("args,needle", [
    (["--variants", "nope"], "unknown variant"),
    (["--heads", "6", "--kv-heads", "4"], "divisible"),
    (["--head-dim", "0"], "head-dim"),
    (["--seq", "-3"], "seq"),
    (["--device", "cuda"], "CUDA"),
    (["--dtype", "fp7"], "dtype"),
    (["--variants", "os.path:nonexistent_fn"], "no attribute"),
    (["--variants", "no_such_module_xyz:f"], "cannot import"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, needle):
    if "cuda" in args and __import__("torch").cuda.is_available():
        pytest.skip("this machine has CUDA")
    run = attnprof("stages", *TINY, "--out", str(tmp_path / "r"), *args)
    assert run.returncode == 2, run.stderr
    assert needle in run.stderr
    assert "Traceback" not in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "r" / "results.json").exists()


def test_unwritable_output_folder_is_exit_2(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    run = attnprof("stages", *TINY, "--out", str(blocker / "sub"), "--variants", "sdpa")
    assert run.returncode == 2 and "Traceback" not in run.stderr


def test_user_function_with_wrong_output_shape_is_exit_2(tmp_path):
    (tmp_path / "mine.py").write_text(
        "def attn(q, k, v, *, causal, scale):\n    return q[:, :, :1]\n")
    env_dir = str(tmp_path)
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + env_dir}
    run = subprocess.run([sys.executable, "-m", "attnprof", "stages", *TINY, "--variants", "mine:attn",
                          "--out", str(tmp_path / "r")], capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 2 and "expected a tensor of shape" in run.stderr


def test_a_stage_that_runs_out_of_memory_is_reported_and_the_others_still_run(tmp_path):
    (tmp_path / "greedy.py").write_text(
        "import torch\n"
        "def attn(q, k, v, *, causal, scale):\n"
        "    torch.empty(1 << 50, dtype=torch.uint8)  # a petabyte: the allocator refuses\n"
        "    return q\n")
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + str(tmp_path)}
    run = subprocess.run([sys.executable, "-m", "attnprof", "stages", *TINY, "--variants", "greedy:attn,sdpa",
                          "--out", str(tmp_path / "r"), "--json", "--device", "cpu"],
                         capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr
    stages = {s["variant"]: s for s in json.loads(run.stdout.strip().splitlines()[-1])["stages"]}
    assert stages["greedy:attn"]["status"] == "oom"
    assert "1125899906842624 bytes" in stages["greedy:attn"]["reason"]  # the bytes it asked for
    assert stages["sdpa"]["status"] == "ok"


def test_help_does_not_import_torch():
    """`attnprof --help` must be instant: every command keeps its heavy imports inside its handler."""
    code = "import sys; from attnprof.cli import build_parser; build_parser(); print('torch' in sys.modules)"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": SRC}, timeout=60)
    assert run.stdout.strip() == "False", run.stderr
