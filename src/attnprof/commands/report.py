"""`attnprof report DIR`: a bench folder (or results file) → PNG pictures, one self-contained HTML page, markdown."""

from __future__ import annotations

import argparse
from pathlib import Path

from attnprof.commands.common import emit_json
from attnprof.errors import UsageError


def register(sub) -> None:
    p = sub.add_parser("report", help="pictures, an HTML page and a markdown page from a bench results file",
                       description=__doc__)
    p.add_argument("source", type=Path, help="a bench folder holding results.jsonl, or the JSONL file itself")
    p.add_argument("--out", type=Path, default=None, help="where to write the report (default: next to the results)")
    p.add_argument("--json", action="store_true", help="print one machine-readable JSON line last")
    p.add_argument("--device", default="cpu", help="ignored: a report only reads files (kept for a uniform CLI)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from attnprof.bench.results import read_results, results_path, with_speedups
    from attnprof.files import read_json
    from attnprof.pause import pause_at
    from attnprof.report.html import write_report
    from attnprof.report.render import err

    if not results_path(args.source).exists():
        raise UsageError(no_bench_results(Path(args.source)))
    source = results_path(args.source)
    rows, note = read_results(source)
    if note:
        err.print(f"[yellow]{note}[/yellow]")
    if not rows:
        raise UsageError(f"{source} holds no results yet")
    folder = Path(args.out) if args.out else source.parent
    machine_file = source.with_name(source.stem + ".machine.json")  # bench's verdict on the machine, if it wrote one
    machine = read_json(machine_file, what="machine verdict") if machine_file.exists() else None
    pause_at("pictures")  # the fault tests: killed from here on, the rows stay as they are
    with err.status("drawing …"):
        paths = write_report(with_speedups(rows), folder, source.name, machine)
    err.print(f"report: {folder}/report.html (self-contained), report.md, " +
              ", ".join(p.name for p in paths if p.suffix == ".png"))
    emit_json(args, {"schema": "attnprof.report/1", "source": str(source), "out": str(folder),
                     "files": [str(p) for p in paths], "cells": len(rows)})
    return 0


def no_bench_results(source: Path) -> str:
    """Why `source` gives `report` nothing to draw, in one line: what `report` reads, what the folder is instead (the
    command whose report it holds, by its JSON's `schema`), and what to run."""
    import json

    reads = "`attnprof report` draws the results.jsonl that `attnprof bench --out DIR` writes"
    if not source.is_dir():
        return f"{source}: no such file or folder ({reads})"
    for path in sorted(source.glob("*.json")):
        try:
            schema = json.loads(path.read_text()).get("schema", "")
        except (OSError, ValueError, AttributeError):  # unreadable, not JSON, or not an object: not a report of ours
            continue
        if isinstance(schema, str) and schema.startswith("attnprof."):
            command = schema.removeprefix("attnprof.").split("/")[0]
            pages = ", ".join(p.name for p in sorted(source.glob("*.md"))) or path.name
            return (f"{source} is an `attnprof {command}` folder ({path.name}), not a bench one: {reads}; run that, "
                    f"then `attnprof report DIR` (this folder's own report is {pages})")
    return f"{source} holds no results.jsonl: {reads}; run that, then `attnprof report DIR`"
