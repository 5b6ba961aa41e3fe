"""`attnprof bench`: variants × workloads, each cell timed and placed against this device's measured ceilings.

The grid comes from comma-separated flags (`--seq 512,1024 --heads 16 …`) or a TOML file (`--grid sweep.toml`);
flags override the file. Each finished cell is appended to `results.jsonl` at once, so `--resume` continues an
interrupted sweep without redoing a cell; a cell that runs out of memory or is rejected is recorded with its reason.
`attnprof report DIR` turns the folder into pictures and an HTML page.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from attnprof.commands.common import add_output_args, emit_json, out_dir


def register(sub) -> None:
    p = sub.add_parser("bench", help="sweep variants × workloads against the measured ceilings (JSONL, resumable)",
                       description=__doc__)
    g = p.add_argument_group("grid (comma-separated lists; defaults depend on the device)")
    g.add_argument("--variants", help="registry names or package.module:function (GPU default: naive,inplace,"
                                      "sdpa,flex; CPU: naive,inplace,sdpa)")
    g.add_argument("--seq", help="sequence lengths, e.g. 512,1024,2048")
    g.add_argument("--batch", help="batch sizes")
    g.add_argument("--tokens", type=int, help="instead of --batch: batch = tokens // seq per cell (B·S fixed)")
    g.add_argument("--heads", help="head counts")
    g.add_argument("--head-dim", help="head dims")
    g.add_argument("--dtype", help="bf16, fp16, fp32")
    g.add_argument("--causal", action=argparse.BooleanOptionalAction, default=None)
    g.add_argument("--grid", type=Path, help="a TOML sweep file with the same keys (flags override it)")
    add_output_args(p)
    p.add_argument("--results", type=Path, help="results file (default: <out>/results.jsonl)")
    p.add_argument("--resume", action="store_true", help="continue the sweep in --out, skipping finished cells")
    p.add_argument("--reps", type=int, default=20, help="timed calls per cell (default 20, min 5)")
    p.add_argument("--warmup", type=int, default=3, help="untimed calls before timing (default 3)")
    p.add_argument("--measure-ceilings", action="store_true", help="measure the ceilings first if none are cached")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from attnprof.bench.ceilings import get_ceilings
    from attnprof.bench.results import with_speedups
    from attnprof.bench.spec import build_grid
    from attnprof.bench.sweep import run_sweep
    from attnprof.errors import UsageError
    from attnprof.report import bench_tables as T
    from attnprof.report.render import err, progress
    from attnprof.workload import resolve_device

    if args.reps < 5 or args.warmup < 0:
        raise UsageError("--reps must be >= 5 (p20/p80 of fewer are noise) and --warmup >= 0")
    if args.resume and args.out is None and args.results is None:
        raise UsageError("--resume needs --out DIR (or --results FILE) of the sweep to continue")
    device = resolve_device(args.device)
    grid = build_grid(device, file=args.grid, variants=args.variants, seq=args.seq, batch=args.batch,
                      heads=args.heads, head_dim=args.head_dim, dtype=args.dtype, causal=args.causal,
                      tokens=args.tokens)
    cells = grid.cells(device)
    path = args.results or out_dir(args, "bench") / "results.jsonl"
    ceilings = get_ceilings(device, measure=args.measure_ceilings)
    err.print(f"[dim]{T.ceilings_line([_probe(ceilings, d) for d in grid.dtype])}[/dim]")
    with progress() as bar:
        task = bar.add_task("bench", total=len(cells))

        def on_cell(i: int, n: int, cell, phase: str) -> None:
            what = f"{cell.variant.name} on {cell.workload.label()}"
            bar.update(task, completed=bar.tasks[0].completed + (phase != "start"),
                       description=what if phase == "start" else f"{what}: {phase}")

        summary = run_sweep(cells, path, seed=args.seed, reps=args.reps, warmup=args.warmup, ceilings=ceilings,
                            resume=args.resume, argv=None,
                            on_cell=on_cell)
        bar.update(task, completed=len(cells), description="bench done")
    for note in summary.notes:
        err.print(f"[yellow]{note}[/yellow]")
    rows = with_speedups(summary.rows)
    T.print_terminal(rows, device)
    counts = summary.counts()
    err.print(f"results: {path} ({summary.ran} cells run, {summary.skipped} already done; "
              + ", ".join(f"{k} {v}" for k, v in counts.items()) + f"); pictures: attnprof report {path.parent}")
    emit_json(args, {"schema": "attnprof.bench/1", "results": str(path), "ran": summary.ran,
                     "skipped": summary.skipped, "counts": counts, "claims": T.headline(rows)})
    return 0


def _probe(ceilings, dtype: str) -> dict:
    from attnprof.bench.sweep import ceilings_block

    return {"workload": {"dtype": dtype}, "ceilings": ceilings_block(ceilings, dtype)}
