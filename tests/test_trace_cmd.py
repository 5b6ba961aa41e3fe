"""`attnprof trace`: traces the tests record themselves with torch.profiler, the committed H200 traces, bad input."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile, record_function, schedule

from attnprof.cli import main

DATA = Path(__file__).parent / "data"


def _qkv():
    g = torch.Generator().manual_seed(0)
    return [torch.randn(1, 4, 32, 16, generator=g) for _ in range(3)]


def naive_step(q, k, v):
    scores = q @ k.transpose(-1, -2) * 16 ** -0.5
    mask = torch.ones(32, 32, dtype=torch.bool).triu(1)  # rebuilt every step, as the tutorial's naive code does
    return scores.masked_fill(mask, float("-inf")).softmax(-1) @ v  # out of place: a copy of the scores


def record(path: Path, step, *, steps: int = 3, use_schedule: bool = False, ranges: bool = True) -> Path:
    q, k, v = _qkv()
    if use_schedule:
        with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=steps)) as prof:
            for _ in range(steps + 2):
                step(q, k, v)
                prof.step()
    else:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for i in range(steps):
                if ranges:
                    with record_function(f"attnprof.step.{i}"):
                        step(q, k, v)
                else:
                    step(q, k, v)
    prof.export_chrome_trace(str(path))
    return path


def run_json(capsys, *args) -> dict:
    assert main(["trace", *map(str, args), "--json"]) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_naive_trace_shows_math_copies_and_masks(tmp_path, capsys):
    out = run_json(capsys, record(tmp_path / "naive.json", naive_step), "--out", tmp_path / "rep")
    assert out["steps"] == 3 and out["math_fallback_steps"] == 3 and out["mask_rebuilt_every_step"]
    assert out["copies_per_step"] == [1, 1, 1] and out["backends"] == [] and not out["on_gpu"]
    assert any("no GPU events" in n for n in out["notes"])
    data = json.loads((tmp_path / "rep" / "trace.json").read_text())
    assert data["schema"] == "attnprof.trace/1" and data["provenance"]["torch"]
    step = data["steps"][0]
    assert step["out_of_place_ops"].get("masked_fill") == 1 and step["roles"]["gemm"] == 2
    assert (tmp_path / "rep" / "trace.md").exists()


def test_fused_sdpa_trace_with_profiler_schedule_gz(tmp_path, capsys):
    path = record(tmp_path / "sdpa.json", lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                  use_schedule=True)
    gz = tmp_path / "sdpa.json.gz"
    gz.write_bytes(gzip.compress(path.read_bytes()))
    out = run_json(capsys, gz)
    assert out["steps"] == 3 and out["backends"] == ["cpu_flash"] and out["math_fallback_steps"] == 0
    assert not out["mask_rebuilt_every_step"] and out["copies_per_step"] == [0, 0, 0]


def test_sdpa_math_path_is_named(tmp_path, capsys):
    def forced(q, k, v):
        with sdpa_kernel([SDPBackend.MATH]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    out = run_json(capsys, record(tmp_path / "m.json", forced), "--out", tmp_path / "rep")
    assert out["math_fallback_steps"] == 3 and out["backends"] == []
    step = json.loads((tmp_path / "rep" / "trace.json").read_text())["steps"][0]
    assert step["sdpa_calls"] == {"math": 1} and "math path" in step["math_fallback"]


def test_trace_without_steps_is_one_step(tmp_path, capsys):
    out = run_json(capsys, record(tmp_path / "n.json", naive_step, steps=2, ranges=False))
    assert out["steps"] == 1 and any("whole trace" in n for n in out["notes"])


H200 = sorted(DATA.glob("h200-*.trace.json.gz"))


@pytest.mark.skipif(not H200, reason="no H200 traces under tests/data yet (scripts/gpu/traces.sh records them)")
@pytest.mark.parametrize("path", H200, ids=lambda p: p.name)
def test_real_h200_traces(path, capsys):
    out = run_json(capsys, path)
    assert out["on_gpu"] and out["steps"] >= 1
    if "naive" in path.name or "math" in path.name:  # both compute attention unfused: GEMM + softmax
        assert out["math_fallback_steps"] == out["steps"] and out["backends"] == []
    if "naive" in path.name:
        assert all(c >= 1 for c in out["copies_per_step"]) and out["mask_rebuilt_every_step"]


def _bad_files(tmp: Path) -> dict[str, tuple[Path, str]]:
    good = json.dumps({"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 1, "dur": 2}]})
    files = {
        "empty": (b"", "empty file"),
        "truncated": (good[: len(good) // 2].encode(), "not valid JSON"),
        "corrupt-gz": (gzip.compress(good.encode())[:-12], "corrupt or truncated gzip"),
        "foreign": (json.dumps({"name": "not a trace", "values": [1, 2]}).encode(), "not a Chrome/Kineto trace"),
        "other-tool": (json.dumps({"traceEvents": [{"ph": "X", "cat": "gc", "name": "GC", "ts": 1}]}).encode(),
                       "not one from torch.profiler"),
        "binary": (bytes(range(256)) * 4, "not"),
        "too-big": (good.encode(), "limit"),
    }
    out = {}
    for name, (raw, says) in files.items():
        p = tmp / (name + (".json.gz" if name == "corrupt-gz" else ".json"))
        p.write_bytes(raw)
        out[name] = (p, says)
    return out


@pytest.mark.parametrize("name", ["empty", "truncated", "corrupt-gz", "foreign", "other-tool", "binary", "too-big",
                                  "missing", "folder"])
def test_bad_input_is_one_line_exit_2(tmp_path, capsys, name):
    files = _bad_files(tmp_path)
    extra: list[str] = []
    if name == "missing":
        path, says = tmp_path / "nope.json", "no such trace file"
    elif name == "folder":
        path, says = tmp_path, "folder"
    else:
        path, says = files[name]
        if name == "too-big":
            extra = ["--max-bytes", "10"]
    assert main(["trace", str(path), *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("attnprof: error:") and says in err[0]


def test_bad_max_bytes_is_exit_2(tmp_path, capsys):
    path = record(tmp_path / "t.json", naive_step, steps=1)
    assert main(["trace", str(path), "--max-bytes", "lots"]) == 2
    assert "--max-bytes" in capsys.readouterr().err


def test_gpu_work_is_attributed_to_named_ranges_by_launch_time_on_a_real_h200_trace():
    from attnprof.profiling.classify import classify_gpu
    from attnprof.profiling.trace import gpu_work_in_ranges, load_trace

    path = Path(__file__).parent / "data" / "h200-naive.trace.json.gz"
    if not path.exists():
        pytest.skip("no H200 trace under tests/data")
    trace = load_trace(path)
    (work,) = gpu_work_in_ranges(trace, "ProfilerStep#3")
    roles = sorted(classify_gpu(k.name).role for k in work)
    # the tutorial's naive step on the H200: 2 GEMMs, scale, mask built twice, the copy, masked_fill, softmax, memset
    assert roles == sorted(["gemm", "gemm", "scale", "mask_build", "mask_build", "copy", "mask_apply", "softmax",
                            "memset"])
