"""Every command's terminal output fits 80 columns on a CPU run (stdout is not a terminal here, so rich would draw up
to 200); `--wide` prints the columns the default leaves out. The report files keep everything. (`report` prints no
table: it writes report.html and report.md.)"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from torch.profiler import ProfilerActivity, profile, record_function

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `tests.broken` as module:function specs

from attnprof.cli import main  # noqa: E402
from attnprof.report.render import WIDTH  # noqa: E402

GEMMA2 = {"model_type": "gemma2", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
          "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 128,
          "max_position_embeddings": 256, "attn_logit_softcapping": 50.0, "sliding_window": 8}
OUT = ["--out", "OUT"]
BENCH = ["--batch", "1", "--heads", "2", "--head-dim", "8", "--dtype", "fp32", "--reps", "5", "--warmup", "1",
         "--device", "cpu"]
SERVE = ["serve", "--device", "cpu", "--model", "tiny-llama", "--impls", "eager,sdpa,kernel", "--context", "16",
         "--decode-batch", "1", "--decode-context", "16", "--new-tokens", "2", "--requests", "2", "--prompt-median",
         "8", "--output-median", "2", "--no-share", "--reps", "1"]


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> Path:
    """A profiler trace, two bench folders, a Gemma 2 config and a ceilings cache, made once."""
    root = tmp_path_factory.mktemp("width")
    q = torch.randn(1, 4, 32, 16)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for i in range(2):
            with record_function(f"attnprof.step.{i}"):
                (q @ q.transpose(-1, -2)).softmax(-1) @ q
    prof.export_chrome_trace(str(root / "trace.json"))
    assert main(["bench", *BENCH, "--seq", "16,24", "--variants", "naive,sdpa,sdpa-efficient", "--out",
                 str(root / "a")]) == 0
    assert main(["bench", *BENCH, "--seq", "16,24", "--variants", "naive,sdpa", "--out", str(root / "b")]) == 0
    (root / "gemma2.json").write_text(json.dumps(GEMMA2))
    return root


def commands(root: Path, run: int = 0) -> dict[str, list[str]]:
    cmds = {
        "stages": ["stages", "--device", "cpu", "--batch", "1", "--heads", "4", "--kv-heads", "2", "--seq", "24",
                   "--head-dim", "16", "--steps", "1", "--variants",
                   "naive,sdpa,sdpa-efficient,kernel,tests.broken:needs_hq_heads", *OUT],
        "variants": ["variants", "--device", "cpu", "--heads", "8", "--kv-heads", "2", "--variants",
                     "naive,sdpa,flex,kernel,flash-attn,sageattention,tests.broken:needs_hq_heads"],
        "audit grid": ["audit", "--device", "cpu", "--crosscheck", "9", *OUT],
        "audit model": ["audit", "--device", "cpu", "--model", "tiny-llama", "--seq", "16", *OUT],
        "audit refused": ["audit", "--device", "cpu", "--model", str(root / "gemma2.json"), "--seq", "16", *OUT],
        "audit measured": ["audit", "--device", "cpu", "--model", "tiny-llama", "--phase", "prefill,decode",
                           "--new-tokens", "2", "--seq", "8", "--measure", "--no-cache", *OUT],
        "trace": ["trace", str(root / "trace.json")],
        "bench": ["bench", *BENCH, "--seq", "16", "--variants", "naive,sdpa,sdpa-efficient,kernel", *OUT],
        "compare": ["compare", str(root / "a"), str(root / "b")],
        "ceilings": ["ceilings", "--device", "cpu", "--show"],
        "verify": ["verify", "--device", "cpu", "--cases", "gqa,pad-left,fully-masked", "--dtype", "fp32,bf16",
                   "--seed", "1", "--variants", "sdpa,sdpa-efficient,kernel,tests.broken:gqa_tiled", *OUT],
        "verify model": ["verify", "--device", "cpu", "--model", str(root / "gemma2.json"), "--dtype", "fp32",
                         "--impls", "eager,sdpa,sdpa-cudnn,kernel,tests.broken:correct", "--seed", "1",
                         "--model-seq", "12", "--decode-tokens", "2", *OUT],
        "serve": [*SERVE, *OUT],
    }
    # each command its own new report folder (OUT above is a placeholder)
    return {name: [str(root / f"{name.replace(' ', '-')}-{run}") if a == "OUT" else a for a in argv]
            for name, argv in cmds.items()}


NAMES = list(commands(Path(".")))


@pytest.mark.parametrize("name", NAMES)
def test_every_terminal_line_fits(files, name, capsys, monkeypatch):
    monkeypatch.setenv("ATTNPROF_CACHE_DIR", str(files / "cache"))  # no ceilings of this machine's user
    main(commands(files)[name])  # exit 1 is fine here (a failing mutant, an error row): the output is the point
    lines = capsys.readouterr().out.splitlines()
    assert lines, "the command printed nothing on stdout"
    wide = [(len(line), line) for line in lines if len(line) > WIDTH]
    assert not wide, f"{len(wide)} line(s) over {WIDTH} columns, the widest {max(wide)[0]}: {max(wide)[1]!r}"


@pytest.mark.parametrize("name, header", [("audit grid", "why not faster / fix"), ("serve", "attention share"),
                                          ("variants", "what it is / why not")])
def test_wide_prints_the_columns_the_default_leaves_out(files, name, header, capsys):
    main(commands(files, 1)[name])
    assert header not in capsys.readouterr().out
    main([*commands(files, 2)[name], "--wide"])
    text = capsys.readouterr().out
    assert header in text and max(len(line) for line in text.splitlines()) > WIDTH


def test_audit_reasons_sit_below_the_table_and_in_the_report(files, capsys):
    main(commands(files, 3)["audit grid"])
    printed = capsys.readouterr().out
    assert "[1] cpu_flash:" in printed  # numbered beside the backend, said in full below
    md = (files / "audit-grid-3" / "audit.md").read_text()
    assert "| where | inputs | backend | fused op | why not faster | fix |" in md  # the report keeps every column
