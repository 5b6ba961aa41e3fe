"""Shared rendering: numbers formatted one way everywhere, rich tables for people, markdown for PRs.

Tables go to stdout; progress and notes go to stderr, so `--json`'s last stdout line stays machine-readable.
"""

from __future__ import annotations

import math
import sys
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

out = Console(soft_wrap=False, width=200 if not sys.stdout.isatty() else None)
err = Console(stderr=True)


def fmt(value, spec: str = ".3g", none: str = "–") -> str:
    if value is None:
        return none
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return "unknown" if math.isinf(value) else "nan"
    if isinstance(value, float):
        return format(value, spec)
    return str(value)


def progress() -> Progress:
    """A progress bar on stderr that says what is running."""
    return Progress(SpinnerColumn(), TextColumn("[bold]{task.description}"), BarColumn(),
                    TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn(), console=err, transient=False)


def md_escape(text: str) -> str:
    return str(text).replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


def md_table(headers: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(md_escape(h) for h in headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(md_escape(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def env_note(prov: dict[str, Any]) -> str:
    """One markdown line naming the recorded environment, or "" when nothing relevant was set."""
    env = prov.get("env") or {}
    return ("Environment: " + ", ".join(f"`{k}={v}`" for k, v in env.items()) + ".") if env else ""


# --- tables that fit 80 columns ------------------------------------------------------------------------------------

WIDTH = 80
GAP = 2  # columns apart in a SIMPLE_HEAD table without edge padding
EDGES = 2  # the box's left and right edge (a space each in SIMPLE_HEAD)


def cell_len(text: str) -> int:
    """Printed width of a cell that may hold rich markup."""
    from rich.text import Text

    try:
        return Text.from_markup(str(text)).cell_len
    except Exception:  # not markup after all (a stray "[")
        return Text(str(text)).cell_len


def cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(1, width - 1)] + "…"


def table_width(headers: list[str], rows: list[list[str]]) -> int:
    widths = [max([cell_len(h)] + [cell_len(r[i]) for r in rows]) for i, h in enumerate(headers)]
    return sum(widths) + GAP * max(0, len(widths) - 1)


def fit_columns(headers: list[str], rows: list[list[str]], keep: list[str], *, cuts: dict[str, int] | None = None,
                width: int = WIDTH) -> tuple[list[str], list[list[str]], list[str]]:
    """The columns named in `keep` (most important first; the rest are --wide's) in the order of `headers`, text cut
    per `cuts`, the least important dropped until the table is `width` wide: (headers, rows, columns left out)."""
    cuts = cuts or {}
    chosen = [h for h in keep if h in headers]

    def build(names: list[str]) -> tuple[list[str], list[list[str]]]:
        names = sorted(names, key=headers.index)
        return names, [[cut(str(r[headers.index(h)]), cuts[h]) if h in cuts else str(r[headers.index(h)])
                        for h in names] for r in rows]

    names, body = build(chosen)
    while len(chosen) > 2 and table_width(names, body) + EDGES > width:
        chosen = chosen[:-1]
        names, body = build(chosen)
    return names, body, [h for h in headers if h not in names]


def column_blocks(headers: list[str], rows: list[list[str]], *, fixed: int = 1,
                  width: int = WIDTH) -> list[tuple[list[str], list[list[str]]]]:
    """A table too wide for `width` as several tables of whole columns, each repeating the first `fixed` columns."""
    head = list(range(fixed))
    blocks, current = [], []
    for i in range(fixed, len(headers)):
        trial = head + current + [i]
        if current and table_width([headers[j] for j in trial], [[r[j] for j in trial] for r in rows]) > width:
            blocks.append(current)
            current = []
        current.append(i)
    if current or not blocks:
        blocks.append(current)
    return [([headers[j] for j in head + b], [[r[j] for j in head + b] for r in rows]) for b in blocks]


def compact_table(title: str, headers: list[str], rows: list[list[str]], *, styles: list[str | None] | None = None,
                  right: tuple[str, ...] = ()):
    """A rich table for 80 columns: no cell wraps (a number is never broken mid-digit), a simple head, no edges."""
    from rich import box
    from rich.table import Table

    table = Table(title=cut(title, WIDTH), box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True,
                  title_justify="left")
    for h in headers:
        table.add_column(h, no_wrap=True, justify="right" if h in right else "left")
    for i, row in enumerate(rows):
        table.add_row(*row, style=(styles or [None] * len(rows))[i])
    return table


def say(text: str, *, wide: bool = False, indent: str = "", style: str | None = None) -> None:
    """One sentence on stdout: as is with --wide, else wrapped to 80 columns with a hanging indent."""
    import textwrap

    lines = [text] if wide else textwrap.wrap(text, WIDTH, initial_indent=indent, subsequent_indent=indent + "  ",
                                              break_on_hyphens=False) or [""]
    for line in lines:
        out.print(line, style=style, markup=False, highlight=False)


def left_out(names: list[str], where: str = "--wide, report.md") -> None:
    if names:
        say(f"(not shown: {', '.join(names)}; see {where})", style="dim")
