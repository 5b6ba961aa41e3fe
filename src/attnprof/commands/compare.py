"""`attnprof compare A B`: two bench result files side by side, a ratio per cell, regressions flagged.

A regression is a cell whose latency bands (p20–p80) do not overlap and whose median moved by more than
`--min-change` and by more than either run's spread ((p80 - p20) / p50), or a cell that ran in A and fails in B. A
cell whose spread in either run exceeds `--max-spread` (default 0.5) is "too noisy to judge", never a regression. `--fail-on-regression` turns any into exit 1. When either
file spans several GPU kinds (a Ray sweep), each kind is compared with itself (a GPU column says which).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from attnprof.commands.common import add_output_args, emit_json, out_dir
from attnprof.errors import CheckFailed, UsageError


def register(sub) -> None:
    p = sub.add_parser("compare", help="compare two bench result files; flag regressions beyond the spread",
                       description=__doc__)
    p.add_argument("a", type=Path, help="baseline: results.jsonl or the folder holding it")
    p.add_argument("b", type=Path, help="candidate: results.jsonl or the folder holding it")
    p.add_argument("--min-change", type=float, default=0.05,
                   help="smallest relative change of the median that counts (default 0.05 = 5%%)")
    p.add_argument("--max-spread", type=float, default=None,
                   help="a run whose (p80 - p20) / p50 exceeds this is too noisy to judge (default 0.5)")
    p.add_argument("--fail-on-regression", action="store_true", help="exit 1 when any cell regressed")
    add_output_args(p)
    p.add_argument("--wide", action="store_true", help="every column in the terminal table (default: 80 columns)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from attnprof.bench.compare import MAX_SPREAD, compare
    from attnprof.bench.results import read_results, results_path
    from attnprof.files import write_json
    from attnprof.provenance import provenance
    from attnprof.report.bench_tables import print_pairs
    from attnprof.report.render import err, out

    if not 0 <= args.min_change < 1:
        raise UsageError(f"--min-change must be in [0, 1), got {args.min_change}")
    max_spread = MAX_SPREAD if args.max_spread is None else args.max_spread
    if not max_spread > 0:  # NaN too
        raise UsageError(f"--max-spread must be positive, got {args.max_spread}")
    rows_a, note_a = read_results(args.a)
    rows_b, note_b = read_results(args.b)
    for note in (note_a, note_b):
        if note:
            err.print(f"[yellow]{note}[/yellow]")
    pairs = compare(rows_a, rows_b, min_change=args.min_change, max_spread=max_spread)
    if not any(p.a and p.b for p in pairs):
        raise UsageError(f"{results_path(args.a)} and {results_path(args.b)} share no cell (variant + workload)")
    print_pairs(pairs, results_path(args.a), results_path(args.b), rows_a, rows_b, wide=args.wide)
    regressions = [p for p in pairs if p.verdict == "regression"]
    folder = out_dir(args, "compare")
    data = {"schema": "attnprof.compare/1", "provenance": provenance("cpu", seed=None),
            "a": str(results_path(args.a)), "b": str(results_path(args.b)), "min_change": args.min_change,
            "max_spread": max_spread,
            "regressions": len(regressions), "cells": [p.to_json() for p in pairs]}
    write_json(folder / "compare.json", data)
    from attnprof.files import commit_folder

    folder = commit_folder(folder)  # complete: renamed from its temporary name
    err.print(f"compare: {folder}/compare.json")
    counts = {v: sum(p.verdict == v for p in pairs) for v in dict.fromkeys(p.verdict for p in pairs)}
    out.print(" · ".join(f"{v}: {n}" for v, n in counts.items()))
    emit_json(args, {"schema": "attnprof.compare/1", "out": str(folder), "counts": counts,
                     "regressions": [p.key for p in regressions]})
    if regressions and args.fail_on_regression:
        raise CheckFailed(f"{len(regressions)} cell(s) slower beyond the run-to-run spread: "
                          + "; ".join(f"{p.key} ({p.why})" for p in regressions[:5]))
    return 0
