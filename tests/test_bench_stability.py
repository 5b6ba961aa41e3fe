"""`bench.stability` on the CPU: a real reference drifting under a planted clock, and the verdict carried by `bench`'s
terminal, its --json line and its `.machine.json`, and by `stages`' results.json and report.md. About 10 s."""

import json
import time
from pathlib import Path

import pytest

from attnprof.bench import stability
from attnprof.bench.stability import Stability, Watch
from attnprof.cli import main
from attnprof.measure import timing

TINY = ["--seq", "16,24", "--batch", "1", "--heads", "2", "--head-dim", "8", "--dtype", "fp32", "--reps", "5",
        "--warmup", "1", "--device", "cpu"]


@pytest.fixture(autouse=True)
def cache_dir(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.setenv("ATTNPROF_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def any_load(monkeypatch):
    """Thresholds no machine passes (any drift, any wait, any load): the verdict is "unreliable" wherever it runs."""
    monkeypatch.setattr(stability, "DRIFT", 0.0)
    monkeypatch.setattr(stability, "WAITING", -1.0)
    monkeypatch.setattr(stability, "LOAD", -1.0)


def test_a_reference_timed_on_a_clock_20x_fast_is_a_drift(monkeypatch):
    """A clock 20× fast from the start's reference on: whatever the load does to either timing (a cold first call,
    a busy core), 20× is far past the threshold, so the drift is flagged and the numbers in its reason are its own."""
    monkeypatch.setattr(stability, "WAITING", 10.0)  # only the drift is under test: a loaded CI machine waits
    monkeypatch.setattr(stability, "LOAD", 1e9)
    watch = Watch("cpu")
    monkeypatch.setattr(timing, "clock", lambda: 20 * time.perf_counter())  # every duration measured from now: 20×
    got = watch.finish()
    assert got.drift == pytest.approx(got.reference_ms[-1] / got.reference_ms[0]) and got.drift > stability.DRIFT
    assert not got.reliable and got.reason.startswith("timings unreliable: the reference matmul drifted")
    assert got.short == f"timings unreliable: the reference matmul drifted {got.drift:.3g}×"
    data = got.to_json()
    assert data["reliable"] is False and data["thresholds"]["drift"] == stability.DRIFT and data["cores"] >= 1


def test_a_steady_verdict_says_nothing():
    steady = Stability("cpu", (0.2, 0.21), 1.05, 0.01, 0.3, 2, 1.0, ())
    assert steady.reliable and steady.reason is None and steady.short is None
    assert steady.to_json()["reliable"] is True


def test_bench_carries_the_verdict_to_the_speedup_line_json_and_machine_file(tmp_path, capsys, any_load):
    out = tmp_path / "b"
    assert main(["bench", *TINY, "--variants", "naive,sdpa", "--out", str(out), "--json"]) == 0
    captured = capsys.readouterr()
    text = " ".join((captured.out + captured.err).split())
    assert "timings unreliable: the reference matmul drifted" in text
    speedup = [line for line in captured.out.splitlines() if "speedup over naive" in line]
    last = json.loads(captured.out.strip().splitlines()[-1])
    assert last["machine"]["reliable"] is False and last["machine"]["load"] is not None
    assert any("speedup over naive" in c and "[timings unreliable:" in c for c in last["claims"])
    assert speedup and "timings unreliable" in " ".join(captured.out.split()).split("speedup over naive")[1]
    machine = json.loads((out / "results.machine.json").read_text())
    assert machine["reliable"] is False and len(machine["reference_ms"]) == 2
    # `attnprof report` draws the same sweep later: its pages carry the verdict too, and every speedup with it
    assert main(["report", str(out)]) == 0
    page = (out / "report.md").read_text()
    assert f"**{machine['reason']}**" in page
    assert any("speedup over naive" in line and f"[{machine['short']}]" in line for line in page.splitlines())
    assert "timings unreliable: the reference matmul drifted" in (out / "report.html").read_text()


def test_stages_writes_the_machine_block_and_says_it(tmp_path, capsys, any_load):
    out = tmp_path / "s"
    assert main(["stages", "--device", "cpu", "--batch", "1", "--heads", "2", "--seq", "16", "--head-dim", "8",
                 "--variants", "naive,sdpa", "--steps", "1", "--reps", "20", "--out", str(out)]) == 0
    data = json.loads((out / "results.json").read_text())
    assert data["machine"]["reliable"] is False and data["machine"]["reason"].startswith("timings unreliable")
    assert "**timings unreliable:" in (out / "report.md").read_text()
    assert "timings unreliable" in " ".join(capsys.readouterr().err.split())
