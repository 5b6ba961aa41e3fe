"""One results file over several GPU kinds (what a Ray sweep across a fleet writes): report, speedups, compare.

This machine has one device, so the second kind is made the way a fleet makes it: the same cells measured again
(here with a planted slow `naive`, so the two kinds differ), those rows naming another device, appended to the
same file. Speedups must use the baseline of their own kind, the report must show each cell on both kinds side by
side, and compare must match cells per kind.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from attnprof.bench.compare import compare
from attnprof.bench.results import gpu_kind, read_results, with_speedups
from attnprof.bench.spec import Cell
from attnprof.bench.sweep import run_sweep
from attnprof.cli import main
from attnprof.report import bench_tables as T
from attnprof.variants import VARIANTS, Variant
from attnprof.workload import Workload

OTHER = "NVIDIA H200"
WORKLOADS = [Workload(batch=1, heads=2, seq=16, head_dim=8)]


def slow_naive(inputs):
    time.sleep(0.02)  # the other kind's naive is far slower: its speedups differ from this kind's
    return VARIANTS["naive"].fn(inputs)


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("kinds")
    here = d / "here.jsonl"
    run_sweep([Cell(v, w) for w in WORKLOADS for v in (VARIANTS["naive"], VARIANTS["sdpa"])], here, reps=5, warmup=1)
    other = d / "other.jsonl"
    run_sweep([Cell(v, w) for w in WORKLOADS for v in (Variant("naive", slow_naive), VARIANTS["sdpa"])], other,
              reps=5, warmup=1)
    fleet = d / "fleet" / "results.jsonl"
    fleet.parent.mkdir()
    lines = here.read_text().splitlines()
    for line in other.read_text().splitlines():
        row = json.loads(line)
        row["provenance"]["device"] = OTHER
        lines.append(json.dumps(row))
    fleet.write_text("\n".join(lines) + "\n")
    return here, fleet


def test_speedups_use_the_baseline_of_their_own_kind(files):
    _, fleet = files
    rows = with_speedups(read_results(fleet)[0])
    assert T.kinds(rows) == [rows[0]["provenance"]["device"], OTHER]
    by = {(gpu_kind(r), r["variant"], r["workload"]["seq"]): r for r in rows}
    for kind in T.kinds(rows):
        for w in WORKLOADS:
            naive, sdpa = by[(kind, "naive", w.seq)], by[(kind, "sdpa", w.seq)]
            assert sdpa["speedup"]["vs_naive"] == pytest.approx(naive["latency_ms"]["p50"] / sdpa["latency_ms"]["p50"])
    here_kind = T.kinds(rows)[0]
    for w in WORKLOADS:  # the kinds' baselines differ, so a lookup across kinds would give another number above
        assert by[(OTHER, "naive", w.seq)]["latency_ms"]["p50"] != by[(here_kind, "naive", w.seq)]["latency_ms"]["p50"]
    claims = T.headline(rows)
    assert any(c.startswith(f"{OTHER}: sdpa: speedup over naive") for c in claims)
    assert any(c.startswith(f"{here_kind}: sdpa: speedup over naive") for c in claims)


def test_the_report_shows_each_cell_on_each_kind_side_by_side(files, tmp_path: Path):
    _, fleet = files
    assert main(["report", str(fleet.parent), "--out", str(tmp_path)]) == 0
    html = (tmp_path / "report.html").read_text()
    assert "The same cell on each GPU kind (2 kinds)" in html and f"<th>{OTHER}</th>" in html
    assert "<th>GPU</th>" in html  # the table of every cell says which kind each row ran on
    md = (tmp_path / "report.md").read_text()
    section = md.split("## The same cell on each GPU kind (2 kinds)")[1].split("## Every cell")[0]
    body = [line for line in section.splitlines() if line.startswith("| sdpa") or line.startswith("| naive")]
    assert len(body) == 2 and all(line.count(" ms · ") == 2 for line in body)  # 2 cells, each with 2 kinds


def test_compare_matches_cells_per_kind(files):
    here, fleet = files
    rows_here, rows_fleet = read_results(here)[0], read_results(fleet)[0]
    same = compare(rows_fleet, rows_fleet, max_spread=1e9)
    assert len(same) == 4 and {p.kind for p in same} == set(T.kinds(rows_fleet))
    assert all(p.verdict == "same" and p.a is p.b for p in same)
    one_side = compare(rows_here, rows_fleet, max_spread=1e9)
    assert sum(p.verdict == "only-in-b" for p in one_side) == 2  # the H200 rows have no partner in A
    assert all(p.a is not None and p.b is not None for p in one_side if p.kind != OTHER)
    two_machines = compare(rows_here, read_results(here)[0], max_spread=1e9)  # single-kind files still match by key alone
    assert all(p.kind is None for p in two_machines)
