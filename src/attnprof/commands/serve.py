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
    p.add_argument("--loop", default="as-shipped,production",
                   help="serving loops, comma-separated: as-shipped (transformers' defaults: dynamic cache, continuous "
                        "batching without CUDA graphs) and production (static cache + torch.compile reduce-overhead "
                        "for decode, continuous batching with use_cuda_graph); a loop that cannot run here is a row "
                        "with the reason (default: both)")
    p.add_argument("--dtype", default=None, help="bf16, fp16, fp32 (default: bf16 on CUDA, fp32 on CPU)")
    g = p.add_argument_group("prefill and decode")
    g.add_argument("--batch", default=None, help="prefill batch sizes, comma-separated")
    g.add_argument("--context", default=None, help="prefill context lengths, comma-separated")
    g.add_argument("--decode-batch", default=None, help="decode batch sizes, comma-separated")
    g.add_argument("--decode-context", default=None,
                   help="prompt lengths before decoding, comma-separated (each with every --decode-batch)")
    g.add_argument("--new-tokens", type=int, default=None, help="tokens generated per row in decode (>= 2)")
    g.add_argument("--reps", type=int, default=5, help="timed prefill calls per point (median; default 5)")
    g.add_argument("--no-share", action="store_true", help="skip the profiler pass (no attention share)")
    g.add_argument("--kv-dtype", default=None, metavar="fp8|fp8_e5m2",
                   help="also run production decode over an FP8 static KV cache (rows '<impl> (kv fp8)'): only an "
                        "implementation reading FP8 (the kernel) runs it, the others say why not")
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
    c.add_argument("--warmup-requests", type=int, default=None,
                   help="first requests counted as the cold part, reported apart from the steady state "
                        "(default: a tenth of the stream, at least 1)")
    c.add_argument("--sweep-concurrency", default=None, metavar="N,N,...",
                   help="also serve the same requests closed-loop at each number of requests in flight, per loop and "
                        "implementation: the throughput-per-GPU vs tokens/s-per-user curve with $/1M output")
    c.add_argument("--slo-ttft-ms", type=float, default=None, help="goodput SLO: time to first token, ms (> 0)")
    c.add_argument("--slo-tpot-ms", type=float, default=None, help="goodput SLO: time per output token, ms (> 0)")
    p.add_argument("--gpu-hour-price", type=float, default=None,
                   help="USD per GPU-hour for the cost columns (default 3.50, an assumed price, not a quote)")
    p.add_argument("--stem", default="serve", help="file name stem in --out: STEM.json, STEM.md, STEM-*.png")
    p.add_argument("--wide", action="store_true",
                   help="every column in the terminal tables (default: 80 columns, the reasons below the tables)")
    from attnprof.commands.common import add_output_args

    add_output_args(p)
    p.set_defaults(handler=run)


def settings(args: argparse.Namespace, device: str):
    """The command line as one `serving.settings.ServeSettings`, every value checked (bad ones: UsageError)."""
    from attnprof.serving.settings import make_settings

    return make_settings(
        device, mode=args.mode, model=args.model, loop=args.loop, dtype=args.dtype, seed=args.seed,
        gpu_hour_price=args.gpu_hour_price, reps=args.reps, share=not args.no_share,
        batch=args.batch, context=args.context, decode_batch=args.decode_batch, decode_context=args.decode_context,
        new_tokens=args.new_tokens, requests=args.requests, rate=args.rate, prompt_median=args.prompt_median,
        prompt_sigma=args.prompt_sigma, output_median=args.output_median, output_sigma=args.output_sigma,
        max_prompt=args.max_prompt, max_output=args.max_output, request_file=args.request_file,
        stream_timeout=args.stream_timeout, max_batch_tokens=args.max_batch_tokens, num_blocks=args.num_blocks,
        warmup_requests=args.warmup_requests, sweep_concurrency=args.sweep_concurrency,
        slo_ttft_ms=args.slo_ttft_ms, slo_tpot_ms=args.slo_tpot_ms, kv_dtype=args.kv_dtype)


def run(args: argparse.Namespace) -> int:
    from attnprof.commands.common import emit_json, out_dir
    from attnprof.errors import CheckFailed
    from attnprof.files import folder_notes, write_atomic, write_json
    from attnprof.provenance import provenance
    from attnprof.report import serve_report
    from attnprof.report.render import err, progress
    from attnprof.serving.session import errors, serve, steps
    from attnprof.serving.settings import check_memory
    from attnprof.serving.throughput import resolve_impls
    from attnprof.workload import resolve_device

    device = resolve_device(args.device)
    s = settings(args, device)
    check_memory(s)  # the weights and the smallest prefill and decode points, before any weight is allocated
    impls = resolve_impls(args.impls, device, config=s.config, dtype=s.dtype, context=s.longest_context())
    # an interrupted run keeps serve.partial.json; a killed one's is brought into view by the next run into --out
    folder = out_dir(args, "serve", keep_partial=True, rows=f"{args.stem}.partial.json", resumable=False)
    partial = folder / f"{args.stem}.partial.json"  # the rows so far, named as partial; removed when complete
    for note in folder_notes(folder):
        err.print(f"[yellow]{note}[/yellow]")

    def checkpoint(rows: dict) -> None:
        write_json(partial, {"partial": True, "note": "rows measured so far; the run did not finish", **rows,
                             "command": "attnprof " + " ".join(shlex.quote(a) for a in sys.argv[1:])})

    with progress() as bar:
        task = bar.add_task("serve", total=steps(s, impls))
        data = serve(s, impls, note=lambda text: err.print(f"[dim]{text}[/dim]"),
                     on_progress=lambda text, advance: bar.update(task, description=text, advance=int(advance)),
                     checkpoint=checkpoint)
    data["provenance"] = provenance(device, seed=s.seed)
    from attnprof.stderr import captured

    data["third_party_warnings"] = captured()  # what torch and transformers warned, instead of printed raw
    data["command"] = "attnprof " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    stem = args.stem
    pictures = serve_report.write_plots(data, folder, stem)
    data["pictures"] = [p.name for p in pictures]
    write_json(folder / f"{stem}.json", data)
    write_atomic(folder / f"{stem}.md", serve_report.markdown(data))
    from attnprof.report.serve_terminal import print_terminal

    print_terminal(data, wide=args.wide)
    from attnprof.files import commit_folder

    folder = commit_folder(folder)  # complete: renamed from its temporary name
    # only now: killed before the commit, the hidden folder still holds the partial file the next run looks for
    (folder / partial.name).unlink(missing_ok=True)
    err.print(f"report: {folder}/{stem}.json, {stem}.md" + "".join(f", {p.name}" for p in pictures))
    emit_json(args, serve_report.json_line(data, folder))
    failed = errors(data)
    if failed:
        raise CheckFailed("; ".join(failed))
    return 0
