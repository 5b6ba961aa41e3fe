"""`attnprof ceilings`: measure this device's matmul rates (bf16, fp16, fp32, fp8) and copy bandwidth once, cache
them, print them.

Every other command reads the cached numbers to say "% of measured peak"; without them it says "unknown".
"""

from __future__ import annotations

import argparse

from attnprof.commands.common import add_output_args, emit_json, out_dir
from attnprof.errors import UsageError


def register(sub) -> None:
    p = sub.add_parser("ceilings", help="measure (or show the cached) matmul and copy ceilings of this device",
                       description=__doc__)
    add_output_args(p)
    p.add_argument("--remeasure", action="store_true", help="measure again even when a cached value exists")
    p.add_argument("--show", action="store_true", help="only show the cached values; measure nothing")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from rich.table import Table

    from attnprof.bench.ceilings import MATMUL_DTYPES, cache_key, cache_path, get_ceilings, measure_ceilings, store
    from attnprof.files import write_json
    from attnprof.report.render import WIDTH, err, fmt, out, say
    from attnprof.workload import resolve_device

    if args.show and args.remeasure:
        raise UsageError("--show and --remeasure contradict each other; pick one")
    device = resolve_device(args.device)
    found = None if args.remeasure else get_ceilings(device)
    source = "cached"
    if found is None and not args.show:
        folder = out_dir(args, "ceilings")
        with err.status(f"measuring the ceilings of {device} …") as status:
            found = measure_ceilings(device, progress=lambda what: status.update(f"measuring {what} on {device} …"))
        store(found)
        write_json(folder / "ceilings.json", found.to_json())
        from attnprof.files import commit_folder

        folder = commit_folder(folder)
        source = f"measured now; cached in {cache_path()}; written to {folder}/ceilings.json"
    if found is None:
        say(f"ceilings of {cache_key(device)}: unknown (never measured here; run `attnprof ceilings`)")
        emit_json(args, {"schema": "attnprof.ceilings/1", "key": cache_key(device), "known": False})
        return 0
    table = Table(title=f"measured ceilings: {found.key}", caption=source, caption_justify="left")
    for h in ("what", "measured", "how"):
        table.add_column(h, overflow="fold")
    for dtype in MATMUL_DTYPES:
        rate = found.matmul(dtype)
        note = found.method.get(dtype) if dtype in ("fp32", "fp8") else None  # TF32 on/off; how fp8 is multiplied
        how = found.method.get("matmul", "") + (f" ({note})" if note else "")
        table.add_row(f"{dtype} matmul", f"{fmt(rate, '.4g')} TFLOP/s" if rate is not None else
                      f"unknown: {found.unknown.get('matmul_' + dtype, 'not measured (--remeasure measures it)')}", how)
    table.add_row("copy bandwidth", f"{fmt(found.copy_gbps, '.4g')} GB/s" if found.copy_gbps else "unknown",
                  found.method.get("copy", ""))
    out.print(table, width=WIDTH)  # 80 columns: the "how" cells wrap
    emit_json(args, {**found.to_json(), "known": True, "source": source})
    return 0
