"""The kill-safety rules that need no second process: a real SIGTERM sent to this process after n rows, an exit-2
error after rows, leftovers of several killed runs, a busy `--out`. Tiny CPU cells, in-process; about 5 s.
(tests/test_faults.py kills real subprocesses.)"""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path

import pytest

from attnprof.bench.results import read_results
from attnprof.cli import main
from attnprof.errors import UsageError

GRID = ["bench", "--device", "cpu", "--variants", "naive,sdpa", "--seq", "16,24", "--batch", "1", "--heads", "2",
        "--head-dim", "8", "--dtype", "fp32", "--reps", "5", "--warmup", "0"]
CELLS = 4


@pytest.fixture(autouse=True)
def cache_dir(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("ATTNPROF_CACHE_DIR", str(tmp_path / "cache"))


def stop_after(monkeypatch, n: int, stop) -> None:
    """Call `stop()` once the sweep has finished `n` rows (before the next cell starts)."""
    import attnprof.bench.sweep as sweep

    real = sweep.run_sweep

    def run_sweep(cells, path, **kw):
        def on_cell(i, total, cell, phase):
            if phase == "start" and i == n:
                stop()
        return real(cells, path, **{**kw, "on_cell": on_cell})

    monkeypatch.setattr(sweep, "run_sweep", run_sweep)


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines()


def hidden(out: Path) -> list[Path]:
    """`out`'s own hidden work folders (mkdtemp's 8 characters; a sibling output's `.k.v2.XXXX.part` is not one)."""
    return sorted(p for p in out.parent.glob(f".{out.name}.*.part") if len(p.name) == len(out.name) + 15)


def whole(out: Path, before: list[str]) -> None:
    rows, note = read_results(out)
    keys = [r["key"] for r in rows]
    assert note is None and len(keys) == CELLS == len(set(keys))
    assert lines(out / "results.jsonl")[: len(before)] == before
    assert not hidden(out) and not (out / "INCOMPLETE").exists()


@pytest.mark.parametrize("n", [0, 1, 3])
def test_sigterm_after_n_rows_is_exit_143_rows_kept_then_resumed(tmp_path, capsys, monkeypatch, n):
    out = tmp_path / "k"
    stop_after(monkeypatch, n, lambda: os.kill(os.getpid(), signal.SIGTERM))
    assert main([*GRID, "--out", str(out)]) == 143
    assert f"terminated (SIGTERM); partial results kept in {out}" in capsys.readouterr().err
    before = lines(out / "results.jsonl")
    assert len(before) == n and (out / "INCOMPLETE").is_file() and not hidden(out)
    monkeypatch.undo()
    assert main([*GRID, "--out", str(out), "--resume"]) == 0
    whole(out, before)


def test_an_error_after_rows_leaves_them_for_resume(tmp_path, capsys, monkeypatch):
    out = tmp_path / "k"

    def full_disk():
        raise UsageError("disk full while writing (simulated)")

    stop_after(monkeypatch, 2, full_disk)
    assert main([*GRID, "--out", str(out)]) == 2
    assert not out.exists()  # an exit-2 run shows no folder under --out, yet its two rows stay where --resume looks
    [partial] = hidden(out)
    before = lines(partial / "results.jsonl")
    assert len(before) == 2
    monkeypatch.undo()
    capsys.readouterr()
    assert main([*GRID, "--out", str(out)]) == 2  # starting over would hide them
    assert f"{partial} holds the rows of a killed run" in capsys.readouterr().err
    assert main([*GRID, "--out", str(out), "--resume"]) == 0
    whole(out, before)


def test_leftovers_of_several_killed_runs(tmp_path, capsys):
    out = tmp_path / "k"
    assert main([*GRID, "--out", str(tmp_path / "src")]) == 0
    first = lines(tmp_path / "src" / "results.jsonl")[0] + "\n"
    for name, text in (("aaaa1111", first), ("bbbb2222", first), ("cccc3333", ""), ("v2.dddd4444", first)):
        (tmp_path / f".k.{name}.part").mkdir()  # mkdtemp's names; `.k.v2.….part` is a live `--out k.v2` run's
        (tmp_path / f".k.{name}.part" / "results.jsonl").write_text(text)
    capsys.readouterr()
    assert main([*GRID, "--out", str(out), "--resume"]) == 2  # which one to continue is the user's choice
    err = capsys.readouterr().err.strip()
    assert "2 killed runs" in err and ".k.aaaa1111.part" in err and ".k.bbbb2222.part" in err
    assert len(err.splitlines()) == 1 and "v2" not in err
    shutil.rmtree(tmp_path / ".k.bbbb2222.part")
    assert main([*GRID, "--out", str(out), "--resume"]) == 0
    err = capsys.readouterr().err
    assert "held no rows yet" in err and "continuing the run that was killed" in err
    whole(out, [first.strip()])
    assert (tmp_path / ".k.v2.dddd4444.part" / "results.jsonl").read_text() == first  # the sibling's, untouched


def test_results_naming_a_folder_is_one_line_before_any_work(tmp_path, capsys):
    assert main([*GRID, "--results", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "is a folder; name the results file" in err and len(err.splitlines()) == 1
    assert list(tmp_path.iterdir()) == []


def test_a_busy_out_is_refused_in_one_line(tmp_path, capsys):
    from attnprof.lock import OutputLock

    out = tmp_path / "k"
    held = OutputLock(out).acquire()  # another run (here: another open file, as another process would hold it)
    try:
        assert main([*GRID, "--out", str(out)]) == 2
        err = capsys.readouterr().err.strip()
        assert f"pid {os.getpid()}" in err and "another attnprof run" in err and len(err.splitlines()) == 1
        assert not out.exists() and not hidden(out)
    finally:
        held.release()
    stale = tmp_path / ".k.lock"
    stale.write_text("pid 999999 on elsewhere, started long ago\n")  # a run that was killed: nobody holds it
    assert main([*GRID, "--out", str(out)]) == 0
    assert "took over the lock of an attnprof run that is gone (pid 999999" in capsys.readouterr().err
    assert not stale.exists()


def test_a_killed_serve_runs_rows_are_brought_into_view_by_the_next_run(tmp_path):
    """serve has no --resume: the partial rows a SIGKILLed serve left in its hidden folder are renamed into view
    (`NAME.killed-<time>`, marked INCOMPLETE) by the next run into the same --out, which then starts anew; a hidden
    folder that holds no rows is removed. The folder logic serve's command uses (`out_dir(..., rows=, resumable=False)`)."""
    from attnprof.files import INCOMPLETE, finish_folders, folder_notes, open_folder

    final = tmp_path / "s"
    killed = tmp_path / ".s.abc12345.part"
    killed.mkdir()
    (killed / "serve.partial.json").write_text('{"partial": true, "decode": [{"impl": "sdpa"}]}')
    empty = tmp_path / ".s.def45678.part"
    empty.mkdir()
    (empty / "serve.partial.json").write_text("")
    work = open_folder(final, keep_partial=True, rows="serve.partial.json", resumable=False)
    shown = [p for p in tmp_path.iterdir() if p.name.startswith("s.killed-")]
    assert len(shown) == 1 and (shown[0] / "serve.partial.json").read_text().startswith('{"partial": true')
    assert (shown[0] / INCOMPLETE).is_file() and not killed.exists() and not empty.exists()
    notes = folder_notes(work)
    assert any(f"kept the rows of a killed run into {final}: {shown[0]}" in n for n in notes), notes
    assert work not in (killed, empty) and work.name.startswith(".s.")  # a fresh run, not the killed one continued
    (work / "serve.json").write_text("{}")
    finish_folders(ok=True)
    assert (final / "serve.json").is_file() and not (final / INCOMPLETE).exists()
