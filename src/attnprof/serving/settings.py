"""`attnprof serve`'s settings: every flag checked and defaulted for the device, once, before a model is built.

`make_settings(device, **flags)` takes the command's options by their flag names (`mode="prefill,decode"`,
`new_tokens=8`, `batch="1,4"`; None means the device's default) and returns one frozen `ServeSettings`: what to
measure (modes, loops, the prefill and decode grids), on what (model, config, dtype, device), the request stream
(`StreamSettings`), the price and the seed. `commands/serve.py` makes it from the command line; a library user calls
it directly. Everything below (`serving.session` and the loops it drives) reads typed fields, never flags by name.
Bad values are a `UsageError` naming the flag (exit 2).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from attnprof.errors import UsageError, first_line
from attnprof.serving.metrics import Slo
from attnprof.serving.requests import Request
from attnprof.validate import check_positions as _fits  # one check for serve, audit and verify

Mode = Literal["prefill", "decode", "continuous"]
Loop = Literal["as-shipped", "production"]  # `serving.loops.LOOPS`
Dtype = Literal["fp32", "fp16", "bf16", "fp64"]  # `workload.DTYPES`
MODES: tuple[Mode, ...] = ("prefill", "decode", "continuous")
DEFAULT_LOOPS = "as-shipped,production"
# CPU defaults are tiny on purpose; the GPU ones are a ~1B model's serving grid.
DEFAULTS = {
    "cpu": dict(model="tiny-llama", dtype="fp32", batch="1", context="64,128", decode_batch="1,4",
                decode_context=64, new_tokens=8, requests=8, rate=20.0, prompt_median=48, output_median=8),
    "cuda": dict(model="llama-1b", dtype="bf16", batch="1", context="1024,4096,8192", decode_batch="1,16,64",
                 decode_context=1024, new_tokens=64, requests=64, rate=16.0, prompt_median=512, output_median=128),
}


@dataclass(frozen=True)
class StreamSettings:
    """The continuous-batching part: the requests and how the loop serves them."""

    requests: tuple[Request, ...]
    rate: float  # arrivals per second (drawn, or given to a request file without arrivals)
    request_file: Path | None  # None: a seeded Poisson stream
    prompt_sigma: float
    output_sigma: float
    timeout_s: float  # unfinished requests count as failed after this
    max_batch_tokens: int | None  # None: transformers decides
    num_blocks: int | None  # paged KV cache blocks; None: transformers decides
    warmup_requests: int | None  # the cold part of the stream; None: a tenth of it, at least 1
    sweep: tuple[int, ...] = ()  # closed-loop concurrencies to serve the same requests at; () = no sweep
    slo: Slo | None = None  # goodput objectives

    def to_json(self) -> dict:
        """serve.json's `continuous.stream`: the stream's summary and the loop's settings."""
        from attnprof.serving.requests import summary

        s = summary(list(self.requests))
        return {"source": str(self.request_file) if self.request_file else "poisson", "requests": s["requests"],
                "rate_per_s": self.rate if not self.request_file else None, "span_s": s["span_s"],
                "prompt_tokens": s["prompt_tokens"], "output_tokens": s["output_tokens"],
                "prompt_sigma": self.prompt_sigma, "output_sigma": self.output_sigma,
                "max_batch_tokens": self.max_batch_tokens, "num_blocks": self.num_blocks, "timeout_s": self.timeout_s,
                "slo": dataclasses.asdict(self.slo) if self.slo else None}


@dataclass(frozen=True)
class ServeSettings:
    """One `attnprof serve` run, checked: a grid of a mode not asked for is empty."""

    device: str
    model: str  # preset name or config.json path
    config: Any = field(repr=False, compare=False)  # the model's transformers config, loaded to check it
    dtype: Dtype
    modes: tuple[Mode, ...]
    loops: tuple[Loop, ...]
    price: float  # USD per GPU-hour
    price_is_default: bool
    max_positions: int  # the config's max_position_embeddings (0: not said)
    seed: int = 0
    reps: int = 5  # timed prefill calls per point (median)
    share: bool = True  # profile the attention share of a step
    batch: tuple[int, ...] = ()  # prefill
    context: tuple[int, ...] = ()
    decode_batch: tuple[int, ...] = ()
    decode_context: tuple[int, ...] = ()
    new_tokens: int = 0  # tokens generated per row in decode (>= 2 when decode is asked for)
    stream: StreamSettings | None = None  # None unless continuous is asked for
    kv_dtype: str | None = None  # "fp8"/"fp8_e5m2": production decode again over an FP8 static cache

    def cells(self, mode: Literal["prefill", "decode"]) -> list[tuple[int, int]]:
        """(batch, context) of every point of `mode`'s grid, context-major."""
        if mode == "prefill":
            return [(b, c) for c in self.context for b in self.batch]
        return [(b, c) for c in self.decode_context for b in self.decode_batch]

    def longest_context(self, default: int = 1024) -> int:
        return max([*self.context, *self.decode_context] or [default])


def _ints(text: str | int | Sequence[int], flag: str) -> list[int]:
    if not isinstance(text, (str, int)):
        text = ",".join(map(str, text))
    try:
        vals = [int(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"{flag} takes comma-separated whole numbers, got {text!r}") from None
    if not vals or any(v < 1 for v in vals):
        raise UsageError(f"{flag} needs numbers >= 1, got {text!r}")
    return vals


def make_settings(device: str, *, mode: str = "prefill,decode,continuous", model: str | None = None,
                  loop: str | None = DEFAULT_LOOPS, dtype: str | None = None, seed: int = 0,
                  gpu_hour_price: float | None = None, reps: int = 5, share: bool = True,
                  batch: str | None = None, context: str | None = None, decode_batch: str | None = None,
                  decode_context: str | int | None = None, new_tokens: int | None = None,
                  requests: int | None = None, rate: float | None = None, prompt_median: float | None = None,
                  prompt_sigma: float = 0.6, output_median: float | None = None, output_sigma: float = 0.5,
                  max_prompt: int | None = None, max_output: int | None = None,
                  request_file: str | Path | None = None, stream_timeout: float = 120.0,
                  max_batch_tokens: int | None = None, num_blocks: int | None = None,
                  warmup_requests: int | None = None, sweep_concurrency: str | None = None,
                  slo_ttft_ms: float | None = None, slo_tpot_ms: float | None = None,
                  kv_dtype: str | None = None) -> ServeSettings:
    """Every flag checked and defaulted for `device` before a model is built (the flags' meanings:
    `attnprof serve --help`). Grid flags are comma-separated whole numbers."""
    from attnprof.models import load_config
    from attnprof.serving.cost import DEFAULT_GPU_HOUR_PRICE, check_price
    from attnprof.serving.loops import parse_loops
    from attnprof.serving.requests import Lengths, check_fits, load_request_file, poisson_stream
    from attnprof.workload import kv_dtype_name, model_dtype_name

    d = DEFAULTS["cuda" if device.startswith("cuda") else "cpu"]
    given = {"model": model, "dtype": dtype, "batch": batch, "context": context, "decode_batch": decode_batch,
             "decode_context": decode_context, "new_tokens": new_tokens, "requests": requests, "rate": rate,
             "prompt_median": prompt_median, "output_median": output_median}
    pick = lambda name: d[name] if given[name] is None else given[name]  # noqa: E731
    modes = [m.strip() for m in mode.split(",") if m.strip()]
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        raise UsageError(f"--mode {mode!r}: choose from {', '.join(MODES)}")
    price = check_price(DEFAULT_GPU_HOUR_PRICE if gpu_hour_price is None else gpu_hour_price)
    name = pick("model")
    try:
        config = load_config(name)
    except UsageError:
        raise
    except Exception as exc:  # transformers' config validators raise their own types (huggingface_hub's strict ones)
        cause = exc.__cause__ or exc
        raise UsageError(f"{name}: transformers cannot build this config ({first_line(cause)})") from None
    max_pos = int(getattr(config, "max_position_embeddings", 0) or 0)
    loops = parse_loops(loop or DEFAULT_LOOPS)
    grids: dict[str, Any] = {}
    kind = model_dtype_name(pick("dtype"))
    if reps < 1:
        raise UsageError(f"--reps must be >= 1, got {reps}")
    if "prefill" in modes:
        grids["batch"], grids["context"] = _ints(pick("batch"), "--batch"), _ints(pick("context"), "--context")
        _fits(max(grids["context"]), max_pos, name, "--context")
    if "decode" in modes:
        grids["decode_batch"] = _ints(pick("decode_batch"), "--decode-batch")
        grids["decode_context"] = _ints(pick("decode_context"), "--decode-context")
        grids["new_tokens"] = _ints(pick("new_tokens"), "--new-tokens")[0]
        if grids["new_tokens"] < 2:
            raise UsageError("--new-tokens must be >= 2 (decode speed is timed between the first and last token)")
        _fits(max(grids["decode_context"]) + grids["new_tokens"], max_pos, name, "--decode-context + --new-tokens")
    kv = kv_dtype_name(kv_dtype)
    if kv and ("decode" not in modes or "production" not in loops):
        raise UsageError(f"--kv-dtype {kv_dtype} is served in the production loop's decode (a static FP8 cache in "
                         "CUDA graphs): add decode to --mode and production to --loop")
    if kv and kind not in ("fp16", "bf16"):
        raise UsageError(f"--kv-dtype {kv_dtype} takes fp16 or bf16 models (--dtype), not {kind}")
    if sweep_concurrency and "continuous" not in modes:
        raise UsageError("--sweep-concurrency sweeps the request stream: add continuous to --mode")
    stream = None
    if "continuous" in modes:
        arrivals = pick("rate")
        # finite: serve.json carries the rate, and JSON has no inf (`poisson_stream` itself takes rate=inf)
        if rate is not None and not (rate > 0 and math.isfinite(rate)):
            raise UsageError(f"--rate must be a positive number of requests per second, got {rate}")
        if stream_timeout <= 0:
            raise UsageError(f"--stream-timeout must be positive, got {stream_timeout}")
        if request_file is not None:
            reqs = load_request_file(request_file, rate=arrivals, seed=seed)
        else:  # max_prompt / max_output None: 4× the median (`Lengths.upper`)
            prompt = Lengths(pick("prompt_median"), prompt_sigma, max_prompt)
            output = Lengths(pick("output_median"), output_sigma, max_output, flag="--output")
            reqs = poisson_stream(pick("requests"), arrivals, prompt=prompt, output=output, seed=seed)
        if max_pos:
            check_fits(reqs, max_pos)
        levels = tuple(sorted(set(_ints(sweep_concurrency, "--sweep-concurrency")))) if sweep_concurrency else ()
        if warmup_requests is not None and not 0 <= warmup_requests < len(reqs) - 1:
            raise UsageError(f"--warmup-requests {warmup_requests} leaves no steady part of a {len(reqs)}-request "
                             f"stream (give 0 … {max(0, len(reqs) - 2)})")
        slo = None
        if slo_ttft_ms is not None or slo_tpot_ms is not None:
            slo = Slo(ttft_ms=slo_ttft_ms, tpot_ms=slo_tpot_ms)  # each > 0, else a UsageError naming the flag
        stream = StreamSettings(tuple(reqs), arrivals, Path(request_file) if request_file is not None else None,
                                prompt_sigma, output_sigma, stream_timeout, max_batch_tokens, num_blocks,
                                warmup_requests, levels, slo)
    return ServeSettings(device=device, model=name, config=config, dtype=kind, modes=tuple(modes), loops=tuple(loops),
                         price=price, price_is_default=gpu_hour_price is None, max_positions=max_pos, seed=seed,
                         reps=reps, share=share, batch=tuple(grids.get("batch", ())),
                         context=tuple(grids.get("context", ())), decode_batch=tuple(grids.get("decode_batch", ())),
                         decode_context=tuple(grids.get("decode_context", ())), new_tokens=grids.get("new_tokens", 0),
                         stream=stream, kv_dtype=kv)


def check_memory(s: ServeSettings) -> None:
    """The model's weights, then `serve`'s smallest prefill and decode points, before a weight is allocated: when even
    they cannot fit, nothing can run (exit 2). A larger point of a grid that cannot fit is a row that says so (`oom`,
    not run), so one cell past the device's memory does not cost the cells that fit (`serving.session`)."""
    from attnprof.memory_fit import check_model_batch_fits, check_model_fits

    check_model_fits(s.config, s.dtype, s.device, s.model)
    if s.batch and s.context:
        check_model_batch_fits(s.config, s.dtype, s.device, f"{s.model} prefill", min(s.batch), min(s.context),
                               "reduce --batch or --context")
    if s.decode_batch:
        check_model_batch_fits(s.config, s.dtype, s.device, f"{s.model} decode", min(s.decode_batch),
                               min(s.decode_context) + s.new_tokens, "reduce --decode-batch or --decode-context",
                               prefill=False)
