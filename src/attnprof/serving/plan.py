"""`attnprof serve`'s plan: every flag checked and defaulted (per device) before a model is built.

`make_plan(flags, device)` reads the command's options by name from `flags` (an `argparse.Namespace`, or any object
with the same attributes: the library can be driven without the CLI) and returns the plan as a dict: modes, model
and its config, dtype, price, the prefill and decode grids, and the request stream. Bad values are UsageErrors.
"""

from __future__ import annotations

import dataclasses
import math

from attnprof.errors import UsageError, first_line
from attnprof.validate import check_positions as _fits  # one check for serve, audit and verify

MODES = ("prefill", "decode", "continuous")
# CPU defaults are tiny on purpose; the GPU ones are the issue's ~1B serving grid.
DEFAULTS = {
    "cpu": dict(model="tiny-llama", dtype="fp32", batch="1", context="64,128", decode_batch="1,4",
                decode_context=64, new_tokens=8, requests=8, rate=20.0, prompt_median=48, output_median=8),
    "cuda": dict(model="llama-1b", dtype="bf16", batch="1", context="1024,4096,8192", decode_batch="1,16,64",
                 decode_context=1024, new_tokens=64, requests=64, rate=16.0, prompt_median=512, output_median=128),
}


def _ints(text: str, flag: str) -> list[int]:
    try:
        vals = [int(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"{flag} takes comma-separated whole numbers, got {text!r}") from None
    if not vals or any(v < 1 for v in vals):
        raise UsageError(f"{flag} needs numbers >= 1, got {text!r}")
    return vals


def make_plan(args, device: str) -> dict:
    """Every flag checked and defaulted before a model is built."""
    from attnprof.models import load_config
    from attnprof.serving.cost import DEFAULT_GPU_HOUR_PRICE, check_price
    from attnprof.serving.requests import Lengths, check_fits, load_request_file, poisson_stream
    from attnprof.workload import dtype_name

    d = DEFAULTS["cuda" if device.startswith("cuda") else "cpu"]
    pick = lambda name: d[name] if getattr(args, name) is None else getattr(args, name)  # noqa: E731
    modes = [m.strip() for m in args.mode.split(",") if m.strip()]
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        raise UsageError(f"--mode {args.mode!r}: choose from {', '.join(MODES)}")
    price = check_price(DEFAULT_GPU_HOUR_PRICE if args.gpu_hour_price is None else args.gpu_hour_price)
    model = pick("model")
    try:
        config = load_config(model)
    except UsageError:
        raise
    except Exception as exc:  # transformers' config validators raise their own types (huggingface_hub's strict ones)
        cause = exc.__cause__ or exc
        raise UsageError(f"{model}: transformers cannot build this config ({first_line(cause)})") from None
    max_pos = int(getattr(config, "max_position_embeddings", 0) or 0)
    from attnprof.serving.loops import parse_loops

    loops = parse_loops(getattr(args, "loop", None) or "as-shipped,production")
    plan = dict(modes=modes, loops=loops, model=model, config=config, dtype=dtype_name(pick("dtype")), price=price,
                price_is_default=args.gpu_hour_price is None, max_positions=max_pos)
    if args.reps < 1:
        raise UsageError(f"--reps must be >= 1, got {args.reps}")
    if "prefill" in modes:
        plan["batch"], plan["context"] = _ints(pick("batch"), "--batch"), _ints(pick("context"), "--context")
        _fits(max(plan["context"]), max_pos, model, "--context")
    if "decode" in modes:
        plan["decode_batch"] = _ints(pick("decode_batch"), "--decode-batch")
        plan["decode_context"] = _ints(pick("decode_context"), "--decode-context")
        plan["new_tokens"] = _ints(pick("new_tokens"), "--new-tokens")[0]
        if plan["new_tokens"] < 2:
            raise UsageError("--new-tokens must be >= 2 (decode speed is timed between the first and last token)")
        _fits(max(plan["decode_context"]) + plan["new_tokens"], max_pos, model, "--decode-context + --new-tokens")
    if getattr(args, "sweep_concurrency", None) and "continuous" not in modes:
        raise UsageError("--sweep-concurrency sweeps the request stream: add continuous to --mode")
    if "continuous" in modes:
        rate = pick("rate")
        # finite: serve.json carries the rate, and JSON has no inf (`poisson_stream` itself takes rate=inf)
        if args.rate is not None and not (args.rate > 0 and math.isfinite(args.rate)):
            raise UsageError(f"--rate must be a positive number of requests per second, got {args.rate}")
        if args.stream_timeout <= 0:
            raise UsageError(f"--stream-timeout must be positive, got {args.stream_timeout}")
        if args.request_file is not None:
            requests = load_request_file(args.request_file, rate=rate, seed=args.seed)
        else:  # --max-prompt / --max-output None: 4× the median (`Lengths.upper`)
            prompt = Lengths(pick("prompt_median"), args.prompt_sigma, args.max_prompt)
            output = Lengths(pick("output_median"), args.output_sigma, args.max_output, flag="--output")
            requests = poisson_stream(pick("requests"), rate, prompt=prompt, output=output, seed=args.seed)
        if max_pos:
            check_fits(requests, max_pos)
        plan["requests"], plan["rate"] = requests, rate
        levels = getattr(args, "sweep_concurrency", None)
        if levels:
            plan["sweep"] = sorted(set(_ints(levels, "--sweep-concurrency")))
        warm = getattr(args, "warmup_requests", None)
        if warm is not None and not 0 <= warm < len(requests) - 1:
            raise UsageError(f"--warmup-requests {warm} leaves no steady part of a {len(requests)}-request stream "
                             f"(give 0 … {max(0, len(requests) - 2)})")
        slo = {k: getattr(args, f"slo_{k}", None) for k in ("ttft_ms", "tpot_ms")}
        if any(v is not None for v in slo.values()):
            from attnprof.serving.metrics import Slo

            plan["slo"] = Slo(**slo)  # each > 0, else a UsageError naming the flag
    return plan


def stream_json(plan: dict, args) -> dict:
    from attnprof.serving.requests import summary

    s = summary(plan["requests"])
    return {"source": str(args.request_file) if args.request_file else "poisson", "requests": s["requests"],
            "rate_per_s": plan["rate"] if not args.request_file else None, "span_s": s["span_s"],
            "prompt_tokens": s["prompt_tokens"], "output_tokens": s["output_tokens"],
            "prompt_sigma": args.prompt_sigma, "output_sigma": args.output_sigma,
            "max_batch_tokens": args.max_batch_tokens, "num_blocks": args.num_blocks,
            "timeout_s": args.stream_timeout,
            "slo": dataclasses.asdict(plan["slo"]) if plan.get("slo") else None}
