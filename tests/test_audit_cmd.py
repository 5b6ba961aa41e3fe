"""`attnprof audit`: grid and --model, --require as a check (exit 1), bad input as one line (exit 2)."""

from __future__ import annotations

import json

import pytest

from attnprof.cli import main
from attnprof.files import read_json

GRID = ["audit", "--device", "cpu", "--head-dims", "64,59", "--dtypes", "fp32", "--batch", "1", "--heads", "2",
        "--seq", "8"]


def last_json(capsys) -> dict:
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_grid_writes_json_and_markdown_with_math_highlighted(tmp_path, capsys):
    assert main([*GRID, "--out", str(tmp_path), "--json", "--crosscheck", "1"]) == 0
    line = last_json(capsys)
    assert line["schema"] == "attnprof.audit/1" and line["preferred"] == "cpu_flash" and line["math"] == 2
    data = read_json(tmp_path / "audit.json", "attnprof.audit/")
    assert data["provenance"]["torch"] and data["mode"] == "grid"
    assert all(r["profiler_agrees"] for r in data["rows"])
    md = (tmp_path / "audit.md").read_text()
    n = len(data["rows"])
    assert "**MATH**" in md and "dropout_p=0.1" in md and f"Profiler cross-check: {n} of {n}" in md


def test_require_fused_on_the_grid_fails_listing_calls(tmp_path, capsys):
    assert main([*GRID, "--out", str(tmp_path), "--require", "fused"]) == 1
    err = capsys.readouterr().err
    assert "check failed: --require fused: 2 of 16" in err and "dropout" in err and "contiguous" in err
    assert read_json(tmp_path / "audit.json")["violations"] == 2


def test_model_audit_one_row_per_layer(tmp_path, capsys):
    args = ["audit", "--device", "cpu", "--model", "tiny-llama", "--seq", "12", "--out", str(tmp_path), "--json"]
    assert main([*args, "--require", "fused"]) == 0
    data = read_json(tmp_path / "audit.json", "attnprof.audit/")
    assert [r["where"] for r in data["rows"]] == ["model.layers.0.self_attn", "model.layers.1.self_attn"]
    assert data["model"]["attention_calls"] == 2 and last_json(capsys)["violations"] == 0
    assert main([*args, "--require", "flash"]) == 1  # on the CPU the fused kernel is cpu_flash, not flash
    assert "model.layers.0.self_attn" in capsys.readouterr().err


def test_model_from_config_json(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"model_type": "qwen2", "hidden_size": 64, "intermediate_size": 128,
                               "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 1,
                               "vocab_size": 300}))
    assert main(["audit", "--device", "cpu", "--model", str(cfg), "--seq", "8", "--out", str(tmp_path / "o")]) == 0
    assert len(read_json(tmp_path / "o" / "audit.json")["rows"]) == 3


@pytest.mark.parametrize("args, says", [
    (["--require", "fastest"], "--require 'fastest'"),
    (["--model", "no-such-model"], "unknown model preset"),
    (["--model", "missing/config.json"], "no such config file"),
    (["--head-dims", "64,x"], "--head-dims"),
    (["--dtypes", "fp7"], "unknown dtype"),
])
def test_bad_input_is_one_line_exit_2(tmp_path, capsys, args, says):
    assert main(["audit", "--device", "cpu", "--out", str(tmp_path), *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("attnprof: error:") and says in err[-1] and "Traceback" not in "".join(err)


def test_unreadable_config_is_exit_2(tmp_path, capsys):
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    assert main(["audit", "--device", "cpu", "--model", str(bad), "--out", str(tmp_path / "o")]) == 2
    assert "not a readable config.json" in capsys.readouterr().err
