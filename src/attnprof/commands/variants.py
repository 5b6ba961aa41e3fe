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
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from rich.table import Table

    from attnprof.report.render import out

    workload, note = workload_from_args(args)
    variants = variants_from_args(args, default=("all",))
    table = Table(title=f"variants for {workload.label()} on {workload.device}", caption=note, caption_justify="left")
    for h in ("name", "stage", "status", "what it is / why not"):
        table.add_column(h, overflow="fold")
    rows = []
    for v in variants:
        s = v.supports(workload)
        rows.append({"name": v.name, "family": v.family, "accepted": s.ok,
                     "reason": None if s.ok else s.reason, "description": v.description})
        table.add_row(v.name, v.family, "accepted" if s.ok else "rejected", v.description if s.ok else s.reason,
                      style=None if s.ok else "yellow")
    out.print(table)
    emit_json(args, {"schema": "attnprof.variants/1", "workload": workload.to_json(), "variants": rows})
    return 0
