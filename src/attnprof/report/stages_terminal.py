"""`attnprof stages` in the terminal: a summary that fits 80 columns, details below it; `--wide` for every column.

The compact table keeps what a person compares across stages (status, kernels per step, latency, GPU time on a
GPU, error vs fp64, backend); CPU time, TFLOP/s, peak memory and the p20–p80 spread are in `--wide`, report.md
and results.json. Rejected stages give their reason below the table, not in a column. Each stage's kernels follow,
one line each (short name, role, launching op), then the causes, the lossy marker and SDPA fallbacks. The
workload note is printed once, by the command, before the work starts.
"""

from __future__ import annotations

import textwrap

from rich import box
from rich.table import Table

from attnprof.report.render import fmt, out
from attnprof.report.stages_report import (
    HEADERS,
    deltas,
    dispatch_lines,
    kernel_lines,
    lossy_line,
    ran,
    status_text,
    wide_row,
)
from attnprof.stages import StageResult

WIDTH = 80


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _say(text: str, *, wide: bool, indent: str = "  ", style: str | None = None) -> None:
    """One sentence: as is with --wide, else wrapped to 80 columns with a hanging indent."""
    lines = [text] if wide else textwrap.wrap(text, WIDTH, initial_indent=indent, subsequent_indent=indent + "  ")
    for line in lines:
        out.print(line if wide else line, style=style, markup=False, highlight=False)


def compact_rows(results: list[StageResult], on_gpu: bool) -> tuple[list[str], list[list[str]]]:
    headers = ["stage", "status", "kernels", "p50 ms"] + (["GPU ms"] if on_gpu else []) + ["err/fp64", "backend"]
    rows = []
    for r in results:
        if not ran(r):
            rows.append([_cut(r.variant, 14), str(r.status.value)] + [""] * (len(headers) - 2))
            continue
        s = r.summary
        row = [_cut(r.variant, 14), status_text(r), fmt(s.kernels_per_step, "g"), f"{r.timing.p50:.4g}"]
        if on_gpu:
            row.append(fmt(s.gpu_ms_per_step, ".4g"))
        row += [fmt(r.max_rel_err, ".1e"), _cut(r.backend or "–", 13)]
        rows.append(row)
    return headers, rows


def print_terminal(results: list[StageResult], workload_label: str, on_gpu: bool, *, wide: bool = False) -> None:
    if wide:
        headers, rows = HEADERS, [wide_row(r) for r in results]
    else:
        headers, rows = compact_rows(results, on_gpu)
    table = Table(title=_cut(f"attnprof stages — {workload_label}", WIDTH), box=box.SIMPLE_HEAD, pad_edge=False,
                  collapse_padding=True)
    for h in headers:
        table.add_column(h, overflow="fold", no_wrap=not wide)
    for r, row in zip(results, rows, strict=True):
        table.add_row(*row, style=None if r.status == "ok" else "yellow")
    out.print(table)
    for r in results:
        if not ran(r):
            _say(f"{r.variant} {r.status.value}: {r.reason or 'no reason given'}", wide=wide, indent="",
                 style="yellow")
    unit = "kernel" if on_gpu else "aten op"
    name_width = 80 if wide else 30
    for r in results:
        if not ran(r):
            continue
        out.print(f"\n[bold]{r.variant}[/bold]: {fmt(r.summary.kernels_per_step, 'g')} {unit}s per step")
        for per, role, us, name, op in kernel_lines(r, width=name_width):
            if not wide:
                op = op.split(" → ")[0]  # the op the code called; the whole chain is in results.json
            line = f"  {per:>3}× {_cut(role, 16):<16} {us:>8}µs  {name:<{name_width}} ← {op}"
            out.print(line if wide else _cut(line, WIDTH), markup=False, highlight=False)
        for note_line in [lossy_line(r), *r.unexpected]:
            if note_line:
                _say(f"! {note_line}", wide=wide, style="yellow")
        for line in dispatch_lines(r):
            _say(f"! {line}" if not line.startswith("  ") else f"  {line.strip()}", wide=wide, style="red")
    lines = deltas(results)
    if lines:
        out.print("\n[bold]Stage to stage[/bold]")
        for line in lines:
            _say(line, wide=wide)
