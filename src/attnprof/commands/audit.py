"""`attnprof audit`: which SDPA backend each kind of input (or each layer of a model) really gets here, and why.

Without `--model`: the envelope grid (head dims, dtypes, masks, GQA, Sq != Sk, layouts, dropout). With
`--model PRESET|config.json`: one row per attention layer of a transformers model built from its config, on a
padded sample batch. `--require fused|flash|cudnn|efficient|cpu_flash|preferred` turns the audit into a check that
exits 1 listing the offending calls. Writes audit.md (a table for a PR) and audit.json (attnprof.audit/1).
"""

from __future__ import annotations

import argparse
import shlex
import sys

from attnprof.commands.common import add_output_args, add_variants_arg
from attnprof.errors import CheckFailed, UsageError

REQUIRE = ("fused", "flash", "cudnn", "efficient", "cpu_flash", "preferred", "measured")


def register(sub) -> None:
    p = sub.add_parser("audit", help="which SDPA backend really runs (envelope grid or a model's layers), and why",
                       description=__doc__)
    p.add_argument("--model", help="preset name or path to a config.json: audit its attention layers")
    p.add_argument("--impls", default=None, help="with --model: the implementations whose handling of the model's "
                   "softcap/window/sinks is listed (default eager,sdpa,flex_attention,kernel; a third-party kernel "
                   "by name, e.g. flash-attn-4, through the registry adapter)")
    p.add_argument("--require", help=f"fail (exit 1) unless every call ran this: {', '.join(REQUIRE)}")
    p.add_argument("--head-dims", help="grid: comma-separated head dims (default: 64,128,256,59,96,320,512 on CUDA)")
    p.add_argument("--dtypes", help="grid: comma-separated dtypes, first is the base (default bf16,fp16,fp32 on CUDA)")
    p.add_argument("--batch", type=int, default=None,
                   help="batch size of the grid cells / the model's sample batch (default 2; with --phase 1)")
    p.add_argument("--heads", type=int, default=8, help="grid: query heads")
    p.add_argument("--seq", type=int, default=None,
                   help="grid: sequence length (512 CUDA, 32 CPU); model: 64 (the prompt with --phase)")
    p.add_argument("--dtype", default=None, help="model: weights dtype (default bf16 on CUDA, fp32 on CPU)")
    p.add_argument("--crosscheck", type=int, default=0, metavar="N",
                   help="grid: also profile every N-th cell with torch.profiler and compare (1 = every cell)")
    g = p.add_argument_group("generation and measured regret (with --model)")
    g.add_argument("--phase", default=None, help="prefill, decode or prefill,decode: run a short generate under "
                   "the watcher and group the calls by call site and shape class")
    g.add_argument("--new-tokens", type=int, default=16, help="tokens to generate with --phase decode (default 16)")
    g.add_argument("--measure", action="store_true",
                   help="time each site's call on every allowed arm (first call at a new length and repeat call) "
                        "and report the regret of what ran (implies --phase prefill,decode)")
    g.add_argument("--tolerance", type=float, default=0.10,
                   help="--require measured: the regret allowed, as a fraction of the fastest arm (default 0.10)")
    g.add_argument("--pin", default=None, metavar="BACKEND|CLASS=BACKEND,...",
                   help="run the audited model's SDPA calls pinned (flash, efficient, cudnn, math), for all or per "
                        "shape class (decode=flash,prefill=cudnn): apply the fix a measured audit named")
    g.add_argument("--no-cache", action="store_true", help="measure every arm again (ignore and do not write the "
                   "per-device regret cache beside the ceilings)")
    add_variants_arg(g, "extra arms for --measure: flex, kernel, package.module:function; default none")
    p.add_argument("--wide", action="store_true",
                   help="every column in the terminal table (default: 80 columns, the reasons below the table)")
    add_output_args(p)
    p.set_defaults(handler=run)


def _ints(text: str | None, flag: str) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise UsageError(f"{flag} wants comma-separated integers, got {text!r}") from None
    if not values or min(values) <= 0:
        raise UsageError(f"{flag} wants positive integers, got {text!r}")
    return values


def run(args: argparse.Namespace) -> int:
    from attnprof.audit.envelope import grid, run_grid
    from attnprof.audit.expect import row_of, violates
    from attnprof.audit.reasons import explain
    from attnprof.commands.common import emit_json, out_dir
    from attnprof.dispatch.sdpa_checks import preferred_backend
    from attnprof.files import write_atomic, write_json
    from attnprof.provenance import provenance
    from attnprof.report.audit_report import markdown, print_terminal, rejected_row, rows_from_cells, rows_from_records
    from attnprof.report.render import err, progress
    from attnprof.workload import dtype_name, model_dtype_name, resolve_device

    if args.kernel is not None:
        from attnprof.commands.common import kernel_from_args

        kernel_from_args(args)  # a --kernel mistake is reported as such, before the device is looked at
    if args.require is not None and args.require not in REQUIRE:
        raise UsageError(f"--require {args.require!r} is not a backend rule; choose one of {', '.join(REQUIRE)}")
    if args.model and (args.seq is None or args.seq > 0):  # a prompt past max_position_embeddings: exit 2 now
        from attnprof.models import load_config
        from attnprof.validate import check_positions

        generates = args.phase is not None and "decode" in args.phase or args.phase is None and (
            args.measure or args.require == "measured")
        config = load_config(args.model)
        check_positions((args.seq or 64) + (args.new_tokens if generates else 0),
                        int(getattr(config, "max_position_embeddings", 0) or 0), args.model,
                        "--seq + --new-tokens" if generates else "--seq")
    phases = args.phase is not None or args.measure or args.require == "measured" or args.pin
    if args.impls is not None and (not args.model or phases):
        raise UsageError("--impls lists how a model's implementations handle its softcap/window/sinks: it takes "
                         "--model, without --phase, --measure or --pin (those time SDPA's arms: --variants)")
    if phases:
        from attnprof.commands.audit_phases import run_phases

        return run_phases(args)
    if args.variants is not None:
        raise UsageError("--variants adds arms to --measure (with --model); without it there is nothing to time")

    args.batch = 2 if args.batch is None else args.batch
    if args.batch <= 0 or args.heads <= 0 or (args.seq is not None and args.seq <= 0) or args.crosscheck < 0:
        raise UsageError("--batch, --heads, --seq must be positive and --crosscheck >= 0")
    device = resolve_device(args.device)
    cuda = device.startswith("cuda")
    folder = out_dir(args, "audit")
    preferred = preferred_backend(device)
    model_json = None
    if args.model:
        from attnprof.audit.model import audit_model

        dtype = model_dtype_name(args.dtype or ("bf16" if cuda else "fp32"))
        from attnprof.memory_fit import check_model_batch_fits
        from attnprof.models import load_config

        check_model_batch_fits(load_config(args.model), dtype, device, args.model, args.batch, args.seq or 64,
                               "reduce --batch or --seq")  # a bad config or a batch beyond the device: exit 2 now
        err.print(f"[dim]building {args.model} from its config (random weights), one forward of a padded "
                  f"{args.batch}x{args.seq or 64} batch[/dim]")
        audit = audit_model(args.model, device=device, dtype=dtype, batch=args.batch, seq=args.seq or 64,
                            seed=args.seed, impls=args.impls)
        records = audit.records
        rows = rows_from_records(records)
        if audit.rejected:  # the model class refused SDPA: one row that says so, in transformers' words
            rows = [rejected_row(args.model, 'attn_implementation="sdpa"', audit.rejected)]
        model_json = audit.to_json()
        title = f"{args.model} ({audit.model_type}, {audit.layers} layers, {dtype}, padded batch " \
                f"{args.batch}x{audit.seq}) on {device}"
    else:
        dtypes = tuple(dtype_name(t) for t in args.dtypes.split(",")) if args.dtypes else None
        cells = grid(device, head_dims=_ints(args.head_dims, "--head-dims"), dtypes=dtypes, batch=args.batch,
                     heads=args.heads, seq=args.seq)
        from attnprof.memory_fit import check_workload_fits

        for cell in cells:  # "needs N GiB, the device has M" before a probe allocates
            check_workload_fits(cell.workload, scores_as="SDPA's math fallback")
        with progress() as bar:
            task = bar.add_task("envelope grid", total=len(cells))
            results = run_grid(cells, seed=args.seed, crosscheck_every=args.crosscheck, folder=folder,
                               on_cell=lambda n: bar.update(task, completed=n))
        records = [r.record for r in results if r.record is not None]
        rows = rows_from_cells(results)
        title = f"SDPA envelope grid on {device}"
    command = "attnprof " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    prov = provenance(device, seed=args.seed)
    bad_rows = [r for r in rows if violates(r, args.require)] if args.require else []
    data = {"schema": "attnprof.audit/1", "provenance": prov, "mode": "model" if args.model else "grid",
            "title": title, "command": command, "device": device, "preferred": preferred, "model": model_json,
            "require": args.require, "violations": len(bad_rows), "rows": rows}
    from attnprof.stderr import captured

    data["third_party_warnings"] = captured()
    write_json(folder / "audit.json", data)
    write_atomic(folder / "audit.md", markdown(data))
    print_terminal(data, wide=args.wide)
    from attnprof.files import commit_folder

    folder = commit_folder(folder)  # complete: renamed from its temporary name
    err.print(f"report: {folder}/audit.json, audit.md")
    emit_json(args, {"schema": data["schema"], "out": str(folder), "mode": data["mode"], "preferred": preferred,
                     "calls": len(records) if args.model else len(rows), "fell_back": sum(1 for r in rows if r["fell_back"]),
                     "math": sum(1 for r in rows if r["backend"] == "math"), "require": args.require,
                     "violations": len(bad_rows), "rejected": (model_json or {}).get("rejected")})
    if args.require:
        if args.model and not records:
            why = f" ({model_json['rejected']})" if model_json.get("rejected") else ""
            raise CheckFailed(f"--require {args.require}: the model made no SDPA call at all{why}")
        if bad_rows:
            calls = [r for r in records if violates(row_of(r), args.require)]
            detail = "\n".join(e.text() for e in (explain(c) for c in calls)) if calls else ""
            errors = [f"{r['where']}: {r['error']}" for r in bad_rows if r.get("error")]
            raise CheckFailed(f"--require {args.require}: {len(bad_rows)} of {len(rows)} call(s) broke the rule\n"
                              + "\n".join(filter(None, [detail, *errors])))
    return 0

