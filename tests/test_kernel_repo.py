"""The kernel repo and its loading through `kernels`: layout, metadata errors, specs, trust, offline Hub kernels.

None of these launch the kernel (test_kernel_interpret.py does, through Triton's interpreter).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from attnprof.errors import UsageError
from attnprof.variants import VARIANTS, kernel_hub
from attnprof.variants.base import Rejected
from attnprof.workload import Workload

ROOT = Path(__file__).resolve().parents[1]
REPO = ROOT / "kernels" / "flash-triton"


def copy_repo(tmp_path: Path) -> Path:
    dst = tmp_path / "flash-triton"
    shutil.copytree(REPO, dst, ignore=shutil.ignore_patterns("__pycache__"))
    return dst


def test_build_folder_matches_sources():
    done = subprocess.run([sys.executable, str(REPO / "build.py"), "--check"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_layout_is_what_kernels_resolves():
    from kernels import Metadata

    for backend in ("cuda", "cpu"):
        meta = Metadata.read_from_file(REPO / "build" / f"torch-{backend}" / "metadata.json")
        assert str(meta.name) == "flash-triton"
        assert str(meta.backend.backend_type).lower().endswith(backend)
    assert kernel_hub.metadata_problem(REPO) is None


@pytest.mark.parametrize("damage, words", [
    ("missing", "is missing"),
    ("not-json", "is malformed"),
    ("no-id", "missing field `id`"),
])
def test_bad_metadata_is_one_line_naming_the_file(tmp_path, monkeypatch, damage, words):
    repo = copy_repo(tmp_path)
    meta = repo / "build" / "torch-cpu" / "metadata.json"
    if damage == "missing":
        meta.unlink()
    elif damage == "not-json":
        meta.write_text("{not json")
    else:
        body = json.loads(meta.read_text())
        del body["id"]
        meta.write_text(json.dumps(body))
    problem = kernel_hub.metadata_problem(repo)
    assert problem is not None and "\n" not in problem
    assert str(meta) in problem and words in problem
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    verdict = kernel_hub.kernel_variant(kernel_hub.parse_spec(str(repo))).supports(Workload(dtype="fp16"))
    assert isinstance(verdict, Rejected) and str(meta) in verdict.reason


def test_repo_without_build_folder(tmp_path):
    (tmp_path / "empty").mkdir()
    assert "no build/<variant>/" in kernel_hub.metadata_problem(tmp_path / "empty")


def test_no_variant_for_this_system_is_rejected_with_kernels_trace(tmp_path, monkeypatch):
    repo = copy_repo(tmp_path)
    shutil.rmtree(repo / "build" / "torch-cpu")  # only the CUDA variant left; this machine's torch is CPU-only
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    verdict = kernel_hub.kernel_variant(kernel_hub.parse_spec(str(repo))).supports(Workload(dtype="fp16"))
    if not isinstance(verdict, Rejected):
        pytest.skip("this torch is a CUDA build: the torch-cuda variant resolves")
    assert "torch-cuda" in verdict.reason and "does not match" in verdict.reason


@pytest.mark.parametrize("spec, expect", [
    (None, {"path": kernel_hub.DEFAULT_REPO}),
    ("kernels-community/flash-attn@1", {"repo_id": "kernels-community/flash-attn", "version": 1}),
    ("kernels-community/flash-attn@main", {"repo_id": "kernels-community/flash-attn", "revision": "main"}),
])
def test_parse_spec(spec, expect):
    parsed = kernel_hub.parse_spec(spec)
    for key, value in expect.items():
        assert getattr(parsed, key) == value


@pytest.mark.parametrize("spec, words", [
    ("kernels-community/flash-attn", "name a version"),
    ("not a repo!", "neither an existing kernel repo folder"),
])
def test_bad_spec_is_a_usage_error(spec, words):
    with pytest.raises(UsageError, match=words):
        kernel_hub.parse_spec(spec)


def test_hub_kernel_needs_the_users_trust():
    spec = kernel_hub.parse_spec("kernels-community/flash-attn@1", trust_remote=False)
    verdict = kernel_hub.load(spec)
    assert isinstance(verdict, Rejected) and "--trust-remote-kernel" in verdict.reason


def test_local_kernels_mapping_needs_no_trust(tmp_path, monkeypatch):
    repo = copy_repo(tmp_path)
    monkeypatch.setenv("LOCAL_KERNELS", f"someone/flash-triton={repo}")
    monkeypatch.setattr("kernels.load._parse_local_kernel_overrides",
                        __import__("kernels.load", fromlist=["x"])._parse_local_kernel_overrides)
    module = kernel_hub.load(kernel_hub.parse_spec("someone/flash-triton@1"))
    assert not isinstance(module, Rejected), module
    assert callable(module.flash_attn_func)


def test_offline_missing_hub_kernel_names_the_fetch_command(tmp_path):
    # HF_HUB_OFFLINE is read when huggingface_hub is imported: a fresh interpreter with an empty cache.
    code = ("from attnprof.variants import kernel_hub as k; "
            "print(k.load(k.parse_spec('kernels-community/flash-attn@1', trust_remote=True)).reason)")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path), "KERNELS_CACHE": str(tmp_path),
           "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    reason = done.stdout.strip()
    assert "offline" in reason and "fetch it with" in reason and "kernels.get_kernel('kernels-community/flash-attn'" in reason


def test_cpu_without_interpreter_is_rejected_with_the_reason(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    verdict = VARIANTS["kernel"].supports(Workload(dtype="fp16", device="cpu"))
    assert isinstance(verdict, Rejected) and "TRITON_INTERPRET=1" in verdict.reason


@pytest.mark.parametrize("change, words", [
    ({"head_dim": 100}, "head dim 100"),
    ({"dtype": "fp32"}, "fp16 or bf16"),
    ({"mask": "additive"}, "no additive mask"),  # padding masks go through flash_attn_varlen_func
])
def test_unsupported_workloads_are_rejected(monkeypatch, change, words):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    verdict = VARIANTS["kernel"].supports(Workload(dtype="fp16").replace(**change))
    assert isinstance(verdict, Rejected) and words in verdict.reason
