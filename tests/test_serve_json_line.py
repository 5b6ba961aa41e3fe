"""`serve --json`'s stdout line carries every metric of serve.json's rows (TPOT, goodput, the steady state, cost, …).

`missing_metrics(data, line)` walks every number in serve.json's row sections and names the ones the line lacks or
changes; the CPU end-to-end run in tests/test_serve_loops.py checks its real line with it. Here: every committed GPU
serve.json under docs/results (production loop, SLO goodput) and a load sweep, through `serve_report.json_line`.
Reading ~20 small JSON files: well under a second.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from attnprof.report.serve_report import json_line
from attnprof.serving.sweep import Sweep, SweepPoint

RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results"
# where each row section of serve.json sits in the --json line; `continuous.stream` is the stream's settings, not a row
SECTIONS = {("prefill",): ("prefill",), ("decode",): ("decode",), ("continuous", "results"): ("continuous",),
            ("continuous", "sweep"): ("sweep",), ("production", "decode"): ("production", "decode"),
            ("production", "continuous", "results"): ("production", "continuous"),
            ("production", "continuous", "sweep"): ("production", "sweep")}
NOT_ROWS = {("continuous", "stream"), ("production", "continuous", "stream"), ("production", "answer")}


def _numbers(x, path=()):
    """(path, value) of every number (bools excluded) inside `x`."""
    if isinstance(x, dict):
        for k, v in x.items():
            yield from _numbers(v, (*path, k))
    elif isinstance(x, list):
        for i, v in enumerate(x):
            yield from _numbers(v, (*path, i))
    elif isinstance(x, (int, float)) and not isinstance(x, bool):
        yield path, x


def _at(x, path):
    for k in path:
        if isinstance(x, dict) and k in x or isinstance(x, list) and isinstance(k, int) and k < len(x):
            x = x[k]
        else:
            raise KeyError(k)
    return x


def missing_metrics(data: dict, line: dict) -> list[str]:
    """serve.json's row numbers that the --json line lacks or changes, as `section.path` strings; a row section this
    test does not know yet is named too (so a new kind of row cannot slip past)."""
    out = []
    for top in ("prefill", "decode", "continuous", "production"):
        for path, value in _numbers(data.get(top), (top,)):
            section = next((s for s in SECTIONS if path[:len(s)] == s), None)
            if section is None:
                if not any(path[:len(s)] == s for s in NOT_ROWS):
                    out.append("unknown section: " + ".".join(map(str, path)))
                continue
            where = SECTIONS[section] + path[len(section):]
            try:
                got = _at(line, where)
            except KeyError:
                out.append(".".join(map(str, path)))
                continue
            if got != value:
                out.append(f"{'.'.join(map(str, path))}: {got!r} != {value!r}")
    return out


def _committed() -> list[Path]:
    found = []
    for f in sorted(RESULTS.rglob("*.json")):
        text = f.read_text(errors="replace")
        # a run cut short keeps its rows in a `.partial.json` ("partial": true): no answer, no summary line to check
        if '"attnprof.serve/1"' in text[:200] and not json.loads(text).get("partial"):
            found.append(f)
    return found


def test_committed_reports_include_the_production_loop_and_goodput():
    """The files below exercise the production loop and an SLO's goodput (else the next test proves little)."""
    files = _committed()
    assert files, f"no committed serve.json under {RESULTS}"
    rows = [r for f in files for d in [json.loads(f.read_text())]
            for r in d["continuous"]["results"] + ((d.get("production") or {}).get("continuous") or {}).get("results", [])]
    assert any((r.get("metrics") or {}).get("throughput", {}).get("request_goodput") is not None for r in rows)
    assert any(r.get("loop") == "production" and r.get("status") == "ok" for r in rows)


@pytest.mark.parametrize("path", _committed(), ids=lambda p: p.name)
def test_the_json_line_carries_every_metric_of_the_report(path):
    data = json.loads(path.read_text())
    line = json.loads(json.dumps(json_line(data, "out")))  # as stdout carries it
    assert missing_metrics(data, line) == []
    assert line["answer"] == data["answer"] and line["schema"] == "attnprof.serve/1"


def test_the_sweep_is_on_the_line_and_the_check_bites():
    """A load sweep's points are rows too; and the check names what a summary line without TPOT would lose."""
    data = next(d for f in _committed() for d in [json.loads(f.read_text())]
                if any(r["status"] == "ok" and r.get("metrics") for r in d["continuous"]["results"]))
    pts = (SweepPoint("eager", 1, 100.0, 50.0, 9.7, 12.0, 20.0, 8, 0), SweepPoint("eager", 4, 300.0, 30.0, 3.2, 15.0,
                                                                              33.0, 8, 0))
    data["continuous"]["sweep"] = {**Sweep("concurrency", 1, 3.5, pts).to_json(), "not_run": []}
    line = json_line(data, "out")
    assert missing_metrics(data, line) == [] and line["sweep"]["points"][1]["tpot_p50_ms"] == 33.0
    del line["sweep"]
    assert "continuous.sweep.points.1.tpot_p50_ms" in missing_metrics(data, line)
    ok = next(i for i, r in enumerate(data["continuous"]["results"]) if r["status"] == "ok" and r.get("metrics"))
    line = json_line(data, "out")
    line["continuous"] = [{k: r[k] for k in ("impl", "status", "completed", "output_tokens_per_s", "ttft_ms")}
                          for r in line["continuous"]]
    lost = missing_metrics(data, line)
    assert f"continuous.results.{ok}.metrics.latency.tpot_ms.p50" in lost
    assert f"continuous.results.{ok}.metrics.throughput.output_throughput" in lost
