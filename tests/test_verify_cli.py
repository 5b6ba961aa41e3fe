"""`attnprof verify` end to end on the CPU: reports, exit codes, bad input, and the model-level gate."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `tests.broken` as module:function specs

from attnprof.cli import main  # noqa: E402
from attnprof.errors import UsageError  # noqa: E402
from attnprof.models.attention import resolve_impls  # noqa: E402
from attnprof.workload import Workload  # noqa: E402


def _verify(tmp_path, *extra) -> tuple[int, dict | None]:
    rc = main(["verify", "--device", "cpu", "--out", str(tmp_path), "--seed", "3", *extra])
    path = tmp_path / "verify.json"
    return rc, (json.loads(path.read_text()) if path.exists() else None)


def test_kernel_level_passes_correct_backends_and_writes_the_report(tmp_path, capsys):
    rc, data = _verify(tmp_path, "--cases", "odd-causal,pad-left", "--dtype", "fp32,bf16",
                       "--variants", "sdpa,sdpa-efficient,tests.broken:correct", "--json")
    assert rc == 0
    assert data["schema"] == "attnprof.verify/1" and data["ok"] is True
    assert data["provenance"]["seed"] == 3 and data["seed"] == 3
    summary = data["kernel"]["summary"]
    assert summary["sdpa"]["status"] == "pass" and summary["tests.broken:correct"]["status"] == "pass"
    assert summary["sdpa-efficient"]["status"] == "rejected"
    assert "no CPU kernel" in summary["sdpa-efficient"]["rejections"][0]["reason"]
    md = (tmp_path / "verify.md").read_text()
    assert "# attnprof verify: PASS" in md and "sdpa-efficient" in md and "Rejected" in md
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert last["ok"] is True and last["kernel"]["sdpa"] == "pass"


def test_broken_variant_exits_1_after_writing_the_reason(tmp_path, capsys):
    rc, data = _verify(tmp_path, "--cases", "gqa", "--dtype", "bf16", "--variants", "sdpa,tests.broken:gqa_tiled")
    assert rc == 1
    assert data["ok"] is False
    fail = data["kernel"]["summary"]["tests.broken:gqa_tiled"]["failures"][0]
    assert "GQA heads mapped wrongly" in fail["hint"]
    assert "max abs error" in fail["reason"]
    assert "gqa_tiled" in capsys.readouterr().err


def test_the_baseline_is_not_verified_against_itself(tmp_path):
    rc, data = _verify(tmp_path, "--cases", "gqa", "--dtype", "fp32", "--variants", "naive,sdpa,inplace")
    assert rc == 0 and data["kernel"]["variants"] == ["sdpa"]
    assert set(data["kernel"]["not_verified"]) == {"naive", "inplace"}


def test_given_workload_replaces_the_default_cases(tmp_path):
    rc, data = _verify(tmp_path, "--seq", "33", "--kv-seq", "70", "--heads", "4", "--kv-heads", "2",
                       "--head-dim", "24", "--batch", "1", "--dtype", "fp32", "--variants", "sdpa-math")
    assert rc == 0
    (case,) = data["kernel"]["cases"]
    assert case["name"] == "given" and case["workload"]["kv_seq"] == 70 and case["workload"]["kv_heads"] == 2


@pytest.mark.parametrize("args, words", [
    (["--variants", "tests.broken:wrong_signature"], "must accept"),
    (["--variants", "no_such_module_xyz:fn"], "cannot import"),
    (["--model", "no-such-preset"], "unknown model preset"),
    (["--dtype", "fp7"], "unknown dtype"),
    (["--device", "cuda:7"], "cuda"),
    (["--cases", "nope"], "unknown case"),
    (["--model", "tiny-llama", "--impls", "eager,warp-speed"], "unknown attention implementation"),
    (["--variants", "naive,inplace"], "the gate's own baseline"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, args, words):
    rc, data = _verify(tmp_path, "--dtype", "fp32", *args)  # a later --dtype wins
    assert rc == 2
    assert data is None  # nothing half-written
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("attnprof: error:") and words in err[-1]
    assert "Traceback" not in "\n".join(err)


def test_model_level_fails_a_broken_user_function_and_passes_sdpa(tmp_path):
    rc, data = _verify(tmp_path, "--model", "tiny-llama", "--dtype", "fp32", "--impls",
                       "eager,sdpa,sdpa-efficient,tests.broken:gqa_tiled", "--decode-tokens", "4")
    assert rc == 1
    by = {(r["impl"], r["dtype"]): r for r in data["model"]["results"]}
    assert by[("eager", "fp32")]["status"] == "baseline"
    assert by[("sdpa", "fp32")]["status"] == "pass"
    assert by[("sdpa", "fp32")]["agreement"]["prefix_min"] == 4
    assert by[("sdpa-efficient", "fp32")]["status"] == "rejected"
    broken = by[("tests.broken:gqa_tiled", "fp32")]
    assert broken["status"] == "fail" and "top-1 agreement" in broken["reason"]


def test_model_level_passes_correct_backends_in_bf16_and_catches_nan_padding(tmp_path):
    rc, data = _verify(tmp_path, "--model", "tiny-qwen", "--dtype", "bf16", "--impls",
                       "sdpa,sdpa-math,tests.broken:correct,tests.broken:padded_rows_nan", "--decode-tokens", "3")
    assert rc == 1
    status = {r["impl"]: r["status"] for r in data["model"]["results"]}
    assert status == {"eager": "baseline", "sdpa": "pass", "sdpa-math": "pass", "tests.broken:correct": "pass",
                      "tests.broken:padded_rows_nan": "fail"}
    nan_row = next(r for r in data["model"]["results"] if r["impl"] == "tests.broken:padded_rows_nan")
    assert "NaN" in nan_row["reason"]


def test_attention_map_names_and_refusals():
    impls = {i.name: i for i in resolve_impls("eager,sdpa,sdpa-cudnn,flex,kernel,tests.broken:correct", "cpu")}
    assert impls["eager"].attn_implementation == "eager" and impls["flex_attention"].attn_implementation == "flex_attention"
    assert impls["sdpa-cudnn"].rejected and "cudnn" in impls["sdpa-cudnn"].rejected
    assert impls["kernel"].rejected or impls["kernel"].attn_implementation
    from transformers import AttentionInterface

    assert impls["tests.broken:correct"].attn_implementation in AttentionInterface._global_mapping
    with pytest.raises(UsageError, match="flash-attn-4"):  # the message names the third-party kernels too
        resolve_impls("sdpa,bogus", "cpu")


def test_a_third_party_kernel_is_a_model_implementation_refused_with_its_own_reason(tmp_path, capsys):
    """FlashAttention-4 (and every third-party kernel by name) at the model level: on this CPU a `rejected` row with
    the variant's reason and the pip command, the other implementations verified as usual, exit 0."""
    w = Workload(batch=1, heads=4, seq=32, head_dim=64, dtype="bf16", causal=True, device="cpu")
    fa4 = next(i for i in resolve_impls("eager,flash-attn-4", "cpu", workload=w) if i.name == "flash-attn-4")
    assert fa4.rejected and "CUDA" in fa4.rejected and "pip install flash-attn-4" in fa4.rejected
    code = main(["verify", "--model", "tiny-llama", "--impls", "eager,sdpa,flash-attn-4", "--device", "cpu",
                 "--dtype", "bf16", "--out", str(tmp_path / "v")])
    assert code == 0
    rows = {(r["impl"], r["dtype"]): r
            for r in json.loads((tmp_path / "v" / "verify.json").read_text())["model"]["results"]}
    assert rows[("flash-attn-4", "bf16")]["status"] == "rejected" and rows[("sdpa", "bf16")]["status"] == "pass"


def test_kernel_flag_is_honoured_not_ignored(tmp_path, capsys):
    """--kernel must reach the kernel variant: a repo that does not exist is a usage error, not the default."""
    from attnprof.cli import main

    assert main(["verify", "--device", "cpu", "--variants", "kernel", "--kernel", str(tmp_path / "nope"),
                 "--out", str(tmp_path / "r")]) == 2
    assert "neither an existing kernel repo" in capsys.readouterr().err


# inductor's own words (torch 2.13, CPU, flex attention inside generate), cut to the lines that matter
_INDUCTOR_OUTPUT = """In file included from /tmp/torchinductor_root/pi/cpicxm.h:1:
/tmp/torchinductor_root/kz/ckzyvh.main.cpp: In function 'void kernel(const float*, float*)':
/tmp/torchinductor_root/kz/ckzyvh.main.cpp:1088:45: error: 'cur_kvSplitSize0' was not declared in this scope; \
did you mean 'cur_kvSplitSize'?
/tmp/torchinductor_root/kz/ckzyvh.main.cpp:1096:72: error: expected primary-expression before ',' token
"""


def fails_to_compile(q, k, v, *, causal, scale, attn_mask=None):
    """An implementation whose compile fails as inductor's does (`--impls tests.test_verify_cli:fails_to_compile`)."""
    from torch._inductor.exc import CppCompileError

    raise CppCompileError(["g++", "ckzyvh.main.cpp", "-O3"], _INDUCTOR_OUTPUT)


def test_a_compile_failure_names_the_compilers_first_error_and_torch(tmp_path):
    import torch

    rc, data = _verify(tmp_path, "--model", "tiny-llama", "--dtype", "fp32", "--decode-tokens", "2", "--impls",
                       "eager,sdpa,tests.test_verify_cli:fails_to_compile")
    assert rc == 1
    row = next(r for r in data["model"]["results"] if r["impl"] == "tests.test_verify_cli:fails_to_compile")
    assert row["status"] == "error"  # the head is the user-variant wrapper's (a GQA call); the cause follows it
    assert "'cur_kvSplitSize0' was not declared in this scope" in row["reason"]
    assert f"torch {torch.__version__}" in row["reason"] and "expected primary-expression" not in row["reason"]
    assert data["model"]["left_out"] == []  # named implementations are never left out


def test_the_cpu_defaults_leave_out_only_what_this_torch_cannot_run(tmp_path, capsys):
    from attnprof.numerics.cannot_run import left_out, torch_minor

    names = ["eager", "sdpa", "flex_attention"]
    kept, dropped = left_out(names, "cpu", "2.13.0+cpu")
    assert kept == ["eager", "sdpa"] and dropped[0][0] == "flex_attention"
    assert "torch 2.13.0+cpu" in dropped[0][1] and "cur_kvSplitSize0" in dropped[0][1]
    assert left_out(names, "cuda:0", "2.13.0") == (names, []) and left_out(names, "cpu", "2.12.1") == (names, [])
    rc, data = _verify(tmp_path, "--model", "tiny-llama", "--dtype", "fp32", "--decode-tokens", "2")
    assert rc == 0 and data["ok"]
    ran = {r["impl"] for r in data["model"]["results"]}
    err = " ".join(capsys.readouterr().err.split())
    if torch_minor() == "2.13":
        assert "flex_attention" not in ran and data["model"]["left_out"][0]["impl"] == "flex_attention"
        assert "flex_attention left out of the cpu defaults: torch 2.13" in err and "--impls" in err
        assert "Left out of the defaults: `flex_attention`" in (tmp_path / "verify.md").read_text()
    else:
        assert "flex_attention" in ran and data["model"]["left_out"] == []
