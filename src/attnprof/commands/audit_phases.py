"""`attnprof audit --model M --phase prefill,decode [--measure] [--require measured]`: the generation half of audit.

Parse and check the flags (bad input: one line, exit 2, before the model is built), record a short `generate` under
the watcher (`audit.phases`), group its calls by call site and shape class, measure each site's regret when asked
(`audit.regret`), write audit.json (attnprof.audit/1, mode "phases") and audit.md, and exit 1 when the rule the
user asked for does not hold.
"""

from __future__ import annotations

import argparse
import shlex
import sys

from attnprof.errors import CheckFailed, UsageError


def _check(args: argparse.Namespace):
    from attnprof.audit.phases import parse_phases, parse_pin
    if not args.model:
        raise UsageError("--phase, --measure, --pin and --require measured audit a model's generation: add "
                         "--model PRESET|config.json")
    if not args.tolerance > 0:
        raise UsageError(f"--tolerance must be > 0 (a fraction of the fastest arm, 0.10 = 10 %), got {args.tolerance}")
    if args.new_tokens <= 0 or (args.batch is not None and args.batch <= 0) or (args.seq is not None and args.seq <= 0):
        raise UsageError("--new-tokens, --batch and --seq must be positive")
    measure = args.measure or args.require == "measured"
    phases = parse_phases(args.phase) if args.phase is not None else ("prefill", "decode")
    if args.variants is not None and not measure:
        raise UsageError("--variants adds arms to --measure; add --measure (or --require measured)")
    return phases, parse_pin(args.pin), measure


def run_phases(args: argparse.Namespace) -> int:
    from attnprof.audit.phases import build_generator, record_phases
    from attnprof.audit.regret import Plan, fix_flag, measure
    from attnprof.commands.common import emit_json, out_dir, variants_from_args
    from attnprof.files import write_atomic, write_json
    from attnprof.provenance import provenance
    from attnprof.report.regret_report import markdown, print_terminal
    from attnprof.report.render import err, progress
    from attnprof.workload import model_dtype_name, resolve_device

    phases, pins, measured = _check(args)
    device = resolve_device(args.device)
    cuda = device.startswith("cuda")
    extra = variants_from_args(args, default=()) if args.variants else []
    folder = out_dir(args, "audit")
    dtype = model_dtype_name(args.dtype or ("bf16" if cuda else "fp32"))
    batch, prompt = args.batch or 1, args.seq or 64
    err.print(f"[dim]building {args.model} from its config (random weights); "
              + (f"generate {args.new_tokens} tokens after a {batch}x{prompt} prompt" if "decode" in phases
                 else f"one {batch}x{prompt} forward") + (f", pinned {pins}" if pins else "") + "[/dim]")
    model, refused = build_generator(args.model, device=device, dtype=dtype, seed=args.seed)
    if model is None:  # the model class refused SDPA: nothing ran, the report says why in transformers' words
        from attnprof.audit.phases import PhaseRun
        from attnprof.models import load_config

        config = load_config(args.model)
        recorded = PhaseRun(args.model, getattr(config, "model_type", "?"), config.num_hidden_layers, batch, prompt,
                            0, dtype, tuple(phases), pins, [], rejected=refused)
    else:
        recorded = record_phases(model, args.model, phases=phases, batch=batch, prompt=prompt,
                                 new_tokens=args.new_tokens, dtype=dtype, pins=pins, seed=args.seed)
    refused = recorded.rejected
    sites = recorded.sites()
    regrets = None
    if measured and sites:
        plan = Plan.for_device(device, cache=not args.no_cache)
        arm_count = 5 + len(extra)
        with progress() as bar:
            task = bar.add_task("measuring arms", total=len(sites) * arm_count)
            regrets = measure(sites, device=device, steps=recorded.new_tokens, tolerance=args.tolerance,
                              variants=extra, plan=plan, seed=args.seed,
                              on_arm=lambda what: bar.update(task, advance=1, description=what[-70:]))
    title = (f"{args.model} ({recorded.model_type}, {recorded.layers} layers, {dtype}), "
             f"{'+'.join(phases)} on {device}")
    data = {"schema": "attnprof.audit/1", "provenance": provenance(device, seed=args.seed), "mode": "phases",
            "title": title, "command": "attnprof " + " ".join(shlex.quote(a) for a in sys.argv[1:]),
            "device": device, "model": recorded.to_json(), "require": args.require, "tolerance": args.tolerance,
            "groups": [s.to_json() for s in sites], "sites": None, "rejected": refused}
    if regrets is not None:
        total = sum(r.regret_ms or 0.0 for r in regrets)
        data |= {"sites": [r.to_json() for r in regrets], "plan": vars(plan), "regret_ms": total,
                 "regret_ms_per_token": total / recorded.new_tokens if recorded.new_tokens else None,
                 "violations": sum(r.verdict != "ok" for r in regrets), "fix_flag": fix_flag(regrets)}
    bad = _broken(args.require, recorded.calls, regrets)
    data["violations"] = len(bad)
    write_json(folder / "audit.json", data)
    write_atomic(folder / "audit.md", markdown(data))
    print_terminal(data, wide=args.wide)
    from attnprof.files import commit_folder

    folder = commit_folder(folder)  # complete: renamed from its temporary name
    err.print(f"report: {folder}/audit.json, audit.md")
    emit_json(args, {"schema": data["schema"], "out": str(folder), "mode": "phases", "sites": len(sites),
                     "calls": len(recorded.calls), "require": args.require, "violations": len(bad),
                     "regret_ms_per_token": data.get("regret_ms_per_token"), "fix_flag": data.get("fix_flag"),
                     "rejected": refused})
    if args.require and not recorded.calls:
        raise CheckFailed(f"--require {args.require}: the model made no SDPA call at all"
                          + (f" ({refused})" if refused else ""))
    if bad:
        raise CheckFailed(f"--require {args.require}: {len(bad)} call site(s) broke the rule\n" + "\n".join(bad)
                          + (f"\napply the measured fix: {data['fix_flag']}" if data.get("fix_flag") else ""))
    return 0


def _broken(require: str | None, calls, regrets) -> list[str]:
    """One line per site (measured) or per distinct offending call (backend rules) that breaks `require`."""
    from attnprof.audit.expect import row_of, violates
    from attnprof.report.render import fmt

    if not require:
        return []
    if require == "measured":
        lines = []
        for r in regrets or []:
            if r.verdict == "unmeasured":
                lines.append(f"{r.site.key}: what ran could not be re-measured ({r.unmeasured})")
            elif r.verdict == "over":
                lines.append(f"{r.site.key}: ran {', '.join(r.ran)}, fastest {r.best.arm} ({r.best.backend}): regret "
                             f"{fmt(r.regret_pct, '.0f')} % > {100 * r.tolerance:.0f} %, {fmt(r.per_call_ms, '.3g')} "
                             f"ms/call, {fmt(r.per_token_ms, '.3g')} ms/token; "
                             + ("; ".join(r.fixes) or "no fix named"))
        return lines
    seen: dict[str, int] = {}
    for c in calls:
        if violates(row_of(c), require):
            label = f"{c.where}: {c.envelope()} ran {c.backend}"
            seen[label] = seen.get(label, 0) + 1
    return [f"{label} (×{n})" for label, n in seen.items()]
