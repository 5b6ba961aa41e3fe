"""`attnprof trace FILE`: what a torch.profiler trace (yours, `.json` or `.json.gz`) says about attention, per step.

Kernel counts by role, the fused-attention backends found, math-fallback signatures (GEMMs and a softmax with no
fused kernel), extra copies from out-of-place ops, masks rebuilt every step. Steps are `attnprof.step.N` ranges,
a profiler schedule's `ProfilerStep#N`, or the whole trace. A corrupt, truncated, empty, foreign or too large
file ends with one line and exit 2.
"""

from __future__ import annotations

import argparse
import re

from attnprof.commands.common import add_output_args

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?i?b?)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}


def register(sub) -> None:
    p = sub.add_parser("trace", help="read a torch.profiler trace: attention kernels per step, fallbacks, copies",
                       description=__doc__)
    p.add_argument("file", help="Kineto trace from torch.profiler (export_chrome_trace), .json or .json.gz")
    p.add_argument("--max-bytes", default="2G", help="refuse larger files (default 2G; e.g. 500M)")
    add_output_args(p)
    p.set_defaults(handler=run)


def parse_size(text: str) -> int:
    from attnprof.errors import UsageError

    m = _SIZE.match(text or "")
    if not m:
        raise UsageError(f"--max-bytes {text!r}: want a size like 2G, 500M or 1048576")
    value = float(m.group(1)) * _UNITS[(m.group(2) or "").lower()[:1]]
    if value <= 0:
        raise UsageError("--max-bytes must be positive")
    return int(value)


def run(args: argparse.Namespace) -> int:
    from attnprof.audit.tracecheck import analyze
    from attnprof.commands.common import emit_json
    from attnprof.files import write_atomic, write_json
    from attnprof.profiling.trace import load_trace
    from attnprof.provenance import provenance

    trace = load_trace(args.file, max_bytes=parse_size(args.max_bytes))
    report = analyze(trace)
    data = {"schema": "attnprof.trace/1", "provenance": provenance("cpu", seed=None), **report.to_json()}
    _print(report)
    if args.out is not None:
        from attnprof.commands.common import out_dir

        folder = out_dir(args, "trace")
        write_json(folder / "trace.json", data)
        write_atomic(folder / "trace.md", _markdown(report))
    emit_json(args, {"schema": data["schema"], "path": data["path"], "on_gpu": report.on_gpu,
                     "steps": len(report.steps), "backends": report.backends,
                     "math_fallback_steps": data["math_fallback_steps"],
                     "mask_rebuilt_every_step": report.mask_rebuilt_every_step,
                     "copies_per_step": [len(s.copies) for s in report.steps], "notes": report.notes})
    return 0


def _step_rows(report) -> list[list[str]]:
    rows = []
    for s in report.steps:
        roles = ", ".join(f"{r} {n}" for r, n in s.roles.items()) or "–"
        copies = f"{len(s.copies)}" + (f" ({', '.join(f'{k}×{v}' for k, v in s.out_of_place_ops.items())})"
                                       if s.out_of_place_ops else "")
        rows.append([s.name, str(s.kernels), roles, ", ".join(s.backends) or "none", s.math_fallback or "–",
                     copies, str(len(s.mask_builds))])
    return rows


_HEADERS = ["step", "kernels", "by role", "fused backends", "math fallback", "copies (out-of-place ops)",
            "mask builds"]


def _print(report) -> None:
    from rich.table import Table

    from attnprof.report.render import err, out

    for note in report.notes:
        err.print(f"[yellow]note:[/yellow] {note}")
    table = Table(title=f"{report.path} — {'GPU kernels' if report.on_gpu else 'CPU aten ops'} per step")
    for h in _HEADERS:
        table.add_column(h, overflow="fold")
    for row in _step_rows(report):
        if row[4] != "–":
            row[4] = f"[bold red]{row[4]}[/bold red]"
        table.add_row(*row)
    out.print(table)
    verdict = [f"backends found: {', '.join(report.backends) or 'none'}"]
    if report.mask_rebuilt_every_step:
        verdict.append("the mask is rebuilt in every step: build it once, or pass is_causal=True")
    out.print("; ".join(verdict))


def _markdown(report) -> str:
    from attnprof.report.render import md_table

    lines = [f"# Trace: {report.path}", "", *[f"> {n}" for n in report.notes], "",
             md_table(_HEADERS, _step_rows(report)), "",
             f"Backends found: {', '.join(report.backends) or 'none'}. Mask rebuilt every step: "
             f"{'yes' if report.mask_rebuilt_every_step else 'no'}."]
    return "\n".join(lines) + "\n"
