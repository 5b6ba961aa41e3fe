"""`attnprof verify`: the numerics gate. Every variant against the fp64 oracle, and a model's logits per backend.

Kernel level (default): each variant and pinned SDPA backend on a set of awkward workloads (odd lengths, head
dims that are not powers of two, GQA, Sq ≠ Sk, decode over a long key, left/right padding, fully masked rows),
on fresh random inputs (the seed is printed and recorded), judged against k × the error of plain PyTorch in the
same dtype. Model level (`--model PRESET`): logits and greedy decoding of a padded batch per attention
implementation against eager fp32. Writes verify.json (attnprof.verify/1) and verify.md to --out; exit 1 when
anything fails, after writing the report.

`--ray [ADDRESS]` runs the kernel level's cases as Ray tasks (one GPU each; a local runtime without ADDRESS, else
`auto` or host:port); each case in verify.json names the node and GPU that ran it. The model level runs here.
"""

from __future__ import annotations

import argparse
import shlex
import sys

from attnprof.commands.common import add_output_args, add_variants_arg, add_workload_args, emit_json, out_dir
from attnprof.kinds import VERIFY_VARIANTS

_WORKLOAD_FLAGS = ("batch", "heads", "kv_heads", "seq", "kv_seq", "head_dim", "causal", "mask")


def register(sub) -> None:
    p = sub.add_parser("verify", help="numerics gate: every backend vs the fp64 oracle, and a model's logits",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_workload_args(p)
    add_variants_arg(p, "default: " + ",".join(VERIFY_VARIANTS))
    add_output_args(p)
    p.set_defaults(seed=None)
    g = p.add_argument_group("gate")
    g.add_argument("--k", type=float, default=2.0, help="allowed multiple of plain PyTorch's error (default 2)")
    g.add_argument("--masked-rows", choices=("zeros", "report"), default="zeros",
                   help="rows that see no key: must be zeros (default) or only reported")
    g.add_argument("--cases", help="comma-separated subset of the default cases (see docs/verify.md)")
    g.add_argument("--kv-dtype", default=None, metavar="fp8|fp8_e5m2",
                   help="the keys and values as an FP8 KV cache (e4m3 or e5m2, power-of-two descales per batch and kv "
                        "head). Kernel level: the kernel reads it through flash_attn_with_kvcache, other variants get "
                        "it dequantised; adds what the cache costs (× a 16-bit cache's error). Model level: each "
                        "implementation once more over an FP8 cache, and what it costs the model (KL, top-1, greedy)")
    p.add_argument("--wide", action="store_true", help="every column in the terminal tables (default: 80 columns)")
    m = p.add_argument_group("model level")
    m.add_argument("--model", help="model preset (tiny-llama, tiny-qwen, llama-1b, …) or a config.json path")
    m.add_argument("--level", choices=("kernel", "model", "both"), default=None,
                   help="default: model with --model, else kernel")
    m.add_argument("--impls", help="attention implementations for the model (default: eager, sdpa, "
                                   "sdpa-flash/efficient/cudnn/math, flex_attention, kernel, plus the "
                                   "package.module:function entries of --variants; less flex_attention on a CPU "
                                   "whose torch cannot compile it inside generate, which is said)")
    m.add_argument("--model-batch", type=int, default=4)
    m.add_argument("--model-seq", type=int, default=32)
    m.add_argument("--decode-tokens", type=int, default=8, help="greedy tokens compared (default 8)")
    m.add_argument("--min-prefix", type=int, default=None,
                   help="identical greedy tokens required (default: all in fp32, not gated in bf16/fp16)")
    c = p.add_argument_group("cluster (Ray; pip install 'attnprof[cluster]')")
    c.add_argument("--ray", nargs="?", const="local", default=None, metavar="ADDRESS",
                   help="run the kernel level's cases as Ray tasks: a local runtime without ADDRESS, else auto or "
                        "host:port")
    c.add_argument("--max-retries", type=int, default=None,
                   help="with --ray: runs again of a case whose worker died (default 2)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from attnprof.bench.executor_choice import make_executor
    from attnprof.errors import UsageError

    if args.ray is not None and (args.level == "model" or (args.level is None and args.model)):
        raise UsageError("--ray fans out the kernel level; the model level runs in this process (use --level both "
                         "or drop --ray)")
    if args.ray is None and args.max_retries is not None:
        raise UsageError("--max-retries is for --ray runs; add --ray")
    retries = 2 if args.max_retries is None else args.max_retries
    executor = make_executor(args.ray, max_retries=retries) if args.ray is not None else None
    try:
        return _run(args, executor)
    finally:
        if executor is not None:
            executor.close()


def _run(args: argparse.Namespace, executor) -> int:
    import secrets

    from attnprof.commands.common import kernel_from_args
    from attnprof.errors import CheckFailed, UsageError
    from attnprof.files import write_atomic, write_json
    from attnprof.numerics.model_level import ModelRule
    from attnprof.numerics.verify import SCHEMA, dtypes_for
    from attnprof.oracle.gate import Rule
    from attnprof.provenance import provenance
    from attnprof.report.render import err
    from attnprof.report.verify_report import markdown
    from attnprof.workload import resolve_device

    kernel = kernel_from_args(args)  # both levels load the stage-four kernel from --kernel: bad syntax fails now
    if executor is not None:
        from attnprof.bench.ray_executor import cluster_device

        device = cluster_device(args.device, executor)
        executor.check(device)
    else:
        device = resolve_device(args.device)
    dtypes = dtypes_for(args.dtype, device, check=executor is None)
    level = args.level or ("model" if args.model else "kernel")
    if level != "kernel" and not args.model:
        raise UsageError(f"--level {level} needs --model PRESET")
    if args.k <= 0:
        raise UsageError("--k must be positive")
    from attnprof.workload import kv_dtype_name, model_dtype_name

    args.kv_dtype = kv_dtype_name(args.kv_dtype)
    if args.kv_dtype and "fp64" in dtypes:
        raise UsageError("--kv-dtype takes fp16, bf16 or fp32 queries (--dtype), not fp64")
    if args.kv_dtype and "fp8" in dtypes:
        raise UsageError("--dtype fp8 already quantizes the keys and values to e4m3; --kv-dtype is for an FP8 cache "
                         "under 16-bit queries")
    if args.model and level != "kernel":
        for d in dtypes:
            model_dtype_name(d)  # fp8 is a workload's dtype, not a model's: one line, before any work
    if args.model:
        from attnprof.memory_fit import check_model_fits
        from attnprof.models import load_config

        config = load_config(args.model)  # an unknown preset or an impossible config fails now, before any work
        check_model_fits(config, "fp32", device, args.model)  # the fp32 eager reference is the largest copy
    for flag, value in (("--model-batch", args.model_batch), ("--model-seq", args.model_seq),
                        ("--decode-tokens", args.decode_tokens)):
        if value < 1:
            raise UsageError(f"{flag} is {value}; it must be at least 1")
    if args.min_prefix is not None and args.min_prefix < 0:
        raise UsageError("--min-prefix must be >= 0")
    if level != "kernel":  # the sample and its greedy tokens past max_position_embeddings: exit 2 now, as serve
        from attnprof.validate import check_positions

        check_positions(args.model_seq + args.decode_tokens, int(getattr(config, "max_position_embeddings", 0) or 0),
                        args.model, "--model-seq + --decode-tokens")
    seed = args.seed if args.seed is not None else secrets.randbelow(2**31 - 10_000)
    err.print(f"[dim]seed {seed} (pass --seed {seed} to reproduce)[/dim]")
    folder = out_dir(args, "verify")
    rule = Rule(k=args.k, masked_rows=args.masked_rows)
    data: dict = {"schema": SCHEMA, "provenance": provenance(device, seed=seed), "seed": seed,
                  "rule": rule.to_json(), "kernel": None, "model": None}
    failures: list[str] = []
    if level in ("kernel", "both"):
        data["kernel"], kernel_failures = _kernel_level(args, device, dtypes, seed, rule, executor)
        failures += kernel_failures
    if level in ("model", "both"):
        model_rule = ModelRule(k=args.k, min_prefix=args.min_prefix)
        data["model_rule"] = model_rule.to_json()
        data["model"], model_failures = _model_level(args, device, dtypes, seed, model_rule, kernel)
        failures += model_failures
    data["ok"] = not failures
    data["failures"] = failures
    from attnprof.stderr import captured

    data["third_party_warnings"] = captured()  # e.g. dynamo's recompile limit: flex ran unfused from then on
    command = "attnprof " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    write_json(folder / "verify.json", data)
    write_atomic(folder / "verify.md", markdown(data, command))
    from attnprof.files import commit_folder

    folder = commit_folder(folder)  # complete: renamed from its temporary name
    err.print(f"report: {folder}/verify.json, verify.md")
    emit_json(args, {"schema": SCHEMA, "out": str(folder), "ok": data["ok"], "seed": seed, "failures": failures,
                     "kernel": {n: s["status"] for n, s in (data["kernel"] or {}).get("summary", {}).items()},
                     "model": [{k: r[k] for k in ("impl", "dtype", "status")} for r in (data["model"] or {}).get(
                         "results", [])]})
    if failures:
        raise CheckFailed(f"{len(failures)} failure(s): " + "; ".join(failures[:6])
                          + (" …" if len(failures) > 6 else "") + f" (report: {folder}/verify.md)")
    return 0


def _cases(args, device: str, dtype: str):
    """`--batch …` flags name one workload (case "given"); else the default cases, or the `--cases` subset."""
    from attnprof.commands.common import workload_from_args
    from attnprof.numerics.cases import Case
    from attnprof.numerics.verify import cases_for

    if any(getattr(args, f) is not None for f in _WORKLOAD_FLAGS):
        workload, why = workload_from_args(argparse.Namespace(**{**vars(args), "dtype": dtype}))
        from attnprof.memory_fit import check_workload_fits

        check_workload_fits(workload)
        cases = [Case("given", workload, why)]
    else:
        cases = cases_for(device, dtype, args.cases)
    kv = getattr(args, "kv_dtype", None)
    return [Case(c.name, c.workload.replace(kv_dtype=kv), c.why) for c in cases] if kv else cases


def _kernel_level(args, device: str, dtypes: list[str], seed: int, rule, executor=None):
    from attnprof.commands.common import variants_from_args
    from attnprof.numerics.verify import kernel_level
    from attnprof.report.render import err, progress
    from attnprof.report.verify_report import print_kernel_level

    variants = variants_from_args(args, VERIFY_VARIANTS)
    cases = [c for d in dtypes for c in _cases(args, device, d)]
    with progress() as bar:
        task = bar.add_task("verify", total=len(cases))
        done: list = []

        def on_case(case) -> None:
            bar.update(task, description=f"{case.name} {case.workload.dtype}", advance=0 if not done else 1)
            done.append(case)

        result = kernel_level(variants, cases, dtypes, seed=seed, rule=rule, on_case=on_case, executor=executor)
        bar.update(task, completed=len(cases), description="kernel level done")
    if result.not_verified:
        err.print(f"[dim]not verified: {', '.join(result.not_verified)} (plain PyTorch, the gate's baseline)[/dim]")
    block = {**result.to_json(), "executor": executor.name if executor is not None else "in-process"}
    print_kernel_level(block, list(result.runs), wide=args.wide)
    return block, result.failures()


def _model_level(args, device: str, dtypes: list[str], seed: int, rule, kernel):
    from attnprof.models.attention import KNOWN
    from attnprof.numerics.cannot_run import left_out
    from attnprof.numerics.verify import model_level
    from attnprof.report.render import err
    from attnprof.report.verify_report import print_model_level

    spec, dropped = args.impls, []
    if spec is None:  # the defaults, less what this torch is known not to run on this device (named, it runs)
        users = [n.strip() for n in (args.variants or "").split(",") if ":" in n]
        known, dropped = left_out(list(KNOWN), device)
        spec = ",".join([*known, *users])
        for name, why in dropped:
            err.print(f"[yellow]{name} left out of the {device} defaults: {why}; name it in --impls to run it"
                      "[/yellow]", highlight=False)
    report, failures = model_level(args.model, spec, device, dtypes, seed=seed, rule=rule, batch=args.model_batch,
                                   seq=args.model_seq, decode_tokens=args.decode_tokens, kernel=kernel,
                                   on_step=lambda s: err.print(f"[dim]model: {s}[/dim]"), kv_dtype=args.kv_dtype)
    report["left_out"] = [{"impl": name, "reason": why} for name, why in dropped]
    print_model_level(report, wide=args.wide)
    from attnprof.models.attention_features import model_features
    from attnprof.report.features_report import print_features

    report["attention_features"] = model_features(args.model, spec, device, seq=args.model_seq,
                                                  extra=args.decode_tokens, flag="--model-seq", kernel=kernel)
    print_features(report["attention_features"], wide=args.wide)
    return report, failures
