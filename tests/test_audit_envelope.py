"""The envelope grid on the CPU: every cell run for real, fallbacks explained, checked against the profiler."""

from __future__ import annotations

from attnprof.audit.envelope import Cell, crosscheck, grid, probe, run_grid
from attnprof.workload import Workload


def test_grid_covers_the_axes():
    cells = grid("cpu", head_dims=(64, 59, 320), dtypes=("fp32",), batch=1, heads=4, seq=8)
    axes = {c.axis for c in cells}
    assert axes == {"head_dim×dtype", "mask", "gqa", "seq", "layout", "dropout"}
    masks = {c.workload.mask for c in cells}
    assert masks == {"none", "bool", "additive", "pad-right", "pad-left"}
    assert any(c.workload.seq == 1 for c in cells) and any(c.last_dim_strided for c in cells)
    assert {c.workload.head_dim for c in cells} >= {59, 320}


def test_grid_on_cpu_backends_and_reasons():
    cells = grid("cpu", head_dims=(64, 59), dtypes=("fp32",), batch=1, heads=4, seq=8)
    results = run_grid(cells)
    assert all(r.status == "ok" for r in results)
    by = {(r.cell.axis, r.cell.dropout, r.cell.last_dim_strided): r for r in results}
    drop = by[("dropout", 0.1, False)]
    strided = by[("layout", 0.0, True)]
    for r in (drop, strided):
        assert r.backend == "math" and r.fell_back and r.refusals["cpu_flash"] and r.advice
    assert "dropout" in drop.refusals["cpu_flash"] and "contiguous" in strided.refusals["cpu_flash"]
    fused = [r for r in results if r not in (drop, strided)]
    assert all(r.backend == "cpu_flash" and not r.refusals for r in fused)


def test_crosscheck_agrees_with_the_profiler(tmp_path):
    base = Workload(batch=1, heads=2, seq=8, head_dim=16)
    fused = crosscheck(probe(Cell("mask", base)), tmp_path)
    math = crosscheck(probe(Cell("dropout", base, dropout=0.2)), tmp_path)
    assert fused.profiler_backend == fused.backend == "cpu_flash" and fused.agrees
    assert math.profiler_backend == math.backend == "math" and math.agrees
