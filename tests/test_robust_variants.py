"""A user's attention function that misbehaves is that function's `error` row, in every command that runs variants.

`sys.exit(5)`, `None`, the wrong shape: each is an `error` row with its reason, like a function that raises, and the
run goes on (the other variants are measured, the report is written, exit 1). Ctrl-C inside the function still stops
the run (exit 130). `--variants ""` and `--impls ""` name nothing: one line, exit 2, never the defaults. All
in-process, tiny shapes: ~15 s in all on a 2-core CPU, most of it the one model-level verify.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from attnprof.cli import main
from attnprof.run import Status, run
from attnprof.variants import load_user_variant
from attnprof.workload import Workload

sys.path.insert(0, str(Path(__file__).resolve().parent))  # this file as `test_robust_variants:<function>`

ME = "test_robust_variants"
TINY = ["--device", "cpu", "--batch", "1", "--heads", "2", "--seq", "16", "--head-dim", "8", "--dtype", "fp32"]


def exits(q, k, v, *, causal, scale, attn_mask=None):
    sys.exit(5)


def returns_none(q, k, v, *, causal, scale, attn_mask=None):
    return None


def returns_short(q, k, v, *, causal, scale, attn_mask=None):
    return q[:, :, :1]


def interrupts(q, k, v, *, causal, scale, attn_mask=None):
    raise KeyboardInterrupt


# function → the words its error row must say
BAD = {"exits": "raised SystemExit(5)", "returns_none": "returned None, expected a tensor of shape [1, 2, 16, 8]",
       "returns_short": "returned a tensor of shape [1, 2, 1, 8], expected a tensor of shape [1, 2, 16, 8]"}


def _spec(*names: str) -> str:
    return ",".join(f"{ME}:{n}" for n in names)


def _run(capsys, *argv: str) -> tuple[int, list[str], str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.err.strip().splitlines(), captured.out


@pytest.mark.parametrize("name", list(BAD))
def test_run_makes_each_misbehaviour_an_error_row(name):
    w = Workload(batch=1, heads=2, seq=16, head_dim=8, dtype="fp32", device="cpu")
    got = run(load_user_variant(f"{ME}:{name}"), w, reps=2, warmup=1)
    assert got.status is Status.ERROR and BAD[name] in got.reason, got.reason


def test_ctrl_c_inside_a_user_function_still_stops_the_run(tmp_path, capsys):
    w = Workload(batch=1, heads=2, seq=16, head_dim=8, dtype="fp32", device="cpu")
    with pytest.raises(KeyboardInterrupt):
        run(load_user_variant(f"{ME}:interrupts"), w)
    code, err, _ = _run(capsys, "stages", *TINY, "--variants", f"sdpa,{ME}:interrupts", "--out", str(tmp_path / "r"))
    assert code == 130 and err[-1].startswith("attnprof: interrupted"), err


def test_stages_keeps_going_and_reports_every_bad_function(tmp_path, capsys):
    code, err, out = _run(capsys, "stages", *TINY, "--steps", "1", "--variants", "sdpa," + _spec(*BAD),
                          "--out", str(tmp_path / "r"), "--json")
    assert code == 1 and err[-1].startswith("attnprof: check failed:"), err
    rows = {s["variant"]: s for s in json.loads(out.strip().splitlines()[-1])["stages"]}
    assert rows["sdpa"]["status"] == "ok"
    for name, says in BAD.items():
        assert rows[f"{ME}:{name}"]["status"] == "error" and says in rows[f"{ME}:{name}"]["reason"]
    assert (tmp_path / "r" / "results.json").exists()  # the report is written: the run went on


def test_bench_records_each_bad_function_as_an_error_cell(tmp_path, capsys):
    code, err, _ = _run(capsys, "bench", *TINY, "--reps", "5", "--warmup", "1", "--variants", "sdpa," + _spec(*BAD),
                        "--out", str(tmp_path / "b"))
    assert code == 1 and err[-1].startswith("attnprof: check failed: 3 cell(s) failed"), err
    rows = [json.loads(line) for line in (tmp_path / "b" / "results.jsonl").read_text().splitlines()]
    status = {r["variant"]: (r["status"], r["reason"]) for r in rows}
    assert status["sdpa"][0] == "ok"
    for name, says in BAD.items():
        assert status[f"{ME}:{name}"][0] == "error" and says in status[f"{ME}:{name}"][1]


def test_verify_fails_each_bad_function_at_both_levels(tmp_path, capsys):
    code, err, _ = _run(capsys, "verify", "--device", "cpu", "--dtype", "fp32", "--cases", "gqa", "--seed", "1",
                        "--variants", "sdpa," + _spec(*BAD), "--model", "tiny-llama", "--impls",
                        "eager,sdpa," + _spec("exits", "returns_none"), "--model-batch", "2", "--model-seq", "8",
                        "--decode-tokens", "1", "--level", "both", "--out", str(tmp_path / "v"))
    assert code == 1 and err[-1].startswith("attnprof: check failed:"), err
    data = json.loads((tmp_path / "v" / "verify.json").read_text())
    kernel = {r["variant"]: r for r in data["kernel"]["cases"][0]["results"]}
    assert kernel["sdpa"]["status"] == "pass"
    for name in BAD:
        assert kernel[f"{ME}:{name}"]["status"] == "error", kernel[f"{ME}:{name}"]
    model = {r["impl"]: r for r in data["model"]["results"]}
    assert model["sdpa"]["status"] == "pass"
    assert model[f"{ME}:exits"]["status"] == "error" and "raised SystemExit(5)" in model[f"{ME}:exits"]["reason"]
    assert model[f"{ME}:returns_none"]["status"] == "error" and "returned None" in model[f"{ME}:returns_none"]["reason"]


@pytest.mark.parametrize("argv, flag", [
    (["stages", *TINY, "--variants", ""], "--variants"),
    (["stages", *TINY, "--variants", " , "], "--variants"),
    (["bench", *TINY, "--variants", ""], "--variants"),
    (["variants", "--device", "cpu", "--variants", ""], "--variants"),
    (["audit", "--device", "cpu", "--model", "tiny-llama", "--measure", "--variants", ""], "--variants"),
    (["verify", "--device", "cpu", "--variants", ""], "--variants"),
    (["verify", "--device", "cpu", "--model", "tiny-llama", "--impls", ""], "--impls"),
    (["serve", "--device", "cpu", "--model", "tiny-llama", "--impls", ""], "--impls"),
])
def test_an_empty_list_is_one_line_and_exit_2(tmp_path, capsys, argv, flag):
    code, err, _ = _run(capsys, *argv, *([] if argv[0] == "variants" else ["--out", str(tmp_path / "o")]))
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith(f"attnprof: error: {flag} ") and "names nothing" in err[0]
    assert not (tmp_path / "o").exists()

