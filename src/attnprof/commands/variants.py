"""`attnprof variants`: every registered implementation, accepted or rejected (with why) for a workload here."""

from __future__ import annotations

import argparse

from attnprof.commands.common import (
    add_output_args,
    add_variants_arg,
    add_workload_args,
    emit_json,
    variants_from_args,
    workload_from_args,
)


def register(sub) -> None:
    p = sub.add_parser("variants", help="list implementations and whether each can run the workload",
                       description=__doc__)
    add_workload_args(p)
    add_variants_arg(p, "default: all")
    add_output_args(p, out=False)
    p.add_argument("--wide", action="store_true",
                   help="the descriptions and reasons in the table (default: 80 columns, the reasons below it)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    workload, note = workload_from_args(args)
    variants = variants_from_args(args, default=("all",))
    rows = []
    for v in variants:
        s = v.check(workload)
        rows.append({"name": v.name, "family": v.family, "accepted": s.ok, "reason": None if s.ok else s.reason,
                     "note": s.note if s.ok and s.note else None, "description": v.description})
    _print(rows, f"variants for {workload.label()} on {workload.device}", note, wide=args.wide)
    emit_json(args, {"schema": "attnprof.variants/1", "workload": workload.to_json(), "variants": rows})
    return 0


def _print(rows: list[dict], title: str, note: str, *, wide: bool) -> None:
    """Name, stage and verdict per variant. By default in 80 columns: what each is, cut to the room left, and the
    reasons and notes below the table; `wide`: all of it in the table."""
    from rich.markup import escape
    from rich.table import Table

    from attnprof.report.render import EDGES, GAP, WIDTH, compact_table, cut, out, say, table_width

    styles = [None if r["accepted"] else "yellow" for r in rows]
    if wide:
        table = Table(title=title, caption=note, caption_justify="left")
        for h in ("name", "stage", "status", "what it is / why not"):
            table.add_column(h, overflow="fold")
        for r, style in zip(rows, styles, strict=True):
            text = r["reason"] or "; ".join(filter(None, [r["description"], r["note"]]))
            table.add_row(*(escape(c) for c in (r["name"], r["family"], _status(r), text)), style=style)
        out.print(table)
        return
    body = [[escape(cut(r["name"], 30)), r["family"], _status(r)] for r in rows]
    room = WIDTH - table_width(["name", "stage", "status"], body) - GAP - EDGES
    body = [row + [escape(cut(r["description"], max(room, 12)))] for row, r in zip(body, rows, strict=True)]
    say(title, style="bold")
    out.print(compact_table("", ["name", "stage", "status", "what it is"], body, styles=styles))
    for r in rows:
        text = r["reason"] or r["note"]
        if text:  # most reasons name their variant already
            say(text if text.startswith(r["name"]) else f"{r['name']}: {text}", style="yellow" if r["reason"] else None)
    say(note, style="dim")


def _status(row: dict) -> str:
    return "accepted" if row["accepted"] else "rejected"
