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
from attnprof.errors import UsageError

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?i?b?)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}


def register(sub) -> None:
    p = sub.add_parser("trace", help="read a torch.profiler trace: attention kernels per step, fallbacks, copies",
                       description=__doc__)
    p.add_argument("file", help="Kineto trace from torch.profiler (export_chrome_trace), .json or .json.gz")
    p.add_argument("--max-bytes", default="2G", help="refuse larger files (default 2G; e.g. 500M)")
    add_output_args(p)
    p.add_argument("--wide", action="store_true", help="every column in the terminal table (default: 80 columns)")
    p.set_defaults(handler=run)


def parse_size(text: str) -> int:
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
    from attnprof.report.trace_report import markdown, print_terminal

    trace = load_trace(args.file, max_bytes=parse_size(args.max_bytes))
    report = analyze(trace)
    data = {"schema": "attnprof.trace/1", "provenance": provenance("cpu", seed=None), **report.to_json()}
    print_terminal(report, wide=args.wide)
    if args.out is not None:
        from attnprof.commands.common import out_dir

        folder = out_dir(args, "trace")
        write_json(folder / "trace.json", data)
        write_atomic(folder / "trace.md", markdown(report))
    emit_json(args, {"schema": data["schema"], "path": data["path"], "on_gpu": report.on_gpu,
                     "steps": len(report.steps), "backends": report.backends,
                     "math_fallback_steps": data["math_fallback_steps"],
                     "mask_rebuilt_every_step": report.mask_rebuilt_every_step,
                     "copies_per_step": [len(s.copies) for s in report.steps], "notes": report.notes})
    return 0
