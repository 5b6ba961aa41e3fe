"""`attnprof compare`: a real slowdown planted in one variant is flagged; noise and the same run are not."""

import json
import time
from pathlib import Path

import pytest

from attnprof.bench.compare import compare
from attnprof.bench.results import read_results
from attnprof.bench.spec import Cell
from attnprof.bench.sweep import run_sweep
from attnprof.cli import main
from attnprof.variants import VARIANTS, Variant
from attnprof.workload import Workload

SMALL = [Workload(batch=1, heads=2, seq=s, head_dim=8) for s in (16, 24)]


# these tests plant changes in real timings of a shared machine: the noise guard (--max-spread) is tested in
# tests/test_robust_status.py, so here any spread is accepted
NOISE_OK = 1e9


def sweep(path: Path, sdpa_fn) -> Path:
    cells = [Cell(v, w) for w in SMALL for v in (VARIANTS["naive"], Variant("sdpa", sdpa_fn))]
    run_sweep(cells, path, reps=5, warmup=1)
    return path


def slow_sdpa(inputs):
    time.sleep(0.15)  # the planted regression: far beyond this CPU's run-to-run spread
    return VARIANTS["sdpa"].fn(inputs)


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("cmp")
    return sweep(d / "a.jsonl", VARIANTS["sdpa"].fn), sweep(d / "b.jsonl", slow_sdpa)


def test_planted_regression_is_flagged(files):
    a, b = files
    pairs = {(p.variant, p.label): p for p in compare(read_results(a)[0], read_results(b)[0], max_spread=NOISE_OK)}
    for w in SMALL:
        slow = pairs[("sdpa", w.label())]
        assert slow.verdict == "regression" and slow.ratio > 2, slow.why
        assert "B p20" in slow.why and "A p80" in slow.why


def test_a_file_against_itself_has_no_regression(files):
    a, _ = files
    pairs = compare(read_results(a)[0], read_results(a)[0], max_spread=NOISE_OK)
    assert {p.verdict for p in pairs} == {"same"} and all(p.ratio == 1.0 for p in pairs)


def test_overlapping_bands_are_noise_not_regression():
    def row(p20, p50, p80):
        return {"key": "k", "variant": "v", "status": "ok", "latency_ms": {"p20": p20, "p50": p50, "p80": p80}}

    assert compare([row(1.0, 1.1, 1.3)], [row(1.2, 1.4, 1.6)])[0].verdict == "same"  # bands overlap
    assert compare([row(1.0, 1.1, 1.2)], [row(1.21, 1.12, 1.3)])[0].verdict == "same"  # < 5 % median change
    assert compare([row(1.0, 1.1, 1.2)], [row(1.3, 1.4, 1.5)])[0].verdict == "regression"
    assert compare([row(1.3, 1.4, 1.5)], [row(1.0, 1.1, 1.2)])[0].verdict == "improvement"
    oom = {"key": "k", "variant": "v", "status": "oom", "reason": "CUDA out of memory", "latency_ms": None}
    assert compare([row(1.0, 1.1, 1.2)], [oom])[0].verdict == "regression"


def test_cli_fail_on_regression_exits_1(files, tmp_path: Path, capsys):
    a, b = files
    assert main(["compare", str(a), str(b), "--max-spread", "1e9", "--out", str(tmp_path / "c"), "--json"]) == 0
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    sdpa_keys = {r["key"] for r in read_results(a)[0] if r["variant"] == "sdpa"}
    assert len(sdpa_keys) == 2 and sdpa_keys <= set(last["regressions"])
    written = json.loads((tmp_path / "c" / "compare.json").read_text())
    assert written["schema"] == "attnprof.compare/1" and written["provenance"]["torch"]
    assert main(["compare", str(a), str(b), "--max-spread", "1e9", "--out", str(tmp_path / "c"), "--fail-on-regression"]) == 1
    err = capsys.readouterr().err
    assert "check failed" in err and "slower beyond the run-to-run spread" in err
    assert main(["compare", str(a), str(a), "--max-spread", "1e9", "--out", str(tmp_path / "c"), "--fail-on-regression"]) == 0


def test_cli_other_schema_version_exit_2(files, tmp_path: Path, capsys):
    a, _ = files
    future = tmp_path / "future.jsonl"
    future.write_text("\n".join(json.dumps({**json.loads(line), "schema": "attnprof.bench/2"})
                                for line in a.read_text().splitlines()) + "\n")
    assert main(["compare", str(a), str(future), "--out", str(tmp_path / "c")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("attnprof: error:") and "attnprof.bench/2" in err[-1] and "line 1" in err[-1]


def test_cli_missing_file_exit_2(files, tmp_path: Path, capsys):
    a, _ = files
    assert main(["compare", str(a), str(tmp_path / "nope.jsonl"), "--out", str(tmp_path / "c")]) == 2
    assert "no such results file" in capsys.readouterr().err
