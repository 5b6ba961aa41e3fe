"""`attnprof bench`: variants × workloads, each cell timed and placed against this device's measured ceilings.

The grid comes from comma-separated flags (`--seq 512,1024 --heads 16 …`) or a TOML file (`--grid sweep.toml`);
flags override the file. Each finished cell is appended to `results.jsonl` at once, so `--resume` continues an
interrupted sweep without redoing a cell; a cell that runs out of memory or is rejected is recorded with its reason.
`attnprof report DIR` turns the folder into pictures and an HTML page.

`--ray [ADDRESS]` runs each cell as a Ray task with one GPU of its own (one CPU on a CPU-only sweep): without ADDRESS
on a local runtime over this machine's GPUs, with `auto` or `host:port` on a running cluster. Rows still land in the
one file as cells finish, each naming its node and GPU; a cell whose worker dies is retried (`--max-retries`), then
recorded as `failed`. `--accelerator-type H100,A100` runs every cell once on each GPU kind (see docs/bench.md).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from attnprof.commands.common import add_output_args, emit_json, out_dir
from attnprof.errors import CheckFailed, UsageError


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
    g.add_argument("--dtype", help="bf16, fp16, fp32, fp8 (FP8 attention: e4m3 q, k, v)")
    g.add_argument("--causal", action=argparse.BooleanOptionalAction, default=None)
    g.add_argument("--grid", type=Path, help="a TOML sweep file with the same keys (flags override it)")
    add_output_args(p)
    p.add_argument("--results", type=Path, help="results file (default: <out>/results.jsonl)")
    p.add_argument("--resume", action="store_true", help="continue the sweep in --out, skipping finished cells")
    p.add_argument("--reps", type=int, default=20, help="timed calls per cell (default 20, min 5)")
    p.add_argument("--warmup", type=int, default=3, help="untimed calls before timing (default 3)")
    p.add_argument("--wide", action="store_true",
                   help="every column in the terminal table (default: a summary that fits 80 columns)")
    p.add_argument("--measure-ceilings", action="store_true", help="measure the ceilings first if none are cached")
    c = p.add_argument_group("cluster (Ray; pip install 'attnprof[cluster]')")
    c.add_argument("--ray", nargs="?", const="local", default=None, metavar="ADDRESS",
                   help="run each cell as a Ray task: a local runtime without ADDRESS, else `auto` or host:port")
    c.add_argument("--max-retries", type=int, default=None,
                   help="with --ray: runs again of a cell whose worker died (default 2), then it is `failed`")
    c.add_argument("--accelerator-type", metavar="KIND[,KIND]",
                   help="with --ray: run every cell once on each of these GPU kinds (Ray's names: H100, A100, …)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from attnprof.bench.executor_choice import make_executor
    from attnprof.bench.spec import split_list

    if args.reps < 5 or args.warmup < 0:
        raise UsageError("--reps must be >= 5 (p20/p80 of fewer are noise) and --warmup >= 0")
    if args.resume and args.out is None and args.results is None:
        raise UsageError("--resume needs --out DIR (or --results FILE) of the sweep to continue")
    kinds = split_list(args.accelerator_type, "--accelerator-type") if args.accelerator_type else []
    if args.ray is None and (kinds or args.max_retries is not None):
        raise UsageError("--accelerator-type and --max-retries are for Ray sweeps; add --ray")
    executor = make_executor(args.ray, max_retries=2 if args.max_retries is None else args.max_retries)
    try:
        return _run(args, executor, kinds)
    finally:
        executor.close()


def _run(args: argparse.Namespace, executor, kinds: list[str]) -> int:
    from attnprof.bench.ceilings import get_ceilings
    from attnprof.bench.ray_executor import cluster_device
    from attnprof.bench.results import with_speedups
    from attnprof.bench.spec import build_grid
    from attnprof.bench.sweep import run_sweep
    from attnprof.report import bench_tables as T
    from attnprof.report.render import err, progress
    from attnprof.workload import resolve_device

    on_ray = args.ray is not None
    device = cluster_device(args.device, executor) if on_ray else resolve_device(args.device)
    if kinds and not device.startswith("cuda"):
        raise UsageError("--accelerator-type picks GPU kinds: it needs --device cuda")
    if on_ray:
        executor.check(device, kinds)
    grid = build_grid(device, file=args.grid, variants=args.variants, seq=args.seq, batch=args.batch,
                      heads=args.heads, head_dim=args.head_dim, dtype=args.dtype, causal=args.causal,
                      tokens=args.tokens)
    cells = grid.cells(device)
    if not on_ray:
        from attnprof.memory_fit import check_workload_fits

        for cell in cells:  # a cell that cannot fit is named before the sweep allocates anything
            check_workload_fits(cell.workload, [cell.variant])
    path = _results_file(args)
    _check_grid(path, cells, kinds, args.resume)
    if on_ray:
        ceilings = None  # each worker looks up the ceilings of the GPU it runs on
        err.print(f"[dim]{executor.describe()}; {len(cells) * max(1, len(kinds))} task(s); ceilings looked up on each "
                  "node (`attnprof ceilings` there, or --measure-ceilings)[/dim]")
    else:
        ceilings = get_ceilings(device, measure=args.measure_ceilings)
        err.print(f"[dim]{T.ceilings_line([_probe(ceilings, d) for d in grid.dtype])}[/dim]")
    total = len(cells) * max(1, len(kinds))
    from attnprof.bench.stability import Watch

    watch = None if on_ray else Watch(device)  # the reference at the start and end: was this machine steady?
    with progress() as bar:
        task = bar.add_task("bench", total=total)

        def on_cell(i: int, n: int, cell, phase: str) -> None:
            what = f"{cell.variant.name} on {cell.workload.label()}"
            bar.update(task, completed=bar.tasks[0].completed + (phase != "start"),
                       description=what if phase == "start" else f"{what}: {phase}")

        summary = run_sweep(cells, path, seed=args.seed, reps=args.reps, warmup=args.warmup, ceilings=ceilings,
                            resume=args.resume, argv=None, on_cell=on_cell, executor=executor,
                            accelerator_types=kinds, measure_ceilings=args.measure_ceilings,
                            on_note=lambda note: err.print(f"[yellow]{note}[/yellow]"))
        bar.update(task, completed=total, description="bench done")
    machine = watch.finish() if watch is not None else None
    if machine is not None:
        from attnprof.files import write_json

        write_json(path.with_name(path.stem + ".machine.json"), machine.to_json())
    if args.results is None:
        from attnprof.files import commit_folder
        from attnprof.pause import pause_at

        pause_at("commit")  # the fault tests: every row written, the folder not yet under --out
        path = commit_folder(path.parent) / path.name  # complete: the folder under its name, INCOMPLETE gone
    rows = with_speedups(summary.rows)
    T.print_terminal(rows, f"{device} via Ray" if on_ray else device, wide=args.wide, machine=machine)
    counts = summary.counts()
    err.print(f"results: {path} ({summary.ran} cells run, {summary.skipped} already done; "
              + ", ".join(f"{k} {v}" for k, v in counts.items()) + f"); pictures: attnprof report {path.parent}")
    emit_json(args, {"schema": "attnprof.bench/1", "results": str(path), "ran": summary.ran,
                     "skipped": summary.skipped, "counts": counts,
                     "claims": T.headline(rows, machine.short if machine else None),
                     "executor": executor.name, "gpu_kinds": T.kinds(rows),
                     "machine": machine.to_json() if machine else None})
    failed = [r for r in rows if r["status"] == "error"]  # the status model: an error in what was asked → exit 1
    if failed:
        raise CheckFailed(f"{len(failed)} cell(s) failed: " + "; ".join(
            f"{r['variant']} on {r.get('label', r['key'])}: {r.get('reason')}" for r in failed[:5]))
    return 0


GRID_SCHEMA = "attnprof.bench-grid/1"
RESULTS = "results.jsonl"


def _results_file(args: argparse.Namespace) -> Path:
    """The results file this sweep appends to, its output locked for this run (a second run into it is exit 2).

    A new sweep's folder is hidden until it ends; an interrupted one keeps its rows (marked INCOMPLETE) under
    --out, and --resume appends to them in place. A SIGKILLed one leaves its hidden folder, which --resume finds
    and continues (see `attnprof.files.ReportFolder`)."""
    from attnprof.files import folder_notes, lock_output
    from attnprof.pause import pause_at
    from attnprof.report.render import err

    pause_at("open")  # the fault tests: started, nothing of the output looked at yet
    if args.results is not None:
        if args.results.is_dir():
            raise UsageError(f"--results {args.results} is a folder; name the results file (or use --out DIR)")
        notes = [lock_output(args.results).note]
        path = args.results
    else:
        work = out_dir(args, "bench", keep_partial=True, in_place=True, rows=RESULTS, resume=args.resume)
        notes, path = folder_notes(work), work / RESULTS
    for note in filter(None, notes):
        err.print(f"[yellow]{note}[/yellow]")
    return path


def grid_file(path: Path) -> Path:
    """The file beside a results file that records which grid it is a sweep of."""
    return path.with_name(path.stem + ".grid.json")


def _check_grid(path: Path, cells, kinds: list[str], resume: bool) -> None:
    """`--resume` continues the same grid only: the fingerprint of its cells is stored beside the results (a file
    written before the fingerprint existed: every row must be a cell of this grid); a different grid is one line."""
    import hashlib

    from attnprof.bench.results import read_results, row_id
    from attnprof.files import read_json, write_json

    keys = sorted({f"{c.key}@{t}" if t else c.key for c in cells for t in (kinds or [None])})
    fingerprint = hashlib.sha256("\n".join(keys).encode()).hexdigest()[:16]
    side = grid_file(path)
    has_rows = path.is_file() and path.stat().st_size > 0
    if has_rows and not resume:
        return  # the sweep refuses to overwrite it (and leaves its grid file alone)
    if resume and has_rows:
        if side.is_file():
            old = read_json(side, GRID_SCHEMA, what="bench grid file")
            if old.get("fingerprint") != fingerprint:
                raise UsageError(f"--resume: {path} is a sweep of another grid ({old.get('cells')} cells, fingerprint "
                                 f"{old.get('fingerprint')}; these flags make {len(keys)} cells, {fingerprint}); "
                                 "repeat that sweep's flags, or write to a new --out")
        else:
            rows, _ = read_results(path)
            other = sorted({row_id(r) for r in rows} - set(keys))
            if other:
                raise UsageError(f"--resume: {path} holds {len(other)} cell(s) that are not in this grid (first: "
                                 f"{other[0]}); repeat that sweep's flags, or write to a new --out")
    write_json(side, {"schema": GRID_SCHEMA, "fingerprint": fingerprint, "cells": len(keys), "keys": keys})


def _probe(ceilings, dtype: str) -> dict:
    from attnprof.bench.sweep import ceilings_block

    return {"workload": {"dtype": dtype}, "ceilings": ceilings_block(ceilings, dtype)}
