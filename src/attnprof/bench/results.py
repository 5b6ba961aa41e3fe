"""The bench results file: JSON Lines, one cell per line, appended whole as each cell finishes.

A sweep can take an hour and be killed at any point, so the file is written line by line: each line goes out in
one `write` on an `O_APPEND` descriptor and is `fsync`ed before the next cell starts (a SIGTERM or Ctrl-C that
arrives meanwhile waits for it); a write that fails part way (a full disk) is cut back off, so a reader never sees
half a row. A process killed inside that one write can
still leave a torn last line with no newline: `read_results` drops it (and says so), and `--resume` redoes that
cell. Every row carries `schema` ("attnprof.bench/1") and its own `provenance`, whose `node` block says where the
cell ran (host, process; on Ray the node and the GPU ids it was given).

One file may span several GPU kinds (a sweep on a Ray cluster): a row's GPU kind is the device its provenance names,
and speedups compare rows of the same kind only. A row's identity in the file is its cell key plus, when the sweep
pinned cells to GPU kinds (`--accelerator-type`), that `target`: the same cell once per kind.
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from typing import Any

from attnprof.errors import UsageError
from attnprof.interrupts import critical
from attnprof.pause import armed, pause
from attnprof.validate import check_row

SCHEMA = "attnprof.bench/1"
# failed: the cell produced no row of its own (its worker died on every attempt, its node was lost): Ray sweeps only
STATUSES = ("ok", "rejected", "oom", "error", "failed")


def results_path(path: Path) -> Path:
    """A results file, or a folder holding `results.jsonl`."""
    path = Path(path)
    return path / "results.jsonl" if path.is_dir() else path


def append_line(path: Path, row: dict[str, Any]) -> None:
    """Append one JSON line whole, or not at all; a full disk is one clear UsageError. A SIGTERM or Ctrl-C waits
    until the row is on disk (`attnprof.interrupts.critical`)."""
    data = (json.dumps(row, separators=(",", ":"), default=str) + "\n").encode()
    with critical():
        _append(Path(path), data)


def start_file(path: Path) -> None:
    """Create an empty results file (and make its name durable): the sign of a sweep in its folder, rows or not."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        _sync_folder(Path(path).parent)
    except OSError as exc:
        raise UsageError(f"cannot write results file {path}: {exc.strerror or exc}") from None


def _sync_folder(folder: Path) -> None:
    """fsync a folder, so a file just created in it survives a power loss (where the OS allows it)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # a filesystem that cannot sync folders: the file's own fsync is what it offers
    finally:
        os.close(fd)


def _append(path: Path, data: bytes) -> None:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    except OSError as exc:
        raise UsageError(f"cannot write results file {path}: {exc.strerror or exc}") from None
    try:
        before = os.fstat(fd).st_size
        try:
            if armed("row-write"):  # the fault tests: half a row on disk, as a kill inside the write leaves it
                os.write(fd, data[: len(data) // 2])
                os.fsync(fd)
                pause("row-write")
                data = data[len(data) // 2:]
            written = os.write(fd, data)
            if written != len(data):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            os.fsync(fd)
            if before == 0:
                _sync_folder(path.parent)
        except OSError as exc:
            _cut_back(fd, before)
            if exc.errno == errno.ENOSPC:
                raise UsageError(f"disk full while writing {path}: no space left on device (the file keeps every "
                                 "complete row; free space and rerun with --resume)") from None
            raise UsageError(f"cannot write results file {path}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)


def _cut_back(fd: int, size: int) -> None:
    """Drop a partly written line (regular files only; a device like /dev/full has nothing to cut)."""
    try:
        if os.fstat(fd).st_size > size:
            os.ftruncate(fd, size)
    except OSError:
        pass  # not a regular file, or the disk is gone too: the reader drops a torn last line anyway


def read_results(path: Path, *, strict_tail: bool = False,
                 incomplete_note: bool = True) -> tuple[list[dict[str, Any]], str | None]:
    """Rows of a results file and a note about a dropped torn last line, or a folder marked INCOMPLETE (an
    interrupted sweep; `incomplete_note=False` for the sweep that resumes it), None if neither.

    A row of another schema, or a broken line that is not the last one, is a UsageError naming the line.
    """
    path = results_path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise UsageError(f"{path}: no such results file") from None
    except OSError as exc:
        raise UsageError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    lines = raw.split(b"\n")
    rows: list[dict[str, Any]] = []
    note = None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        last = number == len(lines)  # no newline after it: the torn tail of a killed write
        try:
            row = json.loads(line)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            if last and not strict_tail:
                note = f"{path}: dropped a torn last line ({len(line)} bytes, no newline): its cell will be redone"
                continue
            raise UsageError(f"{path}, line {number}: not a JSON row ({exc})") from None
        schema = row.get("schema") if isinstance(row, dict) else None
        if schema != SCHEMA:
            if not (isinstance(schema, str) and schema.startswith("attnprof.")):  # rows nobody's attnprof wrote
                raise UsageError(f"{path}, line {number}: not an attnprof results file (a row with "
                                 f"{'no schema' if schema is None else f'schema {schema!r}'}; `attnprof bench` "
                                 f"writes rows of schema {SCHEMA})")
            other = "another attnprof version" if schema.startswith("attnprof.bench/") else "another attnprof command"
            raise UsageError(f"{path}, line {number}: schema {schema!r} is not {SCHEMA} (a results file from {other})")
        check_row(row, f"{path}, line {number}", STATUSES)
        rows.append(row)
    from attnprof.files import INCOMPLETE

    if incomplete_note and (path.parent / INCOMPLETE).exists():
        partial = (f"{path.parent} is marked {INCOMPLETE}: its sweep was interrupted (or is running), these "
                   f"{len(rows)} rows are part of it (`attnprof bench --resume` completes it)")
        note = f"{note}; {partial}" if note else partial
    return rows, note


def rewrite_without_tail(path: Path, rows: list[dict[str, Any]]) -> None:
    """Replace the file with its complete rows only (write, then rename), before a resumed sweep appends."""
    from attnprof.files import write_atomic

    text = "".join(json.dumps(r, separators=(",", ":"), default=str) + "\n" for r in rows)
    write_atomic(path, text)


def baseline_key(row: dict[str, Any], baseline: str) -> str:
    """The key of `baseline`'s cell on this row's workload; for FP8 attention (dtype fp8, which naive and SDPA
    cannot run) their bf16 cell: FP8's activation dtype, the run FP8 replaces."""
    from attnprof.bench.spec import cell_key

    w = row["workload"]
    return cell_key(baseline, {**w, "dtype": "bf16"} if w.get("dtype") == "fp8" else w)


def gpu_kind(row: dict[str, Any]) -> str:
    """The device a row was measured on (`NVIDIA H200`, `CPU (x86_64, 2 cores)`); for a row that never ran on a
    device (failed), the GPU kind it was pinned to, else "unknown"."""
    return (row.get("provenance") or {}).get("device") or row.get("target") or "unknown"


def row_id(row: dict[str, Any]) -> str:
    """Identity of a row in its file: the cell key, plus `@target` when the sweep pinned cells to GPU kinds."""
    return f"{row['key']}@{row['target']}" if row.get("target") else row["key"]


def by_ref(rows: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    """(cell key, GPU kind) → row, over the rows that ran: what `speedups` looks baselines up in."""
    return {(r["key"], gpu_kind(r)): r for r in rows if r.get("status") == "ok"}


def speedups(row: dict[str, Any], done: dict[tuple[str, str], dict[str, Any]]) -> dict[str, float | None]:
    """p50 of `naive` (and of `sdpa`) on the same workload and GPU kind over this row's p50; None when either did not
    run. `done` is `by_ref(rows)`."""
    out: dict[str, float | None] = {}
    for base in ("naive", "sdpa"):
        ref = done.get((baseline_key(row, base), gpu_kind(row)))
        mine, theirs = _p50(row), _p50(ref) if ref else None
        out[f"vs_{base}"] = theirs / mine if mine and theirs else None
    return out


def with_speedups(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows with `speedup` recomputed over the whole file (a resumed sweep may have run the baseline later)."""
    done = by_ref(rows)
    return [{**r, "speedup": speedups(r, done)} for r in rows]


def _p50(row: dict[str, Any] | None) -> float | None:
    if not row or row.get("status") != "ok" or not row.get("latency_ms"):
        return None
    return row["latency_ms"].get("p50")
