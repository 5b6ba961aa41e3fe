"""Issue 18, the status model: nothing broken passes as fine, and every command's exit code follows the statuses.

A user function whose output is NaN is `error` (exit 1), not `ok`; a padded mask compares the rows that see a key;
`verify`'s crash is `error`, never `rejected`; `compare` reports a change only beyond both runs' spread and says
when a run is too noisy to judge; `serve`'s answer comes from the numbers it prints.
"""

from __future__ import annotations

import json
import math

import pytest

from attnprof.cli import main

TINY = ["--batch", "1", "--heads", "2", "--seq", "16", "--head-dim", "8", "--reps", "20", "--steps", "1",
        "--device", "cpu"]


def _run(capsys, *argv) -> tuple[int, list[str], str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.err.strip().splitlines(), captured.out


def _last_json(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


def test_user_function_returning_nan_is_error_exit_1(tmp_path, capsys, monkeypatch):
    (tmp_path / "nan_attn.py").write_text(
        "import torch\n"
        "def attn(q, k, v, *, causal, scale):\n"
        "    return torch.full_like(q, float('nan'))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    code, err, out = _run(capsys, "stages", *TINY, "--variants", "nan_attn:attn,sdpa", "--out", str(tmp_path / "r"),
                          "--json")
    assert code == 1, err
    assert err[-1].startswith("attnprof: check failed:") and "nan_attn:attn" in err[-1] and "NaN" in err[-1]
    stages = {s["variant"]: s for s in _last_json(out)["stages"]}
    assert stages["nan_attn:attn"]["status"] == "error"
    assert stages["sdpa"]["status"] == "ok"
    saved = json.loads((tmp_path / "r" / "results.json").read_text())
    assert {s["variant"]: s["status"] for s in saved["stages"]}["nan_attn:attn"] == "error"


def test_naive_with_left_padding_is_compared_on_valid_rows_and_finite(tmp_path, capsys):
    code, err, out = _run(capsys, "stages", *TINY, "--variants", "naive,sdpa", "--mask", "pad-left",
                          "--out", str(tmp_path / "r"), "--json")
    assert code == 0, err
    for s in _last_json(out)["stages"]:
        assert s["status"] == "ok", s
        assert s["max_rel_err"] is not None and math.isfinite(s["max_rel_err"]) and s["max_rel_err"] < 1e-2, s


def test_verify_model_flex_that_fails_to_compile_is_error_not_rejected(tmp_path, capsys, monkeypatch):
    import torch._inductor.config as inductor_config

    with inductor_config.patch({"cpp.cxx": ("/nonexistent/attnprof-no-compiler",)}):  # a crash, everywhere
        code, err, out = _run(capsys, "verify", "--model", "tiny-llama", "--dtype", "fp32", "--impls",
                              "eager,flex_attention", "--model-batch", "2", "--model-seq", "8", "--decode-tokens",
                              "2", "--seed", "1", "--out", str(tmp_path / "v"), "--json")
    assert code == 1, err
    assert err[-1].startswith("attnprof: check failed:") and "flex_attention fp32 on tiny-llama" in err[-1]
    status = {m["impl"]: m["status"] for m in _last_json(out)["model"]}
    assert status == {"eager": "baseline", "flex_attention": "error"}
    saved = json.loads((tmp_path / "v" / "verify.json").read_text())
    row = next(r for r in saved["model"]["results"] if r["impl"] == "flex_attention")
    assert row["reason"].startswith("flex_attention: ") and saved["ok"] is False


def test_verify_labels_flex_past_the_recompile_limit_unfused(tmp_path, capsys, monkeypatch):
    """dynamo's recompile limit (here 1) makes later shapes run eagerly: those rows are `flex (unfused)`."""
    import torch
    from torch.nn.attention.flex_attention import flex_attention

    import attnprof.run
    import attnprof.variants.flex as flex

    monkeypatch.setattr(attnprof.run, "_PAST_LIMIT", {})
    compiled = torch.compile(flex_attention, backend="eager", dynamic=False)  # no C++ compiler needed
    monkeypatch.setattr(flex, "_compiled", lambda: compiled)
    try:
        with torch._dynamo.config.patch(recompile_limit=1):  # restored on exit (monkeypatch would delete it)
            code, err, out = _run(capsys, "verify", "--variants", "flex", "--dtype", "fp32", "--cases",
                                  "odd-full,gqa,decode", "--seed", "1", "--out", str(tmp_path / "v"), "--json")
    finally:
        torch._dynamo.reset()
    assert code == 0, err
    saved = json.loads((tmp_path / "v" / "verify.json").read_text())
    names = [r["variant"] for case in saved["kernel"]["cases"] for r in case["results"]]
    assert names[0] == "flex" and "flex (unfused)" in names, names
    unfused = next(r for case in saved["kernel"]["cases"] for r in case["results"] if r["variant"] == "flex (unfused)")
    assert "recompile limit" in unfused["reason"] and "flex_attention" in unfused["reason"]
    assert "flex (unfused)" in _last_json(out)["kernel"]


def _rows(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _with_latency(rows: list[dict], p20: float, p50: float, p80: float) -> list[dict]:
    return [{**r, "latency_ms": {**r["latency_ms"], "p20": p20, "p50": p50, "p80": p80}} for r in rows]


def _write(path, rows: list[dict]):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def bench_rows(tmp_path_factory) -> list[dict]:
    """Two real measured cells (the schema, keys and provenance a results file carries)."""
    from attnprof.bench.spec import Cell
    from attnprof.bench.sweep import run_sweep
    from attnprof.variants import VARIANTS
    from attnprof.workload import Workload

    path = tmp_path_factory.mktemp("status") / "results.jsonl"
    run_sweep([Cell(VARIANTS[v], Workload(batch=1, heads=2, seq=16, head_dim=8)) for v in ("naive", "sdpa")], path,
              reps=3, warmup=1)
    return _rows(path)


def _compare(capsys, tmp_path, a: list[dict], b: list[dict], *extra) -> tuple[int, list[str], dict]:
    pa, pb = _write(tmp_path / "a.jsonl", a), _write(tmp_path / "b.jsonl", b)
    code, err, out = _run(capsys, "compare", str(pa), str(pb), "--out", str(tmp_path / "o"), "--json",
                          "--fail-on-regression", *extra)
    saved = json.loads((tmp_path / "o" / "compare.json").read_text()) if code in (0, 1) else {}
    return code, err, saved


def test_compare_identical_rerun_is_never_a_regression(bench_rows, tmp_path, capsys):
    code, err, saved = _compare(capsys, tmp_path, bench_rows, [dict(r) for r in bench_rows])
    assert code == 0, err
    assert {c["verdict"] for c in saved["cells"]} <= {"same", "too-noisy"}


def test_compare_change_within_a_runs_own_spread_is_same(bench_rows, tmp_path, capsys):
    # bands do not overlap (1.12 > 1.10) and the median moved 15 % > --min-change, but B's own spread is 29 %
    a = _with_latency(bench_rows, 0.90, 1.00, 1.10)
    b = _with_latency(bench_rows, 1.12, 1.15, 1.45)
    code, err, saved = _compare(capsys, tmp_path, a, b)
    assert code == 0, err
    assert {c["verdict"] for c in saved["cells"]} == {"same"}
    code, err, saved = _compare(capsys, tmp_path, a, _with_latency(bench_rows, 1.95, 2.0, 2.05))  # beyond both
    assert code == 1 and "slower beyond the run-to-run spread" in err[-1], err
    assert {c["verdict"] for c in saved["cells"]} == {"regression"}


def test_compare_a_run_too_noisy_to_judge_is_said_and_never_a_regression(bench_rows, tmp_path, capsys):
    a = _with_latency(bench_rows, 0.95, 1.0, 1.05)
    noisy = _with_latency(bench_rows, 2.0, 60.0, 90.0)  # a loaded machine: the band is 147 % of the median
    code, err, saved = _compare(capsys, tmp_path, a, noisy)
    assert code == 0, err
    assert {c["verdict"] for c in saved["cells"]} == {"too-noisy"} and saved["max_spread"] == 0.5
    assert all("too noisy to judge" in c["why"] and "B 147%" in c["why"] for c in saved["cells"])
    code, err, saved = _compare(capsys, tmp_path, a, noisy, "--max-spread", "2")  # the user accepts that spread
    assert code == 1 and {c["verdict"] for c in saved["cells"]} == {"regression"}, err  # 60× is beyond 147 %


def _stream_row(impl: str, tok_s: float) -> dict:
    return {"impl": impl, "status": "ok", "completed": 4, "requests": 4, "failed": 0, "output_tokens_per_s": tok_s,
            "total_tokens_per_s": 2 * tok_s, "seconds": 10.0, "ttft_ms": {"p50": 50.0}, "itl_ms": {"p50": 5.0}}


def _static_row(impl: str, tok_s: float, mode: str) -> dict:
    return {"impl": impl, "status": "ok", "batch": 1, "context": 64, "tokens_per_s": tok_s, "attention_share": None,
            "share": None, "mode": mode}


def test_serve_never_says_yes_when_its_own_static_rows_show_the_impl_slower():
    from attnprof.serving.cost import annotate_static, annotate_stream, answer

    prefill = annotate_static([_static_row("eager", 1000, "prefill"), _static_row("sdpa", 160, "prefill")],
                              "prefill", 3.6)
    decode = annotate_static([_static_row("eager", 100, "decode"), _static_row("sdpa", 52, "decode")], "decode", 3.6)
    stream = annotate_stream([_stream_row("eager", 400), _stream_row("sdpa", 600)], 3.6)
    text = answer(prefill, decode, stream, 3.6)
    assert text.startswith("Inconclusive: sdpa runs at 1.50× eager"), text
    assert "0.16–0.52× eager in static prefill/decode" in text and "Yes" not in text
    # the static rows agree with the stream: the answer is the stream's
    fast = annotate_static([_static_row("eager", 1000, "prefill"), _static_row("sdpa", 1400, "prefill")], "prefill",
                           3.6)
    assert answer(fast, [], stream, 3.6).startswith("Yes: the attention gain survives")



def test_bench_a_nan_output_is_error_and_any_error_exits_1(tmp_path, capsys, monkeypatch):
    (tmp_path / "bad_attn.py").write_text(
        "import torch\n"
        "def nan(q, k, v, *, causal, scale):\n"
        "    return torch.full_like(q, float('nan'))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    code, err, out = _run(capsys, "bench", "--device", "cpu", "--variants", "bad_attn:nan,sdpa", "--batch", "1",
                          "--heads", "2", "--seq", "16", "--head-dim", "8", "--reps", "5", "--warmup", "1",
                          "--out", str(tmp_path / "b"), "--json")
    assert code == 1, err
    assert err[-1].startswith("attnprof: check failed: 1 cell(s) failed: bad_attn:nan") and "non-finite" in err[-1]
    status = {r["variant"]: r["status"] for r in _rows(tmp_path / "b" / "results.jsonl")}
    assert status == {"bad_attn:nan": "error", "sdpa": "ok"}


def test_serve_a_nan_attention_is_an_error_point_exit_1(tmp_path, capsys, monkeypatch):
    (tmp_path / "nan_serve.py").write_text(
        "import torch\n"
        "def attn(q, k, v, *, causal, scale):\n"
        "    return torch.full_like(q, float('nan'))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    code, err, out = _run(capsys, "serve", "--device", "cpu", "--model", "tiny-llama", "--mode", "prefill",
                          "--variants", "eager,nan_serve:attn", "--batch", "1", "--context", "16", "--reps", "2",
                          "--no-share", "--out", str(tmp_path / "s"), "--json")
    assert code == 1, err
    assert err[-1].startswith("attnprof: check failed: nan_serve:attn prefill") and "non-finite" in err[-1]
    status = {r["impl"]: r["status"] for r in _last_json(out)["prefill"]}
    assert status == {"eager": "ok", "nan_serve:attn": "error"}
