"""Error lines that say what to do: `report` on a folder that is not a bench one names what it reads and what to run;
rows nobody's attnprof wrote are "not an attnprof results file"; an unknown `model_type` names the five closest
known types instead of all ~800; on a terminal an error is wrapped to its width, in a pipe it stays one line.

All in-process but two subprocesses (a real pseudo-terminal, and a pipe, for the wrapping): ~10 s on a 2-core CPU.
"""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
from pathlib import Path

import pytest

from attnprof.cli import main
from attnprof.stderr import error_lines

SRC = str(Path(__file__).resolve().parents[1] / "src")
READS = "`attnprof report` draws the results.jsonl that `attnprof bench --out DIR` writes"


def one_line_exit_2(capsys, argv: list[str]) -> str:
    code = main(argv)
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 2, err
    assert len(err) == 1 and err[0].startswith("attnprof: error: "), err
    return err[0]


# --- report on what is not a bench folder ---------------------------------------------------------------------------

def test_report_on_a_stages_folder_names_what_it_reads_and_what_to_run(tmp_path, capsys):
    stages = tmp_path / "st"
    assert main(["stages", "--device", "cpu", "--batch", "1", "--heads", "2", "--seq", "16", "--head-dim", "8",
                 "--steps", "1", "--variants", "sdpa", "--out", str(stages)]) == 0
    capsys.readouterr()
    line = one_line_exit_2(capsys, ["report", str(stages)])
    assert f"{stages} is an `attnprof stages` folder (results.json), not a bench one" in line
    assert READS in line and "report.md" in line  # and where the stages report already is
    assert not (stages / "report.html").exists()


def test_report_on_an_empty_folder_or_a_missing_path(tmp_path, capsys):
    line = one_line_exit_2(capsys, ["report", str(tmp_path)])
    assert line == f"attnprof: error: {tmp_path} holds no results.jsonl: {READS}; run that, then `attnprof report DIR`"
    line = one_line_exit_2(capsys, ["report", str(tmp_path / "nope")])
    assert line == f"attnprof: error: {tmp_path / 'nope'}: no such file or folder ({READS})"


# --- results files that were never attnprof's ----------------------------------------------------------------------

@pytest.mark.parametrize("row, says", [
    ({"a": 1, "latency": 3.2}, "line 1: not an attnprof results file (a row with no schema; `attnprof bench` writes "
                               "rows of schema attnprof.bench/1)"),
    ([1, 2], "line 1: not an attnprof results file (a row with no schema"),
    ({"schema": "mlperf/3"}, "line 1: not an attnprof results file (a row with schema 'mlperf/3'"),
    ({"schema": "attnprof.stages/1"}, "line 1: schema 'attnprof.stages/1' is not attnprof.bench/1 (a results file "
                                      "from another attnprof command)"),
])
@pytest.mark.parametrize("command", ["report", "compare"])
def test_foreign_rows_are_not_an_attnprof_results_file(tmp_path, capsys, row, says, command):
    path = tmp_path / "results.jsonl"
    path.write_text(json.dumps(row) + "\n")
    argv = ["report", str(path)] if command == "report" else ["compare", str(path), str(path)]
    line = one_line_exit_2(capsys, argv)
    assert says in line and "another attnprof version" not in line


# --- an unknown model_type ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("command", ["audit", "verify", "serve"])
def test_unknown_model_type_names_the_closest_five(tmp_path, capsys, command):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "llamma", "hidden_size": 64, "intermediate_size": 128,
                                  "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2,
                                  "vocab_size": 64, "max_position_embeddings": 128}))
    line = one_line_exit_2(capsys, [command, "--device", "cpu", "--model", str(config), "--out", str(tmp_path / "o")])
    assert "has no model_type 'llamma'; closest known: llama, " in line
    assert len(line.split("closest known: ")[1].split(", ")) == 5
    assert len(line) < 200  # transformers' own error lists every type it knows: 12,000 characters


# --- wrapping -------------------------------------------------------------------------------------------------------

LONG = ("attnprof: error: /data/runs/sweep-a/config.json: transformers 5.24.0 has no model_type 'llamma'; closest "
        "known: llama, mllama, llama4, llava, diffllama")


def test_error_lines_fit_the_width_and_lose_no_word():
    assert error_lines(LONG, None) == [LONG]  # a pipe: one line, whole
    assert error_lines(LONG, 200) == [LONG]
    for width in (40, 60, 80, 100):
        lines = error_lines(LONG, width)
        assert len(lines) > 1 and all(len(line) <= width for line in lines), (width, lines)
        assert lines[0].startswith("attnprof: error:") and all(line.startswith("  ") for line in lines[1:])
        assert " ".join(line.strip() for line in lines) == LONG
    # a clause that ends in the second half of the first line ends it there
    assert error_lines(LONG, 100)[0] == LONG[:LONG.index(";") + 1]


def test_a_word_longer_than_the_width_is_kept_whole():
    path = "/a/" + "very-long-folder-name/" * 5 + "config.json"
    lines = error_lines(f"attnprof: error: {path}: no such config file", 40)
    assert path in lines or f"  {path}:" in lines, lines


def _attnprof_err(*args: str, tty: bool, columns: int = 50) -> str:
    env = {**os.environ, "PYTHONPATH": SRC, "COLUMNS": str(columns)}
    cmd = [sys.executable, "-m", "attnprof", *args]
    if not tty:
        return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120).stderr
    leader, follower = pty.openpty()  # a few hundred bytes come back: far below what the terminal buffers
    try:
        try:
            proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=follower, env=env, timeout=120)
        finally:
            os.close(follower)
        assert proc.returncode == 2
        chunks = []
        while True:
            try:
                chunk = os.read(leader, 4096)
            except OSError:  # EIO: the terminal's other end is closed and everything was read
                break
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(leader)
    return b"".join(chunks).decode().replace("\r\n", "\n")


def test_a_terminal_gets_wrapped_lines_and_a_pipe_one_line():
    args = ("stages", "--variants", "")
    on_tty = _attnprof_err(*args, tty=True).strip().splitlines()
    assert len(on_tty) > 1 and all(len(line) <= 50 for line in on_tty), on_tty
    assert on_tty[0].startswith("attnprof: error: --variants '' names nothing")
    piped = _attnprof_err(*args, tty=False).strip().splitlines()
    assert len(piped) == 1 and " ".join(line.strip() for line in on_tty) == piped[0]
