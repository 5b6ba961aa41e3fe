"""`attnprof serve` end to end on the CPU (tiny preset, every mode), its cost arithmetic, and its bad input."""

from __future__ import annotations

import json

import pytest

from attnprof.cli import main
from attnprof.serving.cost import (
    annotate_static,
    annotate_stream,
    answer,
    cost_block,
    gpu_hours_per_billion,
    usd_per_million,
)

TINY = ["serve", "--device", "cpu", "--model", "tiny-llama", "--json"]


def _run(capsys, tmp_path, *extra):
    code = main(TINY + ["--out", str(tmp_path)] + list(extra))
    captured = capsys.readouterr()
    last = json.loads(captured.out.strip().splitlines()[-1])
    data = json.loads((tmp_path / "serve.json").read_text())
    return code, last, data


def test_prefill_mode(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_CUDNN_SDPA_AVOID_RECOMPILE", "1")  # a knob that changes SDPA: must be on record
    monkeypatch.setenv("ATTNPROF_UNRELATED_KNOB", "x")
    code, last, data = _run(capsys, tmp_path, "--mode", "prefill", "--batch", "1,2", "--context", "24", "--reps", "2")
    assert code == 0 and last["schema"] == data["schema"] == "attnprof.serve/1"
    assert data["provenance"]["device_kind"] == "cpu" and data["provenance"]["seed"] == 0
    assert data["provenance"]["env"].get("TORCH_CUDNN_SDPA_AVOID_RECOMPILE") == "1"
    assert "ATTNPROF_UNRELATED_KNOB" not in data["provenance"]["env"]
    assert "`TORCH_CUDNN_SDPA_AVOID_RECOMPILE=1`" in (tmp_path / "serve.md").read_text()
    rows = data["prefill"]
    assert [(r["impl"], r["batch"]) for r in rows] == [("eager", 1), ("eager", 2), ("sdpa", 1), ("sdpa", 2)]
    assert [r["tokens"] for r in rows] == [24, 48, 24, 48]
    assert all(r["cost"]["usd_per_m_input"] > 0 for r in rows)
    assert [r["gain_over_eager"] for r in rows[:2]] == [1.0, 1.0]
    assert rows[2]["amdahl_predicted"] is not None and rows[0]["amdahl_predicted"] is None
    md = (tmp_path / "serve.md").read_text()
    assert "Does the attention gain survive a real serving loop" in md and data["answer"] in md
    assert (tmp_path / "serve-throughput.png").read_bytes()[:4] == b"\x89PNG"


def test_decode_mode_counts_generated_tokens(capsys, tmp_path):
    code, last, data = _run(capsys, tmp_path, "--mode", "decode", "--decode-batch", "2", "--decode-context", "10",
                            "--new-tokens", "4", "--impls", "sdpa", "--no-share")
    assert code == 0
    (row,) = data["decode"]
    assert row["impl"] == "sdpa" and row["tokens"] == 2 * 3 and row["new_tokens"] == 4
    assert row["share"] is None and row["cost"]["usd_per_m_output"] > 0
    assert row["itl_repeat_ms"]["p50"] > 0 and row["cold_share"] is None  # timed twice; --no-share: no profiles
    assert "| ITL p50 / p99 ms, first pass | ITL p50 / p99 ms, repeat pass |" in (tmp_path / "serve.md").read_text()


def test_decode_mode_takes_several_contexts_in_one_run(capsys, tmp_path):
    """`--decode-context 8,12` with `--decode-batch 1,2`: every (batch, context) cell per implementation, each gain
    against eager's row of the same cell, and the answer names the cell its sentences are about."""
    code, last, data = _run(capsys, tmp_path, "--mode", "decode", "--decode-batch", "1,2", "--decode-context", "8,12",
                            "--new-tokens", "3", "--impls", "eager,sdpa", "--no-share", "--loop", "as-shipped")
    assert code == 0
    rows = data["decode"]
    assert [(r["impl"], r["batch"], r["context"]) for r in rows] == [
        (i, b, c) for i in ("eager", "sdpa") for c in (8, 12) for b in (1, 2)]
    eager = {(r["batch"], r["context"]): r["tokens_per_s"] for r in rows if r["impl"] == "eager"}
    for r in rows[4:]:
        assert r["gain_over_eager"] == pytest.approx(r["tokens_per_s"] / eager[(r["batch"], r["context"])])
    assert "in decode at batch 2, context 12 " in data["answer"]  # the largest cell: one $ per implementation
    assert data["answer"].count("(sdpa) per 1M output tokens") == 1
    assert "decode batch 1 context 8: sdpa" in data["answer"] and "decode batch 2 context 12: sdpa" in data["answer"]


def test_cells_run_one_at_a_time_for_every_implementation(capsys, tmp_path, monkeypatch):
    """A grid is measured cell by cell, each cell for every implementation in turn, so a run stopped part-way leaves
    whole comparisons in its partial file; the report still lists each implementation's rows together."""
    from attnprof.serving import session

    seen = []
    real = session._static_point

    def spy(model, impl, mode, batch, context, *rest, **kw):
        seen.append((impl.name, batch))
        return real(model, impl, mode, batch, context, *rest, **kw)

    monkeypatch.setattr(session, "_static_point", spy)
    code, _, data = _run(capsys, tmp_path, "--mode", "decode", "--decode-batch", "1,2", "--decode-context", "8",
                         "--new-tokens", "3", "--impls", "eager,sdpa", "--no-share", "--loop", "as-shipped")
    assert code == 0
    assert seen == [("eager", 1), ("sdpa", 1), ("eager", 2), ("sdpa", 2)]
    assert [(r["impl"], r["batch"]) for r in data["decode"]] == [("eager", 1), ("eager", 2), ("sdpa", 1), ("sdpa", 2)]


def test_a_grid_cell_past_the_memory_is_a_row_not_a_refusal(capsys, tmp_path):
    """`--decode-batch 1,1000000000`: the cell that fits is measured; the one that cannot fit is an `oom` row that
    says it was not run and what it needs (the run is refused only when even the smallest cell cannot fit)."""
    code, last, data = _run(capsys, tmp_path, "--mode", "decode", "--decode-batch", "1,1000000000",
                            "--decode-context", "8", "--new-tokens", "3", "--impls", "sdpa", "--no-share",
                            "--loop", "as-shipped")
    assert code == 0
    small, huge = data["decode"]
    assert small["status"] == "ok" and small["tokens_per_s"] > 0
    assert huge["status"] == "oom" and huge["reason"].startswith("not run: decode on 1000000000x11 tokens")
    assert "GiB, the device (cpu) has" in huge["reason"]


def test_continuous_mode_from_a_request_file(capsys, tmp_path):
    f = tmp_path / "reqs.jsonl"
    f.write_text("\n".join(json.dumps({"prompt_tokens": p, "output_tokens": o}) for p, o in [(9, 3), (14, 2)]))
    code, last, data = _run(capsys, tmp_path, "--mode", "continuous", "--request-file", str(f), "--rate", "50",
                            "--variants", "eager,sdpa")
    assert code == 0
    results = data["continuous"]["results"]
    assert [r["impl"] for r in results] == ["eager", "sdpa"]
    for r in results:
        assert r["completed"] == 2 and r["failed"] == 0
        assert r["input_tokens"] == 9 + 14 and r["output_tokens"] == 3 + 2
        assert r["cost"]["usd_per_m_output"] > 0
    assert data["continuous"]["stream"]["source"] == str(f)
    assert (tmp_path / "serve-latency.png").exists()
    assert last["continuous"][1]["gain_over_eager"] == pytest.approx(results[1]["gain_over_eager"])


@pytest.mark.parametrize("extra, message", [
    (["--model", "llama-70b"], "unknown model preset 'llama-70b'"),
    (["--mode", "prefill", "--context", "2048"], "--context 2048 is longer than tiny-llama allows"),
    (["--mode", "decode", "--decode-context", "1020", "--new-tokens", "8"], "max_position_embeddings 1024"),
    (["--mode", "continuous", "--rate", "0"], "--rate must be a positive"),
    (["--mode", "continuous", "--rate", "inf"], "--rate must be a positive"),
    (["--mode", "continuous", "--max-prompt", "0"], "--max-prompt must be a whole number >= 1, got 0"),
    (["--mode", "continuous", "--output-sigma", "-1"], "--output-sigma must be a number >= 0"),
    (["--gpu-hour-price", "-2"], "--gpu-hour-price must be a positive"),
    (["--mode", "prefill,serve"], "--mode 'prefill,serve'"),
    (["--impls", "eager,warp"], "unknown attention implementation 'warp'"),
    (["--context", "0"], "--context needs numbers >= 1"),
    (["--mode", "decode", "--new-tokens", "1"], "--new-tokens must be >= 2"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, tmp_path, extra, message):
    code = main(["serve", "--device", "cpu", "--out", str(tmp_path / "o")] + extra)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and message in err[0], err
    assert not (tmp_path / "o" / "serve.json").exists()


def test_bad_request_line_names_the_line(capsys, tmp_path):
    f = tmp_path / "reqs.jsonl"
    f.write_text('{"prompt_tokens": 9, "output_tokens": 3}\n{"prompt_tokens": "nine", "output_tokens": 3}\n')
    code = main(["serve", "--device", "cpu", "--mode", "continuous", "--request-file", str(f), "--out",
                 str(tmp_path / "o")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and f"{f}:2: prompt_tokens must be a positive integer" in err[0]


def test_cost_arithmetic():
    # 1000 tokens/s for an hour is 3.6M tokens; at $3.60/h that is $1 per 1M
    assert usd_per_million(1000.0, 3.6) == pytest.approx(1.0)
    assert gpu_hours_per_billion(1e9 / 3600) == pytest.approx(1.0)
    assert usd_per_million(0.0, 3.6) is None
    c = cost_block("continuous", 3.6, output_tokens_per_s=500.0, total_tokens_per_s=2000.0)
    assert c["usd_per_m_output"] == pytest.approx(2.0) and c["usd_per_m_total"] == pytest.approx(0.5)


def _static(impl, tps, share, attn_ms, step_ms=10.0, host_ms=None):
    return {"impl": impl, "batch": 1, "context": 1024, "status": "ok", "tokens_per_s": tps, "step_ms": step_ms,
            "attention_share": share, "share": {"attention_ms": attn_ms, "attention_host_ms": host_ms,
                                                "basis": "gpu-kernels"}}


def _stream(impl, tps, completed=8, failures=(), seconds=10.0, itl=5.0):
    return {"impl": impl, "status": "ok", "requests": 8, "completed": completed, "failures": list(failures),
            "failed": len(failures), "output_tokens_per_s": tps, "total_tokens_per_s": 4 * tps, "seconds": seconds,
            "ttft_ms": {"p50": 50.0, "p99": 90.0}, "itl_ms": {"p50": itl, "p99": 2 * itl}}


def test_gains_amdahl_and_the_answer_come_from_the_numbers():
    rows = annotate_static([_static("eager", 1000, 0.6, 6.0), _static("sdpa", 2000, 0.2, 1.0)], "prefill", 3.6)
    assert rows[1]["gain_over_eager"] == pytest.approx(2.0)
    assert rows[1]["amdahl_predicted"] == pytest.approx(1 / (1 - 0.6 * (1 - 1 / 6)))
    stream = annotate_stream([_stream("eager", 400), _stream("sdpa", 600)], 3.6)
    text = answer(rows, [], stream, 3.6, span_s=2.0)
    assert text.startswith("Yes: the attention gain survives") and "1.50×" in text and "2.00×" in text
    assert "$2.5 (eager), $1.67 (sdpa) per 1M output tokens" in text
    # a light stream: both finish right after the arrivals, so the latency decides
    light = annotate_stream([_stream("eager", 400, seconds=2.1, itl=5.0), _stream("sdpa", 401, seconds=2.1,
                                                                                   itl=5.0)], 3.6)
    assert answer([], [], light, 3.6, span_s=2.0).startswith("Mostly not") and "inter-token latency" in \
        answer([], [], light, 3.6, span_s=2.0)
    dead = annotate_stream([_stream("eager", 0, completed=0, failures=[{"request": 0, "error": "CUDA out of memory"}]),
                            _stream("sdpa", 600)], 3.6)
    assert answer([], [], dead, 3.6).startswith("Eager could not serve the stream at all (CUDA out of memory)")


def test_the_answer_says_where_a_slower_implementation_loses_its_time():
    def row(impl, tps, step, attn, host, busy):
        r = _static(impl, tps, 0.01, attn, step_ms=step, host_ms=host)
        r["share"]["busy_ms"] = busy
        r["share"]["step_wall_ms"] = step + 1.0  # the profiled step, profiler overhead included
        return r

    # the H200's decode pattern: sdpa's attention is cheaper on GPU and host alike, yet the step is 4x longer
    rows = annotate_static([row("eager", 66, 15.0, 0.53, 5.9, 2.4), row("sdpa", 17, 59.7, 0.10, 1.75, 1.95),
                            row("slow-host", 30, 33.0, 0.2, 25.0, 2.2), row("slow-gpu", 30, 33.0, 0.2, 3.0, 20.0),
                            row("close", 64, 15.5, 0.2, 3.0, 2.0)], "decode", 3.5)
    text = answer([], rows, [], 3.5)
    assert ("sdpa loses 44.7 ms per step to eager (its profiled steps took 60.7 ms, eager's 16); neither its GPU work (1.95 ms busy per step, eager 2.4) nor the "
            "host time inside its attention calls (1.75 ms, eager 5.9) explains it") in text
    assert "slow-host loses 18 ms per step to eager (its profiled steps took 34 ms, eager's 16); its attention calls take 25 ms of host time" in text
    assert "slow-gpu loses 18 ms per step to eager (its profiled steps took 34 ms, eager's 16); the GPU is busy 20 ms per step against eager's 2.4." in text
    assert "close loses" not in text  # 0.5 ms of 15: within the noise the sentence ignores

    from attnprof.report.serve_report import _static_rows

    assert _static_rows(rows, "prefill")[1][6] == "0.1 / 1.75"  # the table's "attention ms/step (GPU / host)"


def test_a_kernel_that_cannot_run_here_is_a_row_with_its_reason(capsys, tmp_path):
    code, last, data = _run(capsys, tmp_path, "--mode", "prefill", "--context", "16", "--impls", "eager,kernel",
                            "--reps", "1", "--no-share")
    assert code == 0
    kernel = [r for r in data["prefill"] if r["impl"] == "kernel"]
    assert len(kernel) == 1 and kernel[0]["status"] == "rejected" and "fp32" in kernel[0]["reason"]
    assert "Not run: kernel:" in (tmp_path / "serve.md").read_text()
