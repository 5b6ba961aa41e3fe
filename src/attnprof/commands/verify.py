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

# Every backend one could roll out; naive/inplace are the baseline itself (plain PyTorch), the oracle is the oracle.
DEFAULT_VARIANTS = ("sdpa", "sdpa-flash", "sdpa-efficient", "sdpa-cudnn", "sdpa-math", "flex", "kernel")
_WORKLOAD_FLAGS = ("batch", "heads", "kv_heads", "seq", "kv_seq", "head_dim", "causal", "mask")


def register(sub) -> None:
    p = sub.add_parser("verify", help="numerics gate: every backend vs the fp64 oracle, and a model's logits",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_workload_args(p)
    add_variants_arg(p, "default: " + ",".join(DEFAULT_VARIANTS))
    add_output_args(p)
    p.set_defaults(seed=None)
    g = p.add_argument_group("gate")
    g.add_argument("--k", type=float, default=2.0, help="allowed multiple of plain PyTorch's error (default 2)")
    g.add_argument("--masked-rows", choices=("zeros", "report"), default="zeros",
                   help="rows that see no key: must be zeros (default) or only reported")
    g.add_argument("--cases", help="comma-separated subset of the default cases (see docs/verify.md)")
    m = p.add_argument_group("model level")
    m.add_argument("--model", help="model preset (tiny-llama, tiny-qwen, llama-1b, …) or a config.json path")
    m.add_argument("--level", choices=("kernel", "model", "both"), default=None,
                   help="default: model with --model, else kernel")
    m.add_argument("--impls", help="attention implementations for the model (default: eager, sdpa, "
                                   "sdpa-flash/efficient/cudnn/math, flex_attention, kernel, plus the "
                                   "package.module:function entries of --variants)")
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
    from attnprof.bench.executor import make_executor
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

    from attnprof.errors import CheckFailed, UsageError
    from attnprof.numerics.gate import Rule
    from attnprof.numerics.model import ModelRule
    from attnprof.numerics.report import SCHEMA, markdown
    from attnprof.report.records import provenance, write_atomic, write_json
    from attnprof.report.render import err
    from attnprof.variants.kernel_hub import configure
    from attnprof.workload import resolve_device

    configure(args.kernel, args.trust_remote_kernel)  # both levels load the stage-four kernel from --kernel

    if executor is not None:
        from attnprof.bench.ray_executor import cluster_device

        device = cluster_device(args.device, executor)
        executor.check(device)
    else:
        device = resolve_device(args.device)
    dtypes = _dtypes(args, device, check=executor is None)
    level = args.level or ("model" if args.model else "kernel")
    if level != "kernel" and not args.model:
        raise UsageError(f"--level {level} needs --model PRESET")
    if args.k <= 0:
        raise UsageError("--k must be positive")
    if args.model:
        from attnprof.serving.models import load_config

        load_config(args.model)  # an unknown preset fails now, before any work
    seed = args.seed if args.seed is not None else secrets.randbelow(2**31 - 10_000)
    err.print(f"[dim]seed {seed} (pass --seed {seed} to reproduce)[/dim]")
    folder = out_dir(args, "verify")
    data: dict = {"schema": SCHEMA, "provenance": provenance(device, seed=seed), "seed": seed,
                  "rule": Rule(k=args.k, masked_rows=args.masked_rows).to_json(), "kernel": None, "model": None}
    failures: list[str] = []
    if level in ("kernel", "both"):
        data["kernel"], kernel_failures = _kernel_level(args, device, dtypes, seed, executor)
        failures += kernel_failures
    if level in ("model", "both"):
        rule = ModelRule(k=args.k, min_prefix=args.min_prefix)
        data["model_rule"] = rule.to_json()
        data["model"], model_failures = _model_level(args, device, dtypes, seed, rule)
        failures += model_failures
    data["ok"] = not failures
    data["failures"] = failures
    command = "attnprof " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    write_json(folder / "verify.json", data)
    write_atomic(folder / "verify.md", markdown(data, command))
    err.print(f"report: {folder}/verify.json, verify.md")
    emit_json(args, {"schema": SCHEMA, "out": str(folder), "ok": data["ok"], "seed": seed, "failures": failures,
                     "kernel": {n: s["status"] for n, s in (data["kernel"] or {}).get("summary", {}).items()},
                     "model": [{k: r[k] for k in ("impl", "dtype", "status")} for r in (data["model"] or {}).get(
                         "results", [])]})
    if failures:
        raise CheckFailed(f"{len(failures)} failure(s): " + "; ".join(failures[:6])
                          + (" …" if len(failures) > 6 else "") + f" (report: {folder}/verify.md)")
    return 0


def _dtypes(args, device: str, check: bool = True) -> list[str]:
    from attnprof.commands.common import _check_dtype_runs
    from attnprof.workload import Workload, dtype_name

    if args.dtype:
        names = [dtype_name(d.strip()) for d in args.dtype.split(",") if d.strip()]
    else:
        names = ["bf16", "fp16"] if device.startswith("cuda") else ["fp32", "bf16"]
    for d in names if check else ():  # on a cluster the GPUs are elsewhere: this machine cannot tell
        _check_dtype_runs(Workload(dtype=d, device=device))
    return list(dict.fromkeys(names))


def _cases(args, device: str, dtype: str):
    from attnprof.commands.common import workload_from_args
    from attnprof.errors import UsageError
    from attnprof.numerics.cases import Case, default_cases

    if any(getattr(args, f) is not None for f in _WORKLOAD_FLAGS):
        one = argparse.Namespace(**{**vars(args), "dtype": dtype})
        workload, why = workload_from_args(one)
        return [Case("given", workload, why)]
    cases = default_cases(device, dtype)
    if args.cases:
        wanted = [c.strip() for c in args.cases.split(",") if c.strip()]
        known = [c.name for c in cases]
        bad = [c for c in wanted if c not in known]
        if bad:
            raise UsageError(f"unknown case {bad[0]!r}; cases: {', '.join(known)}")
        cases = [c for c in cases if c.name in wanted]
    return cases


def _kernel_level(args, device: str, dtypes: list[str], seed: int, executor=None):
    from rich.console import Group
    from rich.markup import escape

    from attnprof.numerics.gate import Rule
    from attnprof.numerics.kernel import verify_kernels
    from attnprof.numerics.report import kernel_table, variant_summary
    from attnprof.report.render import out, progress
    from attnprof.variants import resolve_variants

    variants = resolve_variants(args.variants, default=DEFAULT_VARIANTS)
    cases = [c for d in dtypes for c in _cases(args, device, d)]
    rule = Rule(k=args.k, masked_rows=args.masked_rows)
    with progress() as bar:
        task = bar.add_task("verify", total=len(cases))

        def on_case(case) -> None:
            bar.update(task, description=f"{case.name} {case.workload.dtype}", advance=0 if not done else 1)
            done.append(case)

        done: list = []
        runs = verify_kernels(variants, cases, seed=seed, rule=rule, on_case=on_case, executor=executor,
                              kernel=(args.kernel, args.trust_remote_kernel))
        bar.update(task, completed=len(cases), description="kernel level done")
    summary = variant_summary(runs)
    out.print(Group(*(kernel_table(runs, d) for d in dtypes)))
    for name, s in summary.items():
        if s["status"] == "fail":
            f = s["failures"][0]
            out.print(f"[red]✗ {escape(name)}[/red] ({s['fail'] + s['error']} case(s)); first: {f['case']} "
                      f"{f['dtype']}: {escape(f['reason'] or '')}"
                      + (f"\n    [yellow]{escape(f['hint'])}[/yellow]" if f["hint"] else ""))
        elif s["rejections"] and not s["pass"]:
            out.print(f"[dim]– {escape(name)} rejected: {escape(s['rejections'][0]['reason'] or '')}[/dim]")
    failures = [f"{n} ({s['failures'][0]['case']} {s['failures'][0]['dtype']}: "
                f"{(s['failures'][0]['hint'] or s['failures'][0]['reason'] or '')[:160]})"
                for n, s in summary.items() if s["status"] == "fail"]
    return ({"dtypes": dtypes, "variants": [v.name for v in variants], "cases": [r.to_json() for r in runs],
             "summary": summary, "executor": executor.name if executor is not None else "in-process"}, failures)


def _model_level(args, device: str, dtypes: list[str], seed: int, rule):
    from attnprof.numerics.model import attention_workload, verify_model
    from attnprof.numerics.report import model_table
    from attnprof.report.render import err, out
    from attnprof.serving.attention import resolve_impls

    spec = args.impls
    if spec is None:
        from attnprof.serving.attention import KNOWN

        users = [n.strip() for n in (args.variants or "").split(",") if ":" in n]
        spec = ",".join([*KNOWN, *users])

    def impls(dtype, config):
        w = attention_workload(config, batch=args.model_batch, seq=args.model_seq, dtype=dtype, device=device)
        return resolve_impls(spec, device, workload=w)

    resolve_impls(spec, device)  # unknown names and bad user functions fail before the model is built
    report = verify_model(args.model, impls, dtypes, device=device, seed=seed, batch=args.model_batch,
                          seq=args.model_seq, decode_tokens=args.decode_tokens, rule=rule,
                          on_step=lambda s: err.print(f"[dim]model: {s}[/dim]"))
    report.pop("_results")
    out.print(model_table(report))
    failures = [f"{r['impl']} {r['dtype']} on {args.model}: {r['reason']}" for r in report["results"]
                if r["status"] in ("fail", "error")]
    return report, failures
