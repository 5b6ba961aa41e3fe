"""A stream of requests served by transformers' own continuous batching: throughput, TTFT and inter-token latency.

Static batches (prefill, decode) say what a kernel does in isolation. A server sees requests arrive at random times
with different prompt and output lengths, and packs them into ragged batches that mix prefill and decode. This
file drives `model.init_continuous_batching()` (transformers 5.x, a background thread with a paged KV cache) with
such a stream (drawn or read by `serving/requests.py`; this file only serves it): Poisson arrivals at `rate`
requests/s and log-normal prompt / output lengths, or lengths replayed from a JSONL file. Each request's tokens are
counted from what it returned; a request that failed, was refused or did not finish in time is counted and reported
with its error, never dropped.

Only the attention implementations the paged path accepts run here (`paged|eager`, `paged|sdpa`; flash when
installed); anything else is rejected with the reason.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import time
from dataclasses import dataclass, field

import torch

from attnprof.errors import UsageError, first_line
from attnprof.measure.timing import percentile
from attnprof.serving.requests import Request

# attention implementation → the name transformers' paged path knows it by, newest spelling first
_PAGED_NAMES = {"eager": ("paged|eager",), "sdpa": ("paged|sdpa", "sdpa")}


@dataclass(frozen=True)
class StreamResult:
    """One implementation serving one request stream."""

    impl: str
    status: str = "ok"  # "ok" | "rejected"
    loop: str = "as-shipped"  # `serving.loops.LOOPS`; production = use_cuda_graph on
    reason: str | None = None
    ran_as: str | None = None  # the attention implementation transformers actually used
    requests: int = 0
    completed: int = 0
    failures: list[dict] = field(default_factory=list)  # {"request": i, "error": "..."}
    input_tokens: int = 0
    output_tokens: int = 0
    seconds: float = 0.0  # first arrival → last token
    warmup_s: float = 0.0
    ttft_ms: dict[str, float] = field(default_factory=dict)
    itl_ms: dict[str, float] = field(default_factory=dict)
    short: int = 0  # completed requests that returned fewer tokens than asked
    log_errors: list[str] = field(default_factory=list)
    # `vllm bench serve`'s numbers for this stream (`serving.metrics.summarize`: TTFT/TPOT/ITL/E2EL mean, p50/p90/p99,
    # request and token throughput, goodput under the SLO given), from the loop's own per-token timestamps
    metrics: dict | None = None
    # the same stream split at its warm-up (`serving.steady.split_warmup`): the cold requests summarised apart, the
    # steady latency and the steady-window throughput; None with `steady_note` when the stream is too short
    steady: dict | None = None
    steady_note: str | None = None
    # what the manager resolved (use_cuda_graph, async batching, paddings, cache size) and how many CUDA graphs it
    # held after the stream (None where this transformers lays them out otherwise): the production loop's evidence
    resolved: dict = field(default_factory=dict)
    graphs_captured: int | None = None

    @property
    def failed(self) -> int:
        return len(self.failures)

    @property
    def output_tokens_per_s(self) -> float:
        return self.output_tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def total_tokens_per_s(self) -> float:
        return (self.input_tokens + self.output_tokens) / self.seconds if self.seconds > 0 else 0.0

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        d.update(failed=self.failed, output_tokens_per_s=self.output_tokens_per_s,
                 total_tokens_per_s=self.total_tokens_per_s)
        return d


# ------------------------------------------------------------------------------------------------- serving it --

def paged_name(impl: str) -> str | None:
    """The name transformers' continuous batching knows `impl` by, or None when it has no paged form."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    known = set(ALL_ATTENTION_FUNCTIONS.keys())
    for name in _PAGED_NAMES.get(impl, ()):
        if name in known:
            return name
    return None


class _ErrorLog(logging.Handler):
    """Keeps the ERROR lines transformers' continuous batching logs (a failed batch is only reported there)."""

    def __init__(self) -> None:
        super().__init__(level=logging.ERROR)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage().strip().splitlines()
        if msg and "psutil" not in msg[0]:
            self.lines.append(msg[0][:300])


def _cb_config(device: str, requests: list[Request], num_blocks: int | None, max_batch_tokens: int | None,
               graphs: bool = False):
    from transformers import ContinuousBatchingConfig

    kw: dict = {}
    names = {f.name for f in dataclasses.fields(ContinuousBatchingConfig)}
    if graphs:  # the production loop; `serving.loops.unavailable` refused it where the option is missing
        kw["use_cuda_graph"] = True
    if "auto_switch_to_flash" in names:
        kw["auto_switch_to_flash"] = False  # measure the implementation asked for, not a swap
    if device == "cpu":  # size the cache to the stream instead of to the machine's RAM
        block = 256
        need = sum(-(-(r.prompt_tokens + r.output_tokens) // block) for r in requests)
        num_blocks = num_blocks or need + 4
        max_batch_tokens = max_batch_tokens or 256
    if num_blocks is not None:
        kw["num_blocks"] = num_blocks
    if max_batch_tokens is not None:
        kw["max_batch_tokens"] = max_batch_tokens
    return ContinuousBatchingConfig(**kw)


def serve_stream(model, impl: str, requests: list[Request], *, device: str, seed: int = 0, timeout_s: float = 120.0,
                 num_blocks: int | None = None, max_batch_tokens: int | None = None, on_done=None,
                 loop: str = "as-shipped", attach=None, slo=None, warmup_requests: int | None = None,
                 concurrency: int | None = None) -> StreamResult:
    """Feed `requests` at their arrival times to the model's continuous-batching manager and time every token.

    `loop="production"` turns transformers' CUDA graphs on (`use_cuda_graph=True`). `sdpa-<backend>` runs paged sdpa
    (the caller pins the backend: SDPA's flags are process-wide, the generation thread sees them). `attach(model)`
    puts the model on an implementation registered elsewhere (our kernel, `serving.flash_registration`) and returns
    its name.
    """
    from transformers import GenerationConfig

    from attnprof.models.features import REFUSALS, said, switch

    name = "attached" if attach is not None else paged_name("sdpa" if impl.startswith("sdpa-") else impl)
    if name is None:
        return StreamResult(impl=impl, loop=loop, status="rejected", requests=len(requests),
                            reason=f"transformers' continuous batching has no paged form of {impl!r} (it runs "
                                   f"{', '.join(sorted(_PAGED_NAMES))} and flash attention)")
    original = model.config._attn_implementation
    rng = random.Random(seed)
    prompts = [[rng.randrange(3, model.config.vocab_size) for _ in range(r.prompt_tokens)] for r in requests]
    gen_config = GenerationConfig(do_sample=False, max_new_tokens=max(r.output_tokens for r in requests),
                                  eos_token_id=-1, pad_token_id=0)
    log = _ErrorLog()
    cb_logger = logging.getLogger("ContinuousBatchingLogger")
    cb_logger.addHandler(log)
    manager = None
    try:
        if attach is not None:
            try:
                attach(model)
            except REFUSALS as exc:  # the model class refuses the registered kernel: transformers' words
                return StreamResult(impl=impl, loop=loop, status="rejected", requests=len(requests),
                                    reason=f"{impl}: {said(exc)}")
        elif (refused := switch(model, name)) is not None:  # the model class refuses it: transformers' words
            return StreamResult(impl=impl, loop=loop, status="rejected", requests=len(requests),
                                reason=f"{impl if name == impl else f'{impl} ({name})'}: {refused}")
        config = _cb_config(device, requests, num_blocks, max_batch_tokens, graphs=loop == "production")
        manager = model.init_continuous_batching(generation_config=gen_config, continuous_batching_config=config)
        ran_as = model.config._attn_implementation
        t_warm = time.perf_counter()
        try:
            if device.startswith("cuda"):
                manager.warmup()  # transformers' own (CUDA graphs, when it uses them)
            manager.start()
            _warm(manager, model.config.vocab_size, timeout_s)
        except torch.OutOfMemoryError as exc:
            why = f"warm-up ran out of memory: {first_line(exc, typed=False)[:200]}"
            return StreamResult(impl=impl, loop=loop, ran_as=ran_as, requests=len(requests), log_errors=log.lines[:10],
                                failures=[{"request": i, "error": why} for i in range(len(requests))])
        if device.startswith("cuda"):
            torch.cuda.synchronize(device)
        warmup_s = time.perf_counter() - t_warm
        sent, results, failures = _drive(manager, requests, prompts, timeout_s, on_done, concurrency)
        resolved, graphs = _resolved(manager), _graphs_captured(manager)
    finally:
        if manager is not None:
            manager.stop(block=True, timeout=30, hard_stop=True)
            manager.destroy()
        cb_logger.removeHandler(log)
        model.set_attn_implementation(original)
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
    res = _summarise(impl, ran_as, requests, sent, results, failures, warmup_s, log.lines)
    lines = timelines(requests, sent, results, res.failures)
    if not lines:
        return dataclasses.replace(res, loop=loop, steady_note="no per-token timestamps from this transformers",
                                   resolved=resolved, graphs_captured=graphs)
    from attnprof.serving.metrics import summarize
    from attnprof.serving.steady import split_warmup

    steady, note = None, None
    cold = max(1, len(requests) // 10) if warmup_requests is None else warmup_requests
    try:
        split = split_warmup(lines, warmup_requests=cold, slo=slo)
        steady, note = split.to_json(), _too_short(split, lines)
        if note:
            steady = None
    except UsageError as exc:  # too short a stream to have a steady part: said, not raised after the measurement
        note = str(exc)
    return dataclasses.replace(res, loop=loop, metrics=summarize(lines, slo=slo).to_json(), steady=steady,
                               steady_note=note, resolved=resolved, graphs_captured=graphs)


def _resolved(manager) -> dict:
    c = getattr(manager, "continuous_batching_config", None)
    keys = ("use_cuda_graph", "use_async_batching", "max_blocks_per_request", "q_padding_interval_size",
            "kv_padding_interval_size", "num_blocks", "max_batch_tokens", "max_requests_per_batch", "block_size",
            "page_size")
    out = {}
    for k in keys:
        v = getattr(c, k, None)
        if v is not None:
            out[k] = v if isinstance(v, (bool, int, float, str)) else str(v)
    return out


def _graphs_captured(manager) -> int | None:
    """CUDA graphs held by the batch processor (private attributes: None when this version lays them out otherwise)."""
    try:
        io = getattr(getattr(manager, "batch_processor", None), "inputs_and_outputs", None)
        ios = [p.device_io for p in getattr(io, "io_pairs", [])] or [io]
        stores = [getattr(getattr(x, "graphs", None), "_storage", None) for x in ios]
    except AttributeError:  # another layout: unknown, said as None
        return None
    return sum(len(s) for s in stores) if stores and all(isinstance(s, dict) for s in stores) else None


def timelines(requests, sent, results, failures) -> list:
    """Every request as a `serving.metrics.RequestTimeline` (a failure keeps its reason); [] without timestamps."""
    from attnprof.serving.metrics import RequestTimeline

    lines, seen = [], set()
    known = [t for _, t in sent.values()]
    for rid, (i, submitted) in sent.items():
        out = results.get(rid)
        if out is None or out.error is not None:
            continue
        stamps = tuple(list(out.timestamps or [])[:len(out.generated_tokens)])
        if not stamps:
            return []  # this transformers did not record per-token times: no latency to report
        lines.append(RequestTimeline(i, len(out.prompt_ids), submitted, stamps))
        seen.add(i)
    sent_at = {i: t for i, t in sent.values()}
    last = max(known) if known else 0.0
    for f in failures:
        if f["request"] not in seen:
            t = sent_at.get(f["request"], last)
            lines.append(RequestTimeline(f["request"], requests[f["request"]].prompt_tokens, t, error=f["error"],
                                         ended_s=t))
    return lines


def _warm(manager, vocab: int, timeout_s: float) -> None:
    """Two short requests through the running manager before the clock starts: first-batch set-up is not serving."""
    ids = [manager.add_request([3 + (i * 7) % (vocab - 3) for i in range(16 + j)], request_id=f"warm{j}",
                               max_new_tokens=4, eos_token_id=-1) for j in range(2)]
    pending = {i for i in ids if i is not None}
    deadline = time.perf_counter() + timeout_s
    while pending and time.perf_counter() < deadline and manager.is_running():
        out = manager.get_result(timeout=0.05)
        if out is not None and out.is_finished():
            pending.discard(out.request_id)


def _drive(manager, requests, prompts, timeout_s, on_done, concurrency: int | None = None):
    """Submit each request when its time comes; collect results until all are back, the manager dies, or time runs out."""
    sent: dict[str, tuple[int, float]] = {}  # request id → (index, submit time)
    results: dict[str, object] = {}
    failures: list[dict] = []
    t0 = time.perf_counter()
    nxt = 0
    while True:
        now = time.perf_counter() - t0
        # open loop: each request at its arrival time; closed loop (`concurrency`): the next one as soon as fewer
        # than `concurrency` are in flight (arrival times ignored)
        while nxt < len(requests) and (requests[nxt].arrival_s <= now if concurrency is None
                                       else len(sent) - len(results) < concurrency):
            r = requests[nxt]
            submitted = time.perf_counter()
            rid = manager.add_request(prompts[nxt], request_id=f"r{nxt}", max_new_tokens=r.output_tokens,
                                      record_timestamps=True, eos_token_id=-1)
            if rid is None:
                failures.append({"request": nxt, "error": "refused by the continuous-batching manager"})
            else:
                sent[rid] = (nxt, submitted)
            nxt += 1
        if nxt == len(requests) and len(results) == len(sent):
            break
        if now > timeout_s:
            for rid, (i, _) in sent.items():
                if rid not in results:
                    failures.append({"request": i, "error": f"not finished within {timeout_s:g} s"})
            for i in range(nxt, len(requests)):
                failures.append({"request": i, "error": f"never sent: its arrival is past the {timeout_s:g} s limit"})
            break
        wait = min(0.05, requests[nxt].arrival_s - now) if nxt < len(requests) and concurrency is None else 0.05
        out = manager.get_result(timeout=max(wait, 0.001))
        if out is None:
            if not manager.is_running():
                for rid, (i, _) in sent.items():
                    if rid not in results:
                        failures.append({"request": i, "error": "the generation thread stopped before answering"})
                for i in range(nxt, len(requests)):
                    failures.append({"request": i, "error": "never sent: the generation thread had stopped"})
                break
            continue
        if out.is_finished() and out.request_id in sent and out.request_id not in results:
            results[out.request_id] = out
            if on_done is not None:
                on_done()
    return sent, results, failures


def _summarise(impl, ran_as, requests, sent, results, failures, warmup_s, log_lines) -> StreamResult:
    ttft, itl, starts, ends = [], [], [], []
    input_tokens = output_tokens = short = completed = 0
    for rid, out in results.items():
        i, submitted = sent[rid]
        if out.error is not None:
            failures.append({"request": i, "error": first_line(str(out.error))[:300]})
            continue
        completed += 1
        n = len(out.generated_tokens)
        input_tokens += len(out.prompt_ids)
        output_tokens += n
        short += n < requests[i].output_tokens
        stamps = list(out.timestamps or [])
        starts.append(submitted)
        if stamps:
            ttft.append((stamps[0] - submitted) * 1e3)
            itl.extend((b - a) * 1e3 for a, b in zip(stamps, stamps[1:]))
            ends.append(stamps[-1])
    failures.sort(key=lambda f: f["request"])
    seconds = (max(ends) - min(starts)) if ends else 0.0
    q = lambda xs: {"p50": percentile(xs, 50), "p99": percentile(xs, 99)} if xs else {}  # noqa: E731
    return StreamResult(impl=impl, ran_as=ran_as, requests=len(requests), completed=completed, failures=failures,
                        input_tokens=input_tokens, output_tokens=output_tokens, seconds=seconds, warmup_s=warmup_s,
                        ttft_ms=q(ttft), itl_ms=q(itl), short=short, log_errors=log_lines[:10])


def _too_short(split, lines) -> str | None:
    """A steady window shorter than a request's median end-to-end latency never holds a steady population of
    requests (the H200's 40-request stream arrived in 1.1 s against E2EL p50 of 1.2–3.4 s): no numbers, a reason."""
    import statistics

    done = [r.e2el_s for r in lines if r.ok and r.token_s]
    if not done:
        return None
    window = split.window_s[1] - split.window_s[0]
    e2el = statistics.median(done)
    if window >= e2el:
        return None
    return (f"too short for a steady state: the arrivals after the warm-up span {window:.3g} s, less than a "
            f"request's median end-to-end latency ({e2el:.3g} s); send a longer stream (--requests, --rate)")
