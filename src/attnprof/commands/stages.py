"""`attnprof stages`: the tutorial's four stages (and FlexAttention) on one workload, profiled stage by stage."""

from __future__ import annotations

import argparse
import shlex
import sys

from attnprof.commands.common import (
    add_output_args,
    add_variants_arg,
    add_workload_args,
    emit_json,
    out_dir,
    variants_from_args,
    workload_from_args,
)
from attnprof.errors import CheckFailed, UsageError


def register(sub) -> None:
    p = sub.add_parser("stages", help="profile naive → in-place → SDPA → fused kernel on one workload",
                       description=__doc__)
    add_workload_args(p)
    add_variants_arg(p, "default: naive,inplace,sdpa,flex,kernel")
    add_output_args(p)
    p.add_argument("--steps", type=int, default=5, help="profiled forward steps per stage (default 5)")
    p.add_argument("--reps", type=int, default=20, help="timed calls per stage for the latency (default 20, min 20)")
    p.add_argument("--compile", action="store_true",
                   help="add the naive-compiled stage: naive attention under torch.compile, and what inductor made of it")
    p.add_argument("--wide", action="store_true",
                   help="every column in the terminal table (default: a summary that fits 80 columns)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from attnprof.files import write_atomic, write_json
    from attnprof.provenance import provenance
    from attnprof.report.render import err, progress
    from attnprof.report.stages_report import markdown, results_json
    from attnprof.report.stages_terminal import print_terminal
    from attnprof.stages import run_stages

    if args.steps < 1 or args.reps < 20:
        raise UsageError("--steps must be >= 1 and --reps >= 20 (a median of fewer runs is noise)")
    workload, note = workload_from_args(args)
    variants = variants_from_args(args)
    if args.compile and not any(v.name == "naive-compiled" for v in variants):
        from attnprof.variants import VARIANTS

        variants.append(VARIANTS["naive-compiled"])
    from attnprof.memory_fit import check_workload_fits
    from attnprof.variants.user import gqa_convention

    # up front: how k and v reach a user function when Hkv < Hq (its error repeats it if it fails on them)
    note = ". ".join([note, *filter(None, (gqa_convention(v.name, workload) for v in variants if v.family == "user"))])
    check_workload_fits(workload, variants)  # "needs N GiB, the device has M" before anything is allocated
    folder = out_dir(args, "stages")
    err.print(f"[dim]{note}[/dim]")
    from attnprof.bench.stability import Watch

    watch = Watch(workload.device)  # the reference at the start and end: was this machine steady?
    with progress() as bar:
        task = bar.add_task("stages", total=len(variants))

        def on_stage(name: str) -> None:
            bar.update(task, description=f"{name} on {workload.label()}", completed=len(done))
            done.append(name)

        done: list[str] = []
        results = run_stages(workload, variants, folder, seed=args.seed, steps=args.steps, reps=args.reps,
                             on_stage=on_stage)
        bar.update(task, completed=len(variants), description="stages done")
    command = "attnprof " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    prov = provenance(workload.device, seed=args.seed)
    machine = watch.finish()
    data = results_json(workload, results, prov, note)
    data["machine"] = machine.to_json()
    from attnprof.stderr import captured

    data["third_party_warnings"] = captured()  # what torch and friends warned, instead of printed raw
    write_json(folder / "results.json", data)
    write_atomic(folder / "report.md", markdown(results, workload.label(), note, command, prov,
                                                unreliable=machine.reason))
    print_terminal(results, workload.label(), workload.device.startswith("cuda"), wide=args.wide)
    if machine.reason:
        err.print(f"[bold yellow]{machine.reason}[/bold yellow]", highlight=False)
    from attnprof.files import commit_folder

    folder = commit_folder(folder)  # complete: renamed from its temporary name
    err.print(f"report: {folder}/results.json, report.md, traces/")
    emit_json(args, {"schema": data["schema"], "out": str(folder), "workload": data["workload"],
                     "stages": [{k: s[k] for k in ("variant", "status", "reason", "kernels_per_step", "backend",
                                                   "latency_ms", "max_rel_err")} for s in data["stages"]],
                     "machine": data["machine"]})
    failed = [r for r in results if r.status == "error"]
    if failed:
        raise CheckFailed("; ".join(f"{r.variant}: {r.reason}" for r in failed))
    return 0
