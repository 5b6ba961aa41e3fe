"""Fault injection: real `attnprof bench` / `attnprof report` processes killed with SIGKILL and SIGTERM.

Kill points: after n finished rows (polled from the file, a real timing point), inside a row's write (SIGKILL: a
torn line; SIGTERM: the row is finished first), with every row written but the folder not yet under `--out`, while
`report` draws its pictures. The last three are reached
with the documented pause hook (`ATTNPROF_PAUSE_AT`, `attnprof.pause`): the process does what it always does and
sleeps there until the test kills it. After every kill: no finished row is lost or changed, no row is there
twice, `--resume` ends with exactly the grid, and the exit codes are those docs/bench.md gives (143 after
SIGTERM, 2 for a second run into a busy `--out`; SIGKILL leaves no code of ours).

Cost: five CPU subprocesses (tiny cells; most of their time is importing torch), all started at once so their
start-ups overlap (those that must wait for another wait at the `open` pause), plus in-process resumes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from attnprof.bench.results import read_results
from attnprof.bench.spec import build_grid
from attnprof.cli import main

SRC = Path(__file__).resolve().parents[1] / "src"
GRID = ["--device", "cpu", "--variants", "naive,sdpa", "--seq", "16,24,32,48", "--batch", "1", "--heads", "2",
        "--head-dim", "8", "--dtype", "fp32", "--reps", "5", "--warmup", "0"]
KEYS = sorted(c.key for c in build_grid("cpu", variants="naive,sdpa", seq="16,24,32,48", batch="1", heads="2",
                                        head_dim="8", dtype="fp32").cells("cpu"))
WAIT_S = 120  # the longest a process may take to reach a point on a loaded machine


class Proc:
    """One `python -m attnprof ...` process; its stderr goes to a file the test reads while it runs."""

    def __init__(self, base: Path, name: str, argv: list[str], pause: str | None = None):
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
               "ATTNPROF_CACHE_DIR": str(base / "cache"), "ATTNPROF_PAUSE_S": str(WAIT_S)}
        env.pop("ATTNPROF_PAUSE_AT", None)
        if pause:
            env["ATTNPROF_PAUSE_AT"] = pause
        self.name, self.err = name, base / f"{name}.err"
        with open(self.err, "w") as fh:
            self.p = subprocess.Popen([sys.executable, "-m", "attnprof", *argv], env=env, stdin=subprocess.DEVNULL,
                                      stdout=subprocess.DEVNULL, stderr=fh)

    def stderr(self) -> str:
        return self.err.read_text(errors="replace")

    def wait_for(self, what: str, ready) -> None:
        end = time.monotonic() + WAIT_S
        while not ready():
            assert self.p.poll() is None, f"{self.name} ended ({self.p.returncode}) before {what}:\n{self.stderr()}"
            assert time.monotonic() < end, f"{self.name}: no {what} after {WAIT_S} s:\n{self.stderr()}"
            time.sleep(0.005)

    def paused(self) -> None:
        self.wait_for("pause", lambda: "attnprof: paused at" in self.stderr())

    def go_on(self) -> None:
        """End the pause it is in (SIGUSR1, see `attnprof.pause`)."""
        self.p.send_signal(signal.SIGUSR1)

    def kill(self, sig: int) -> int:
        self.p.send_signal(sig)
        return self.p.wait(timeout=WAIT_S)


def hidden(out: Path) -> list[Path]:
    return sorted(out.parent.glob(f".{out.name}.*.part"))


def whole_lines(path: Path) -> list[bytes]:
    """The finished rows: every line that ends in a newline."""
    return [line + b"\n" for line in path.read_bytes().split(b"\n")[:-1] if line]


def line_count(path_of) -> int:
    path = path_of()
    return len(whole_lines(path)) if path is not None and path.is_file() else 0


def exactly_the_grid(out: Path, finished: list[bytes]) -> None:
    """The sweep is whole: every cell once, every row finished before a kill still there byte for byte, nothing
    hidden or marked left over."""
    rows, note = read_results(out)
    assert note is None
    assert sorted(r["key"] for r in rows) == KEYS  # the grid, no duplicate, nothing missing
    lines = set(whole_lines(out / "results.jsonl"))
    assert all(line in lines for line in finished), "a row finished before the kill was lost or changed"
    assert not hidden(out) and not (out / "INCOMPLETE").exists()
    assert not (out.parent / f".{out.name}.lock").exists()


@pytest.fixture(scope="module")
def started(tmp_path_factory):
    """The processes that do not wait on another, started at once: each runs to its kill point meanwhile."""
    base = tmp_path_factory.mktemp("faults")
    done = base / "done"
    assert main(["bench", *GRID[:4], "--seq", "16", *GRID[6:], "--out", str(done)]) == 0  # for `report` to draw
    resume = ["bench", *GRID, "--out", str(base / "k"), "--resume"]
    procs = {
        "chain": Proc(base, "chain", ["bench", *GRID, "--out", str(base / "k")]),
        # the two resumes of the chain wait at `open` (torch imported, nothing locked) until the test says go on
        "resume-1": Proc(base, "resume-1", resume, pause="open,row-write#2"),
        "resume-2": Proc(base, "resume-2", resume, pause="open,commit"),
        "term-write": Proc(base, "term-write", ["bench", *GRID, "--out", str(base / "t")], pause="row-write#2"),
        "pictures": Proc(base, "pictures", ["report", str(done)], pause="pictures"),
    }
    yield base, procs
    for proc in procs.values():
        if proc.p.poll() is None:
            proc.p.kill()
            proc.p.wait()


def test_sigkill_after_rows_inside_a_write_and_before_the_folder_appears(started, capsys):
    base, procs = started
    out = base / "k"
    argv = ["bench", *GRID, "--out", str(out), "--resume"]

    def partial() -> Path | None:
        found = hidden(out)
        return found[0] / "results.jsonl" if found else None

    # 1. SIGKILL once a row is on disk: the rows stay in the hidden folder, nothing under --out
    first = procs["chain"]
    first.wait_for("first row", lambda: line_count(partial) >= 1)
    assert first.kill(signal.SIGKILL) == -signal.SIGKILL
    assert not out.exists() and len(hidden(out)) == 1
    finished = whole_lines(partial())
    assert finished

    # a new run without --resume is refused: it would hide those rows under a second folder
    assert main(["bench", *GRID, "--out", str(out)]) == 2
    assert "add --resume" in capsys.readouterr().err

    # 2. --resume, SIGKILLed in the middle of writing its second row; a second run meanwhile is refused
    second = procs["resume-1"]
    second.paused()  # at `open`
    second.go_on()
    second.wait_for("pause in a row", lambda: second.stderr().count("attnprof: paused at") == 2)
    assert "continuing the run that was killed" in second.stderr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"being written by another attnprof run (pid {second.p.pid}" in err and err.count("\n") == 1
    assert second.kill(signal.SIGKILL) == -signal.SIGKILL
    assert partial().read_bytes()[-1:] != b"\n"  # a torn last line: half a row
    assert whole_lines(partial())[: len(finished)] == finished
    finished = whole_lines(partial())
    assert len(finished) >= 2

    # 3. --resume again (the torn line dropped with a note, the dead run's lock taken over), SIGKILLed with every
    #    row written but before its folder appeared under --out
    third = procs["resume-2"]
    third.paused()  # at `open`
    third.go_on()
    third.wait_for("every row written", lambda: third.stderr().count("attnprof: paused at") == 2)
    assert third.kill(signal.SIGKILL) == -signal.SIGKILL
    stderr = third.stderr()
    assert "torn last line" in stderr and "took over the lock" in stderr
    assert not out.exists()
    assert whole_lines(partial())[: len(finished)] == finished
    finished = whole_lines(partial())
    assert len(finished) == len(KEYS)

    # 4. the last --resume runs nothing, and the folder appears under --out
    assert main([*argv, "--json"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["ran"] == 0 and summary["skipped"] == len(KEYS)
    exactly_the_grid(out, finished)


def test_sigterm_inside_a_row_write_finishes_that_row(started, capsys):
    base, procs = started
    out = base / "t"
    proc = procs["term-write"]
    proc.paused()
    assert proc.kill(signal.SIGTERM) == 143
    assert "partial results kept in" in proc.stderr()
    finished = whole_lines(out / "results.jsonl")
    assert len(finished) == 2 and (out / "results.jsonl").read_bytes().endswith(b"\n")  # the row it was writing
    assert (out / "INCOMPLETE").is_file() and not hidden(out)
    assert main(["bench", *GRID, "--out", str(out), "--resume"]) == 0
    exactly_the_grid(out, finished)


def test_sigterm_while_report_draws_leaves_the_rows_as_they_were(started, capsys):
    base, procs = started
    done = base / "done"
    before = (done / "results.jsonl").read_bytes()
    proc = procs["pictures"]
    proc.paused()
    assert proc.kill(signal.SIGTERM) == 143
    assert "terminated (SIGTERM)" in proc.stderr()
    assert (done / "results.jsonl").read_bytes() == before
    assert main(["report", str(done)]) == 0
    assert (done / "report.html").is_file() and (done / "results.jsonl").read_bytes() == before
