"""The numbers `vllm bench serve` reports, from each request's timeline, plus goodput under an SLO and the token cost.

A serving engineer compares backends on these, so they are vLLM's definitions (`vllm/benchmarks/serve.py`,
`calculate_metrics`), not ours: for a completed request, TTFT is its first token minus its send time, E2EL its last
token minus its send time, TPOT (E2EL - TTFT) / (tokens - 1) for requests of more than one token, and ITL every gap
between its consecutive tokens (pooled over requests). Throughputs divide the completed requests' totals by the
benchmark's duration (first send to the last response, failures included). Percentiles interpolate linearly, as
numpy does. A request is *good* when every SLO given holds (a one-token request's TPOT counts as 0); goodput is good
requests per second. A failed request is counted with its reason and contributes no tokens, never dropped.

All times are seconds on one clock (the client's `time.perf_counter()`); the dataclasses report milliseconds.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass

from attnprof.errors import UsageError


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default method), q in [0, 100]."""
    if not values:
        raise ValueError("percentile of no values")
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def check_positive(value: float, flag: str, unit: str) -> float:
    """A user-given SLO or price: a finite number > 0, else UsageError naming the flag."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise UsageError(f"{flag} must be a positive number of {unit}, got {value}")
    return float(value)


@dataclass(frozen=True)
class RequestTimeline:
    """One request as the client saw it: sent at `sent_s`, output tokens at `token_s`, or failed with `error`.

    A failure may keep the tokens that arrived before it (they are not counted, as in vLLM); `ended_s` is when the
    failure was seen (default: its last token, else its send time).
    """

    index: int
    prompt_tokens: int
    sent_s: float
    token_s: tuple[float, ...] = ()
    error: str | None = None
    ended_s: float | None = None

    def __post_init__(self) -> None:
        stamps = (self.sent_s, *self.token_s)
        if any(b < a for a, b in zip(stamps, stamps[1:])):
            raise ValueError(f"request {self.index}: token times must not decrease nor precede the send time")
        if self.error is None and not self.token_s:
            raise ValueError(f"request {self.index} completed without a token time (record the timestamps)")

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def end_s(self) -> float:
        if self.ended_s is not None:
            return self.ended_s
        return self.token_s[-1] if self.token_s else self.sent_s

    @property
    def ttft_s(self) -> float:
        return self.token_s[0] - self.sent_s

    @property
    def e2el_s(self) -> float:
        return self.token_s[-1] - self.sent_s

    @property
    def tpot_s(self) -> float | None:
        """(E2EL - TTFT) / (tokens - 1); None for a one-token request (vLLM leaves it out of the TPOT statistics)."""
        n = len(self.token_s)
        return (self.token_s[-1] - self.token_s[0]) / (n - 1) if n > 1 else None

    @property
    def itl_s(self) -> list[float]:
        return [b - a for a, b in zip(self.token_s, self.token_s[1:])]


@dataclass(frozen=True)
class Dist:
    """A latency distribution in milliseconds: mean, std (population, as numpy), p50/p90/p99, and how many values."""

    n: int
    mean: float
    std: float
    p50: float
    p90: float
    p99: float

    @classmethod
    def of_seconds(cls, values: list[float]) -> Dist | None:
        if not values:
            return None
        ms = [v * 1e3 for v in values]
        return cls(len(ms), statistics.fmean(ms), statistics.pstdev(ms), percentile(ms, 50), percentile(ms, 90),
                   percentile(ms, 99))


@dataclass(frozen=True)
class Slo:
    """Service-level objectives in ms (`--slo-ttft-ms`, `--slo-tpot-ms`, `--slo-e2el-ms`); None = not set."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2el_ms: float | None = None

    def __post_init__(self) -> None:
        for name in ("ttft_ms", "tpot_ms", "e2el_ms"):
            v = getattr(self, name)
            if v is not None:
                check_positive(v, f"--slo-{name[:-3]}-ms", "milliseconds")
        if self.ttft_ms is None and self.tpot_ms is None and self.e2el_ms is None:
            raise UsageError("an SLO needs at least one of --slo-ttft-ms, --slo-tpot-ms, --slo-e2el-ms")

    def met(self, r: RequestTimeline) -> bool:
        """Completed and within every objective given (limits included: vLLM's `slo >= value`)."""
        if not r.ok:
            return False
        tpot = r.tpot_s if r.tpot_s is not None else 0.0
        return all(limit is None or value * 1e3 <= limit
                   for limit, value in ((self.ttft_ms, r.ttft_s), (self.tpot_ms, tpot), (self.e2el_ms, r.e2el_s)))


@dataclass(frozen=True)
class Latency:
    """TTFT, TPOT, ITL and E2EL over the completed requests given (None where no request has a value)."""

    ttft_ms: Dist | None
    tpot_ms: Dist | None
    itl_ms: Dist | None
    e2el_ms: Dist | None

    @classmethod
    def of(cls, timelines: list[RequestTimeline]) -> Latency:
        done = [r for r in timelines if r.ok]
        return cls(Dist.of_seconds([r.ttft_s for r in done]),
                   Dist.of_seconds([r.tpot_s for r in done if r.tpot_s is not None]),
                   Dist.of_seconds([g for r in done for g in r.itl_s]),
                   Dist.of_seconds([r.e2el_s for r in done]))


@dataclass(frozen=True)
class Throughput:
    """Requests and tokens per second over `duration_s`; goodput None when no SLO was given."""

    duration_s: float
    completed: int
    input_tokens: int
    output_tokens: int
    good: int | None = None

    @property
    def request_throughput(self) -> float:
        return self.completed / self.duration_s if self.duration_s > 0 else 0.0

    @property
    def request_goodput(self) -> float | None:
        if self.good is None:
            return None
        return self.good / self.duration_s if self.duration_s > 0 else 0.0

    @property
    def output_throughput(self) -> float:
        return self.output_tokens / self.duration_s if self.duration_s > 0 else 0.0

    @property
    def total_token_throughput(self) -> float:
        return (self.input_tokens + self.output_tokens) / self.duration_s if self.duration_s > 0 else 0.0

    def to_json(self) -> dict:
        return {**asdict(self), "request_throughput": self.request_throughput, "request_goodput": self.request_goodput,
                "output_throughput": self.output_throughput, "total_token_throughput": self.total_token_throughput}


@dataclass(frozen=True)
class Failure:
    index: int
    reason: str


@dataclass(frozen=True)
class ServeMetrics:
    """`vllm bench serve`'s result for one stream: counts, throughput, latency, failures, peaks."""

    requests: int
    failures: tuple[Failure, ...]
    throughput: Throughput
    latency: Latency
    slo: Slo | None
    max_output_tokens_per_s: float  # busiest 1-second bucket from the first send (vLLM's "peak output throughput")
    max_concurrent_requests: int  # most completed requests in flight at once, over [sent, last token)

    @property
    def completed(self) -> int:
        return self.throughput.completed

    @property
    def failed(self) -> int:
        return len(self.failures)

    def failure_reasons(self) -> dict[str, int]:
        """Each distinct reason with how many requests failed with it, most frequent first."""
        counts: dict[str, int] = {}
        for f in self.failures:
            counts[f.reason] = counts.get(f.reason, 0) + 1
        return dict(sorted(counts.items(), key=lambda kv: -kv[1]))

    def to_json(self) -> dict:
        return {"requests": self.requests, "completed": self.completed, "failed": self.failed,
                "failure_reasons": self.failure_reasons(), "failures": [asdict(f) for f in self.failures],
                "throughput": self.throughput.to_json(), "latency": asdict(self.latency),
                "slo": asdict(self.slo) if self.slo else None,
                "max_output_tokens_per_s": self.max_output_tokens_per_s,
                "max_concurrent_requests": self.max_concurrent_requests}


def summarize(timelines: list[RequestTimeline], *, slo: Slo | None = None,
              duration_s: float | None = None) -> ServeMetrics:
    """vLLM's `calculate_metrics` over these requests; `duration_s` defaults to first send → last end (failures too)."""
    if not timelines:
        raise ValueError("no requests to summarize")
    if duration_s is None:
        duration_s = max(r.end_s for r in timelines) - min(r.sent_s for r in timelines)
    done = [r for r in timelines if r.ok]
    throughput = Throughput(duration_s, len(done), sum(r.prompt_tokens for r in done),
                            sum(len(r.token_s) for r in done), None if slo is None else sum(map(slo.met, done)))
    failures = tuple(sorted((Failure(r.index, r.error) for r in timelines if not r.ok), key=lambda f: f.index))
    return ServeMetrics(len(timelines), failures, throughput, Latency.of(done), slo, *_peaks(done))


def _peaks(done: list[RequestTimeline]) -> tuple[float, int]:
    """(tokens in the busiest 1-s bucket counted from the first send, peak concurrency), as vLLM computes them."""
    if not done:
        return 0.0, 0
    start = min(r.sent_s for r in done)
    buckets = [0] * (math.ceil(max(r.end_s for r in done) - start) + 1)
    for r in done:
        for t in r.token_s:
            buckets[int(t - start)] += 1
    # half-open [sent, end): an end and a send at the same instant do not overlap (ends sort first)
    events = sorted([(r.sent_s, 1) for r in done] + [(r.end_s, -1) for r in done])
    level = peak = 0
    for _, step in events:
        level += step
        peak = max(peak, level)
    return float(max(buckets)), peak


@dataclass(frozen=True)
class TokenCost:
    """Dollars per 1M tokens at `gpu_hour_price` per GPU for `gpus` GPUs.

    `usd_per_m_output` charges the whole GPU-hour to output tokens (how a serving bill is usually read) and
    `usd_per_m_input` the whole hour to input tokens: each assumes the other kind is free, so they do not add up.
    With `output_input_ratio` r (output priced r times input, as API price lists do) the hour is split instead:
    `split_usd_per_m_input` p and `split_usd_per_m_output` r·p, with input_rate·p + output_rate·r·p = the hour's price.
    """

    gpu_hour_price: float
    gpus: int
    usd_per_m_output: float | None
    usd_per_m_input: float | None
    usd_per_m_total: float | None
    output_input_ratio: float | None = None
    split_usd_per_m_input: float | None = None
    split_usd_per_m_output: float | None = None


def token_cost(throughput: Throughput, gpu_hour_price: float, *, gpus: int = 1,
               output_input_ratio: float | None = None) -> TokenCost:
    price = check_positive(gpu_hour_price, "--gpu-hour-price", "dollars per GPU-hour")
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
        raise UsageError(f"--gpus must be a whole number >= 1, got {gpus}")
    hourly = price * gpus

    def per_m(tokens_per_s: float) -> float | None:
        return hourly / (tokens_per_s * 3600.0) * 1e6 if tokens_per_s > 0 else None

    inp = throughput.input_tokens / throughput.duration_s if throughput.duration_s > 0 else 0.0
    out = throughput.output_throughput
    split_in = split_out = None
    if output_input_ratio is not None:
        ratio = check_positive(output_input_ratio, "--output-input-price-ratio", "times the input price")
        split_in = per_m(inp + ratio * out)  # p such that (inp·p + out·r·p) tokens/s pay the hour
        split_out = None if split_in is None else ratio * split_in
    return TokenCost(price, gpus, per_m(out), per_m(inp), per_m(throughput.total_token_throughput),
                     output_input_ratio, split_in, split_out)
