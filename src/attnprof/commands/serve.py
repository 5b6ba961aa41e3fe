"""`attnprof serve`: does an attention gain survive a real serving loop, and what does a token cost?

Builds a decoder model from a preset (random weights, nothing downloaded), then per attention implementation
measures prefill and decode tokens/s with the attention share of each step, and serves a Poisson stream of requests
through transformers' continuous batching (TTFT, ITL). Prices every token from `--gpu-hour-price`.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from attnprof.errors import UsageError

MODES = ("prefill", "decode", "continuous")
# CPU defaults are tiny on purpose; the GPU ones are the issue's ~1B serving grid.
DEFAULTS = {
    "cpu": dict(model="tiny-llama", dtype="fp32", batch="1", context="64,128", decode_batch="1,4",
                decode_context=64, new_tokens=8, requests=8, rate=20.0, prompt_median=48, output_median=8),
    "cuda": dict(model="llama-1b", dtype="bf16", batch="1", context="1024,4096,8192", decode_batch="1,16,64",
                 decode_context=1024, new_tokens=64, requests=64, rate=16.0, prompt_median=512, output_median=128),
}


def register(sub) -> None:
    p = sub.add_parser("serve", help="prefill / decode / continuous-batching tokens/s and $ per 1M tokens",
                       description=__doc__)
    p.add_argument("--mode", default="prefill,decode,continuous",
                   help="comma-separated: prefill, decode, continuous (default: all three)")
    p.add_argument("--model", default=None, help="preset name or a config.json (default: tiny-llama on CPU, "
                                                 "llama-1b on CUDA)")
    p.add_argument("--impls", "--variants", dest="impls", default=None,
                   help="attention implementations, comma-separated: eager, sdpa, sdpa-flash|efficient|cudnn|math, "
                        "flex_attention, kernel, or package.module:function (default: eager,sdpa and the stage-four "
                        "kernel when it can run here; keep eager in: it is the baseline)")
    p.add_argument("--dtype", default=None, help="bf16, fp16, fp32 (default: bf16 on CUDA, fp32 on CPU)")
    g = p.add_argument_group("prefill and decode")
    g.add_argument("--batch", default=None, help="prefill batch sizes, comma-separated")
    g.add_argument("--context", default=None, help="prefill context lengths, comma-separated")
    g.add_argument("--decode-batch", default=None, help="decode batch sizes, comma-separated")
    g.add_argument("--decode-context", type=int, default=None, help="prompt length before decoding")
    g.add_argument("--new-tokens", type=int, default=None, help="tokens generated per row in decode (>= 2)")
    g.add_argument("--reps", type=int, default=5, help="timed prefill calls per point (median; default 5)")
    g.add_argument("--no-share", action="store_true", help="skip the profiler pass (no attention share)")
    c = p.add_argument_group("continuous batching")
    c.add_argument("--requests", type=int, default=None, help="number of requests in the stream")
    c.add_argument("--rate", type=float, default=None, help="Poisson arrival rate, requests per second")
    c.add_argument("--prompt-median", type=float, default=None, help="log-normal prompt length, median tokens")
    c.add_argument("--prompt-sigma", type=float, default=0.6, help="log-normal prompt sigma (default 0.6)")
    c.add_argument("--output-median", type=float, default=None, help="log-normal output length, median tokens")
    c.add_argument("--output-sigma", type=float, default=0.5, help="log-normal output sigma (default 0.5)")
    c.add_argument("--max-prompt", type=int, default=None, help="clip prompts to this (default 4× the median)")
    c.add_argument("--max-output", type=int, default=None, help="clip outputs to this (default 4× the median)")
    c.add_argument("--request-file", type=Path, default=None,
                   help='JSONL of {"prompt_tokens": N, "output_tokens": M, "arrival_s": T (optional)} instead')
    c.add_argument("--stream-timeout", type=float, default=120.0,
                   help="seconds before unfinished requests count as failed (default 120)")
    c.add_argument("--max-batch-tokens", type=int, default=None, help="tokens per continuous batch "
                                                                      "(default: transformers decides)")
    c.add_argument("--num-blocks", type=int, default=None, help="paged KV cache blocks (default: transformers)")
    p.add_argument("--gpu-hour-price", type=float, default=None,
                   help="USD per GPU-hour for the cost columns (default 3.50, an assumed price, not a quote)")
    p.add_argument("--stem", default="serve", help="file name stem in --out: STEM.json, STEM.md, STEM-*.png")
    from attnprof.commands.common import add_output_args

    add_output_args(p)
    p.set_defaults(handler=run)


def _ints(text: str, flag: str) -> list[int]:
    try:
        vals = [int(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"{flag} takes comma-separated whole numbers, got {text!r}") from None
    if not vals or any(v < 1 for v in vals):
        raise UsageError(f"{flag} needs numbers >= 1, got {text!r}")
    return vals


def _plan(args: argparse.Namespace, device: str) -> dict:
    """Every flag checked and defaulted before a model is built."""
    from attnprof.models import load_config
    from attnprof.serving.continuous import check_fits, load_requests, poisson_requests
    from attnprof.serving.cost import DEFAULT_GPU_HOUR_PRICE, check_price
    from attnprof.workload import dtype_name

    d = DEFAULTS["cuda" if device.startswith("cuda") else "cpu"]
    pick = lambda name: d[name] if getattr(args, name) is None else getattr(args, name)  # noqa: E731
    modes = [m.strip() for m in args.mode.split(",") if m.strip()]
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        raise UsageError(f"--mode {args.mode!r}: choose from {', '.join(MODES)}")
    price = check_price(DEFAULT_GPU_HOUR_PRICE if args.gpu_hour_price is None else args.gpu_hour_price)
    model = pick("model")
    config = load_config(model)
    max_pos = int(getattr(config, "max_position_embeddings", 0) or 0)
    plan = dict(modes=modes, model=model, config=config, dtype=dtype_name(pick("dtype")), price=price,
                price_is_default=args.gpu_hour_price is None, max_positions=max_pos)
    if args.reps < 1:
        raise UsageError(f"--reps must be >= 1, got {args.reps}")
    if "prefill" in modes:
        plan["batch"], plan["context"] = _ints(pick("batch"), "--batch"), _ints(pick("context"), "--context")
        _fits(max(plan["context"]), max_pos, model, "--context")
    if "decode" in modes:
        plan["decode_batch"] = _ints(pick("decode_batch"), "--decode-batch")
        plan["decode_context"] = _ints(pick("decode_context"), "--decode-context")[0]
        plan["new_tokens"] = _ints(pick("new_tokens"), "--new-tokens")[0]
        if plan["new_tokens"] < 2:
            raise UsageError("--new-tokens must be >= 2 (decode speed is timed between the first and last token)")
        _fits(plan["decode_context"] + plan["new_tokens"], max_pos, model, "--decode-context + --new-tokens")
    if "continuous" in modes:
        rate = pick("rate")
        if args.rate is not None and not args.rate > 0:
            raise UsageError(f"--rate must be a positive number of requests per second, got {args.rate}")
        if args.stream_timeout <= 0:
            raise UsageError(f"--stream-timeout must be positive, got {args.stream_timeout}")
        if args.request_file is not None:
            requests = load_requests(args.request_file, rate=rate, seed=args.seed)
        else:
            pm, om = pick("prompt_median"), pick("output_median")
            requests = poisson_requests(pick("requests"), rate, prompt_median=pm, prompt_sigma=args.prompt_sigma,
                                        output_median=om, output_sigma=args.output_sigma,
                                        max_prompt=args.max_prompt or int(4 * pm),
                                        max_output=args.max_output or int(4 * om), seed=args.seed)
        if max_pos:
            check_fits(requests, max_pos)
        plan["requests"], plan["rate"] = requests, rate
    return plan


def _fits(length: int, max_pos: int, model: str, flag: str) -> None:
    if max_pos and length > max_pos:
        raise UsageError(f"{flag} {length} is longer than {model} allows (max_position_embeddings {max_pos})")


def run(args: argparse.Namespace) -> int:
    from attnprof.commands.common import emit_json, out_dir
    from attnprof.files import write_atomic, write_json
    from attnprof.provenance import provenance
    from attnprof.report import serve_report
    from attnprof.report.render import err, progress
    from attnprof.serving.throughput import resolve_impls
    from attnprof.workload import resolve_device

    device = resolve_device(args.device)
    plan = _plan(args, device)
    impls = resolve_impls(args.impls, device, config=plan["config"], dtype=plan["dtype"],
                          context=max(plan.get("context") or [plan.get("decode_context") or 1024]))
    folder = out_dir(args, "serve")
    data = _measure(plan, impls, device, args, progress, err)
    data["provenance"] = provenance(device, seed=args.seed)
    data["command"] = "attnprof " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    from attnprof.serving.cost import annotate_static, annotate_stream, answer

    annotate_static(data["prefill"], "prefill", plan["price"])
    annotate_static(data["decode"], "decode", plan["price"])
    annotate_stream(data["continuous"]["results"], plan["price"])
    stream = data["continuous"]["stream"]
    data["answer"] = answer(data["prefill"], data["decode"], data["continuous"]["results"], plan["price"],
                            span_s=stream["span_s"] if stream else None)
    stem = args.stem
    pictures = serve_report.write_plots(data, folder, stem)
    data["pictures"] = [p.name for p in pictures]
    write_json(folder / f"{stem}.json", data)
    write_atomic(folder / f"{stem}.md", serve_report.markdown(data))
    serve_report.print_terminal(data)
    errors = [f"{r['impl']} {m}: {r['reason']}" for m in ("prefill", "decode") for r in data[m] if r["status"] == "error"]
    errors += [f"{r['impl']} continuous: {r['reason']}" for r in data["continuous"]["results"] if r["status"] == "error"]
    err.print(f"report: {folder}/{stem}.json, {stem}.md" + "".join(f", {p.name}" for p in pictures))
    emit_json(args, {"schema": data["schema"], "out": str(folder), "answer": data["answer"],
                     "prefill": [{k: r[k] for k in ("impl", "batch", "context", "status", "tokens_per_s",
                                                    "attention_share", "gain_over_eager")} for r in data["prefill"]],
                     "decode": [{k: r[k] for k in ("impl", "batch", "context", "status", "tokens_per_s",
                                                   "attention_share", "gain_over_eager")} for r in data["decode"]],
                     "continuous": [{k: r[k] for k in ("impl", "status", "completed", "failed", "output_tokens_per_s",
                                                       "ttft_ms", "itl_ms", "gain_over_eager")}
                                    for r in data["continuous"]["results"]]})
    if errors:
        from attnprof.errors import CheckFailed

        raise CheckFailed("; ".join(errors))
    return 0


def _measure(plan: dict, impls, device: str, args, progress, err) -> dict:
    from attnprof.models import attention_workload, build_model
    from attnprof.run import attempt
    from attnprof.serving.continuous import StreamResult, serve_stream

    modes = plan["modes"]
    cells = {"prefill": [(b, c) for c in plan.get("context", []) for b in plan.get("batch", [])],
             "decode": [(b, plan.get("decode_context")) for b in plan.get("decode_batch", [])]}
    total = sum(len(cells[m]) for m in ("prefill", "decode") if m in modes) * len(impls) + (
        len(impls) if "continuous" in modes else 0)
    err.print(f"[dim]{plan['model']} ({plan['dtype']}, random weights) on {device}; implementations: "
              f"{', '.join(i.name for i in impls)}[/dim]")
    model = build_model(plan["model"], attn_implementation="eager", dtype=plan["dtype"], device=device,
                        seed=args.seed)
    cfg = model.config
    shape = attention_workload(cfg, batch=1, seq=1, dtype=plan["dtype"], device=device)  # heads, kv heads, head dim
    data = {"schema": "attnprof.serve/1", "modes": modes,
            "model": {"name": plan["model"], "params": sum(p.numel() for p in model.parameters()),
                      "layers": cfg.num_hidden_layers, "hidden": cfg.hidden_size, "heads": shape.heads,
                      "kv_heads": shape.kv_heads, "head_dim": shape.head_dim,
                      "vocab": cfg.vocab_size, "max_positions": plan["max_positions"], "dtype": plan["dtype"],
                      "weights": "random (from config; nothing downloaded)"},
            "gpu_hour_price": plan["price"],
            "price_note": ("assumed default, not a quote; pass --gpu-hour-price" if plan["price_is_default"]
                           else "given with --gpu-hour-price"),
            "impls": [{"name": i.name, "attn_implementation": i.attn_implementation, "reason": i.rejected}
                      for i in impls],
            "prefill": [], "decode": [], "continuous": {"stream": None, "results": []}}
    with progress() as bar:
        task = bar.add_task("serve", total=total)
        for impl in impls:
            for mode in ("prefill", "decode"):
                if mode not in modes:
                    continue
                for batch, context in cells[mode]:
                    bar.update(task, description=f"{mode} {impl.name} batch {batch} context {context}")
                    point = _static_point(model, impl, mode, batch, context, plan, args, device)
                    data[mode].append(point.to_json())
                    bar.advance(task)
        if "continuous" in modes:
            reqs = plan["requests"]
            data["continuous"]["stream"] = _stream_json(plan, args)
            for impl in impls:
                bar.update(task, description=f"continuous {impl.name}: {len(reqs)} requests")
                if impl.rejected:
                    res = StreamResult(impl=impl.name, status="rejected", reason=impl.rejected, requests=len(reqs))
                else:
                    done = [0]

                    def on_done(name=impl.name, done=done):
                        done[0] += 1
                        bar.update(task, description=f"continuous {name}: {done[0]}/{len(reqs)} requests done")

                    got = attempt(lambda impl=impl, on_done=on_done: serve_stream(
                        model, impl.name, reqs, device=device, seed=args.seed, timeout_s=args.stream_timeout,
                        num_blocks=args.num_blocks, max_batch_tokens=args.max_batch_tokens, on_done=on_done),
                        device=device)  # a failure is a row with its reason; the command exits 1 after the report
                    res = got.value or StreamResult(impl=impl.name, status=got.status.value, reason=got.reason,
                                                    requests=len(reqs))
                data["continuous"]["results"].append(res.to_json())
                bar.advance(task)
    return data


def _static_point(model, impl, mode: str, batch: int, context: int, plan: dict, args, device: str):
    """One prefill or decode measurement through `run.attempt`: a failure is a row with its status and reason."""
    from attnprof.run import attempt
    from attnprof.serving.throughput import Point, measure_decode, measure_prefill

    if impl.rejected:
        return Point(impl=impl.name, mode=mode, batch=batch, context=context, status="rejected", reason=impl.rejected)

    def measure():
        model.set_attn_implementation(impl.attn_implementation)
        with impl.context():
            if mode == "prefill":
                return measure_prefill(model, impl.name, batch=batch, context=context, device=device, seed=args.seed,
                                       reps=args.reps, share=not args.no_share)
            return measure_decode(model, impl.name, batch=batch, context=context, new_tokens=plan["new_tokens"],
                                  device=device, seed=args.seed, share=not args.no_share)

    got = attempt(measure, device=device)
    if got.value is not None:
        return got.value
    return Point(impl=impl.name, mode=mode, batch=batch, context=context, status=got.status.value, reason=got.reason,
                 new_tokens=plan.get("new_tokens", 0) if mode == "decode" else 0)


def _stream_json(plan: dict, args) -> dict:
    reqs = plan["requests"]
    prompts = sorted(r.prompt_tokens for r in reqs)
    outs = sorted(r.output_tokens for r in reqs)
    return {"source": str(args.request_file) if args.request_file else "poisson", "requests": len(reqs),
            "rate_per_s": plan["rate"] if not args.request_file else None,
            "span_s": reqs[-1].arrival_s - reqs[0].arrival_s,
            "prompt_tokens": {"total": sum(prompts), "p50": prompts[len(prompts) // 2], "max": prompts[-1]},
            "output_tokens": {"total": sum(outs), "p50": outs[len(outs) // 2], "max": outs[-1]},
            "prompt_sigma": args.prompt_sigma, "output_sigma": args.output_sigma,
            "max_batch_tokens": args.max_batch_tokens, "num_blocks": args.num_blocks,
            "timeout_s": args.stream_timeout}
