"""Variants × workloads → one results row per cell, appended as each cell finishes; resumable, OOM-tolerant.

Per cell, one `run()` (attnprof.run): `supports()` first (a rejected cell is recorded with its reason and never
runs); one call to compile and warm up, the extra memory of one call (`bench.memory`), then `time_call` (device
events, warm-up, L2 flushed between reps) for p20/p50/p80. Every speed is placed against this device's measured
ceilings (`ceilings.py`): TFLOP/s as % of the matmul peak of the cell's dtype, GB/s over the minimum bytes as % of
the copy bandwidth; unknown ceilings stay unknown (null), never guessed.

A cell that runs out of memory is recorded as `oom`, one that raises (or times as NaN) as `error`, each with its
reason, and the sweep goes on. `resume=True` skips every cell whose key is already in the file. `run_cell` is a
module-level function of picklable arguments: an executor can run cells elsewhere and hand the rows back.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnprof.bench import flops as F
from attnprof.bench.ceilings import Ceilings, percent
from attnprof.bench.results import SCHEMA, append_line, read_results, rewrite_without_tail, speedups
from attnprof.bench.spec import Cell
from attnprof.errors import UsageError
from attnprof.provenance import provenance
from attnprof.run import run


@dataclass(frozen=True)
class SweepSummary:
    path: Path
    rows: list[dict[str, Any]]  # every row now in the file
    ran: int
    skipped: int
    notes: list[str]

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.rows:
            out[r["status"]] = out.get(r["status"], 0) + 1
        return out


def run_cell(cell: Cell, *, seed: int, reps: int, warmup: int, ceilings: Ceilings | None) -> dict[str, Any]:
    """Measure one cell; never raises for the cell's own failures (they are the row's status and reason)."""
    w = cell.workload
    row: dict[str, Any] = {"schema": SCHEMA, "key": cell.key, "variant": cell.variant.name,
                           "family": cell.variant.family, "workload": w.to_json(), "label": w.label(),
                           "tokens": cell.tokens, "status": "ok", "reason": None, "latency_ms": None,
                           "flops": F.flops(w), "min_bytes": F.min_bytes(w),
                           "intensity": F.flops(w) / F.min_bytes(w), "tflops": None, "gbps": None,
                           "pct_matmul_peak": None, "pct_copy_peak": None, "peak_mib": None,
                           "peak_mib_note": None}
    r = run(cell.variant, w, seed=seed, memory=True, reps=reps, warmup=warmup, l2_flush=w.device.startswith("cuda"))
    row.update(status=r.status.value, reason=r.reason)
    if not r.status.ran:
        return row
    seconds = r.timing.p50 * 1e-3
    tflops, gbps = F.tflops(w, seconds), F.gbps(w, seconds)
    row.update(latency_ms=r.timing.to_json(), tflops=tflops, gbps=gbps, peak_mib=r.peak_mib, peak_mib_note=r.peak_note,
               pct_matmul_peak=percent(tflops, ceilings.matmul(w.dtype) if ceilings else None),
               pct_copy_peak=percent(gbps, ceilings.copy_gbps if ceilings else None))
    return row


def ceilings_block(ceilings: Ceilings | None, dtype: str) -> dict[str, Any]:
    if ceilings is None:
        return {"known": False, "matmul_tflops": None, "copy_gbps": None,
                "why": "no measured ceilings for this device and software; run `attnprof ceilings`"}
    return {"known": True, "matmul_tflops": ceilings.matmul(dtype), "copy_gbps": ceilings.copy_gbps,
            "key": ceilings.key, "measured": ceilings.provenance.get("time_utc")}


def run_sweep(cells: list[Cell], path: Path, *, seed: int = 0, reps: int = 20, warmup: int = 3,
              ceilings: Ceilings | None = None, resume: bool = False,
              on_cell: Callable[[int, int, Cell, str], None] | None = None,
              argv: list[str] | None = None) -> SweepSummary:
    """Run every cell not yet in `path`, appending one row each. `on_cell(i, n, cell, phase)` reports progress."""
    path = Path(path)
    notes: list[str] = []
    rows: list[dict[str, Any]] = []
    if path.is_file() and path.stat().st_size > 0:
        if not resume:
            raise UsageError(f"{path} already holds results; add --resume to continue that sweep, "
                             "or choose another --out")
        rows, note = read_results(path)
        if note:
            notes.append(note)
            rewrite_without_tail(path, rows)
    elif resume and not path.exists():
        notes.append(f"--resume: {path} does not exist yet, starting a new sweep")
    done = {r["key"]: r for r in rows}
    todo = [c for c in cells if c.key not in done]
    skipped = len(cells) - len(todo)
    prov = None
    for i, cell in enumerate(todo):
        if on_cell:
            on_cell(i, len(todo), cell, "start")
        row = run_cell(cell, seed=seed, reps=reps, warmup=warmup, ceilings=ceilings)
        row["ceilings"] = ceilings_block(ceilings, cell.workload.dtype)
        ok = {k: r for k, r in done.items() if r.get("status") == "ok"}
        row["speedup"] = speedups(row, {**ok, row["key"]: row})
        prov = prov or provenance(cell.workload.device, seed=seed, argv=argv)
        row["provenance"] = prov
        append_line(path, row)
        done[row["key"]] = row
        rows.append(row)
        if on_cell:
            on_cell(i + 1, len(todo), cell, row["status"])
    return SweepSummary(path=path, rows=rows, ran=len(todo), skipped=skipped, notes=notes)
