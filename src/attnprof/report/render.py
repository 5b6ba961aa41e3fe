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
