"""Variants × workloads → one results row per cell, appended as each cell finishes; resumable, OOM-tolerant.

Per cell, one `run()` (attnprof.run): `supports()` first (a rejected cell is recorded with its reason and never
runs); one call to compile and warm up, the extra memory of one call (`measure.memory`), then `time_call` (device
events, warm-up, L2 flushed between reps) for p20/p50/p80. Every speed is placed against this device's measured
ceilings (`ceilings.py`): TFLOP/s as % of the matmul peak of the cell's dtype, GB/s over the minimum bytes as % of
the copy bandwidth; unknown ceilings stay unknown (null), never guessed.

A cell that runs out of memory is recorded as `oom`, one that raises (or times as NaN) as `error`, each with its
reason, and the sweep goes on. `resume=True` skips every cell whose key is already in the file.

Who runs the cells is an executor's business (`bench/executor.py`): in this process by default, or as Ray tasks
across a cluster. The sweep decides the cells and stays the one writer: `CellRunner` (module-level, picklable) runs
one cell where the executor puts it and returns its row with the ceilings and provenance of the machine that
measured it; rows come back in completion order and are appended here. A cell whose worker died on every attempt
becomes a `failed` row with the reason; `--resume` runs those cells again and skips every other finished one.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from attnprof.bench import flops as F
from attnprof.bench.ceilings import Ceilings, get_ceilings, percent
from attnprof.bench.executor import Executor, InProcess, Job
from attnprof.bench.results import (
    SCHEMA,
    append_line,
    by_ref,
    read_results,
    rewrite_without_tail,
    row_id,
    speedups,
    start_file,
)
from attnprof.bench.spec import Cell
from attnprof.errors import UsageError
from attnprof.provenance import provenance
from attnprof.run import run
from attnprof.variants.base import Rejected


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


@dataclass(frozen=True)
class CellRunner:
    """What every cell of one sweep shares. Called where the cell runs (this process or a Ray worker), so a row's
    ceilings and provenance are those of the machine that measured it. `node_ceilings`: look the ceilings up (and,
    with `measure_ceilings`, measure them once when none are cached) on that machine instead of using `ceilings`."""

    seed: int
    reps: int
    warmup: int
    argv: tuple[str, ...]  # the command line of the driver: a worker's own sys.argv is Ray's
    ceilings: Ceilings | None = None
    node_ceilings: bool = False
    measure_ceilings: bool = False

    def __call__(self, cell: Cell) -> dict[str, Any]:
        device = cell.workload.device
        ceilings = self.ceilings
        if self.node_ceilings:
            ceilings = get_ceilings(device) or (get_ceilings(device, measure=True) if self.measure_ceilings else None)
        row = run_cell(cell, seed=self.seed, reps=self.reps, warmup=self.warmup, ceilings=ceilings)
        row["ceilings"] = ceilings_block(ceilings, cell.workload.dtype)
        row["provenance"] = provenance(device, seed=self.seed, argv=list(self.argv))
        return row


def failed_row(cell: Cell, reason: str, runner: CellRunner, target: str | None) -> dict[str, Any]:
    """The row of a cell that produced none (its worker died on every attempt): `run_cell`'s own row, refused before
    anything runs so every field a reader expects is there, then marked `failed` with the executor's reason."""
    refused = replace(cell, variant=replace(cell.variant, supports=lambda _w: Rejected(reason)))
    row = run_cell(refused, seed=runner.seed, reps=runner.reps, warmup=runner.warmup, ceilings=None)
    row.update(status="failed", reason=reason, ceilings=ceilings_block(None, cell.workload.dtype))
    prov = provenance("cpu", seed=runner.seed, argv=list(runner.argv))  # the driver's: the worker left none
    row["provenance"] = {**prov, "device": target, "device_kind": None}
    return row


def _previous_rows(path: Path, resume: bool, notes: list[str]) -> list[dict[str, Any]]:
    """The rows a resumed sweep keeps: complete lines, without `failed` rows (those cells run again)."""
    if not (path.is_file() and path.stat().st_size > 0):
        if resume and not path.exists():
            notes.append(f"--resume: {path} does not exist yet, starting a new sweep")
        return []
    if not resume:
        raise UsageError(f"{path} already holds results; add --resume to continue that sweep, or choose another --out")
    rows, note = read_results(path, incomplete_note=False)  # resuming it is what INCOMPLETE asks for
    kept = [r for r in rows if r.get("status") != "failed"]
    if note:
        notes.append(note)
    if len(kept) < len(rows):
        notes.append(f"--resume: {len(rows) - len(kept)} cell(s) recorded as failed run again")
    if note or len(kept) < len(rows):
        rewrite_without_tail(path, kept)
    return kept


def run_sweep(cells: list[Cell], path: Path, *, seed: int = 0, reps: int = 20, warmup: int = 3,
              ceilings: Ceilings | None = None, resume: bool = False,
              on_cell: Callable[[int, int, Cell, str], None] | None = None,
              argv: list[str] | None = None, executor: Executor | None = None,
              accelerator_types: Sequence[str] = (), measure_ceilings: bool = False,
              on_note: Callable[[str], None] | None = None) -> SweepSummary:
    """Run every cell not yet in `path`, appending one row each. `on_cell(i, n, cell, phase)` reports progress;
    `on_note(text)` hears what resuming found (a torn last line dropped, failed cells to redo) before any cell runs.

    `executor` runs the cells (default: in this process, against `ceilings`); any other executor looks the ceilings
    up where each cell runs. `accelerator_types` runs every cell once on each of those GPU kinds (Ray only).
    """
    path = Path(path)
    executor = executor or InProcess()
    local = isinstance(executor, InProcess)
    if accelerator_types and local:
        raise UsageError("--accelerator-type pins cells to GPU kinds of a Ray cluster; it needs --ray")
    notes: list[str] = []
    rows = _previous_rows(path, resume, notes)
    for note in notes if on_note else ():
        on_note(note)
    if not path.exists():
        start_file(path)  # a sweep killed before its first row still leaves a folder `--resume` recognises
    done = {row_id(r): r for r in rows}
    targets: Sequence[str | None] = tuple(dict.fromkeys(accelerator_types)) or (None,)
    todo = [(c, t) for c in cells for t in targets
            if (f"{c.key}@{t}" if t else c.key) not in done]
    runner = CellRunner(seed=seed, reps=reps, warmup=warmup, argv=tuple(sys.argv if argv is None else argv),
                        ceilings=ceilings if local else None, node_ceilings=not local,
                        measure_ceilings=measure_ceilings)
    jobs = [Job(i, cell, cell.workload.device, f"{cell.variant.name} on {cell.workload.label()}", target)
            for i, (cell, target) in enumerate(todo)]
    n = len(jobs)

    def started(job: Job) -> None:
        if on_cell:
            on_cell(job.index, n, job.payload, "start")

    outcomes = executor.run(runner, jobs, on_start=started)
    finished = 0
    try:
        for outcome in outcomes:
            cell, target = outcome.job.payload, outcome.job.accelerator_type
            row = outcome.value if outcome.failure is None else failed_row(cell, outcome.failure, runner, target)
            row["target"] = target
            row["provenance"]["node"] = outcome.node
            ok = by_ref(list(done.values()) + [row])
            row["speedup"] = speedups(row, ok)
            append_line(path, row)
            done[row_id(row)] = row
            rows.append(row)
            finished += 1
            if on_cell:
                on_cell(finished, n, cell, row["status"])
    finally:
        outcomes.close()  # on an exception or Ctrl-C: cancel what has not finished
    return SweepSummary(path=path, rows=rows, ran=n, skipped=len(cells) * len(targets) - n, notes=notes)
