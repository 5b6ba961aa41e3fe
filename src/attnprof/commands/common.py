"""What every subcommand shares: workload flags, `--device`, `--out`, `--json`, and how a report folder is made.

Handlers stay a few lines: parse → build a `Workload` → call the library → render. Heavy imports live inside the
handlers so `attnprof --help` is instant.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import sys
from pathlib import Path

from attnprof.kinds import MASK_KINDS


def add_output_args(p: argparse.ArgumentParser, *, out: bool = True) -> None:
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N (default: the best local device)")
    if out:
        p.add_argument("--out", type=Path, default=None,
                       help="report folder (default: attnprof-report/<command>-<timestamp>/)")
    p.add_argument("--json", action="store_true", help="print one machine-readable JSON line last")
    p.add_argument("--seed", type=int, default=0, help="seed for the random inputs (default 0)")


def add_variants_arg(p: argparse.ArgumentParser, default_help: str) -> None:
    """`--variants`, and `--kernel` / `--trust-remote-kernel` that say which kernel repo the `kernel` variant loads."""
    p.add_argument("--variants", default=None,
                   help=f"comma-separated registry names or package.module:function ({default_help})")
    add_kernel_args(p)


def add_kernel_args(p: argparse.ArgumentParser) -> None:
    """`--kernel` and `--trust-remote-kernel`: which kernel repo the `kernel` variant loads."""
    p.add_argument("--kernel", default=None, metavar="PATH|ORG/REPO@VERSION",
                   help="kernel repo for the `kernel` variant (default: kernels/flash-triton in this checkout)")
    p.add_argument("--trust-remote-kernel", action="store_true",
                   help="allow --kernel to load code from the Hugging Face Hub")


def kernel_from_args(args: argparse.Namespace):
    """The kernel repo `--kernel` / `--trust-remote-kernel` name (a `KernelSpec`; bad syntax is a UsageError)."""
    from attnprof.validate import check_kernel
    from attnprof.variants.kernel_hub import parse_spec

    spec = parse_spec(getattr(args, "kernel", None), getattr(args, "trust_remote_kernel", False))
    check_kernel(spec, asked=getattr(args, "kernel", None) is not None)  # before any "no CUDA device" can hide it
    return spec


def variants_from_args(args: argparse.Namespace, default: tuple[str, ...] | None = None):
    """`--variants` (else `default`, else the stages), with `kernel` loading `--kernel`; unknown names: UsageError."""
    from attnprof.variants import DEFAULT_STAGES, resolve_variants

    return resolve_variants(args.variants, default or DEFAULT_STAGES, kernel=kernel_from_args(args))


def add_workload_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("workload (defaults depend on the device; the output says which)")
    g.add_argument("--batch", type=int)
    g.add_argument("--heads", type=int, help="query heads")
    g.add_argument("--kv-heads", type=int, help="key/value heads (GQA when fewer than --heads)")
    g.add_argument("--seq", type=int, help="query length")
    g.add_argument("--kv-seq", type=int, help="key length (default: --seq)")
    g.add_argument("--head-dim", type=int)
    g.add_argument("--dtype", help="bf16, fp16, fp32, fp8 (FP8 attention: e4m3 q, k, v)")
    g.add_argument("--causal", action=argparse.BooleanOptionalAction, default=None)
    g.add_argument("--mask", choices=MASK_KINDS, default=None, help="explicit mask tensor kind (default none)")


def workload_from_args(args: argparse.Namespace):
    """The workload the flags describe (a `Workload`), and one sentence on which defaults filled the rest."""
    from attnprof.workload import check_runs_here, default_workload, resolve_device

    if getattr(args, "kernel", None) is not None:
        kernel_from_args(args)  # a --kernel mistake is reported as such, before the device is looked at
    device = resolve_device(args.device)
    base, why = default_workload(device)
    given = {
        "batch": args.batch, "heads": args.heads, "kv_heads": args.kv_heads, "seq": args.seq,
        "kv_seq": args.kv_seq, "head_dim": args.head_dim, "dtype": args.dtype, "causal": args.causal,
        "mask": args.mask,
    }
    changes = {k: v for k, v in given.items() if v is not None}
    named = sorted(k.replace("_", "-") for k in changes)  # what the user set, before derived defaults
    if "heads" in changes and "kv_heads" not in changes:
        changes["kv_heads"] = changes["heads"]
    if "seq" in changes and "kv_seq" not in changes:
        changes["kv_seq"] = changes["seq"]
    workload = base.replace(**changes)
    check_runs_here(workload)
    if named:
        why = f"{why}; overridden by flags: {', '.join(named)}"
    return workload, why


def out_dir(args: argparse.Namespace, command: str, *, keep_partial: bool = False, in_place: bool = False,
            **folder) -> Path:
    """The folder to write the report into: `--out` or `attnprof-report/<command>-<timestamp>/`, checked writable
    before work starts. It is a temporary sibling until the command ends well (see `attnprof.files.ReportFolder`):
    call `attnprof.files.commit_folder` before printing where the report is; an exit-2 path leaves nothing."""
    from attnprof.files import open_folder

    path = args.out or Path("attnprof-report") / f"{command}-{_dt.datetime.now():%Y%m%d-%H%M%S}"
    return open_folder(Path(path), keep_partial=keep_partial, in_place=in_place, **folder)


def emit_json(args: argparse.Namespace, obj: dict) -> None:
    """With --json, the last line on stdout is one JSON object."""
    if getattr(args, "json", False):
        sys.stdout.write(json.dumps(obj, separators=(",", ":"), default=str) + "\n")
        sys.stdout.flush()
