"""Steady state: a serving run's numbers without its cold start, with the cold start reported apart.

The first requests of a run meet a cold server: CUDA graphs are captured per new batch shape, cuDNN builds a plan
per new sequence length, allocators grow. The last ones drain an emptying batch. vLLM's whole-run numbers
(`metrics.summarize`) mix both into the average; a backend that pays once per shape looks worse on a short stream
than it is on a long one, and whether the cuDNN per-length cost survives under CUDA graphs is a question that lives in
exactly that difference. So a run is split three ways:

- *cold*: the requests sent during the first `warmup_s` seconds (or the first `warmup_requests`), summarised as a
  run of their own (their latencies, their throughput over their own span);
- *steady latency*: TTFT/TPOT/ITL/E2EL of every request sent after the warm-up;
- *steady throughput*: the server's work inside the window from the end of the warm-up to the last arrival, while
  requests still arrive: output tokens whose timestamps fall in the window, prompt tokens of requests whose first
  token (the end of their prefill) falls in it, requests completed in it (and good ones under an SLO), all divided
  by the window's length. Tokens of cold requests emitted in the window count: the server did that work then.

A warm-up that covers every arrival leaves no steady window: that is a usage error (the stream is too short), not an
empty result.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from attnprof.errors import UsageError
from attnprof.serving.metrics import Latency, RequestTimeline, ServeMetrics, Slo, Throughput, summarize


@dataclass(frozen=True)
class SteadyState:
    """A run split at the end of its warm-up; `window_s` is (start, end) on the timelines' clock."""

    warmup: str  # how the warm-up was given, e.g. "10 s" or "20 requests"
    whole: ServeMetrics
    cold: ServeMetrics | None  # None when no request was sent during the warm-up
    steady_requests: int
    steady_failed: int
    steady_latency: Latency
    window_s: tuple[float, float]
    steady_throughput: Throughput

    def to_json(self) -> dict:
        return {"warmup": self.warmup, "whole": self.whole.to_json(),
                "cold": self.cold.to_json() if self.cold else None, "steady_requests": self.steady_requests,
                "steady_failed": self.steady_failed, "steady_latency": asdict(self.steady_latency),
                "window_s": list(self.window_s), "steady_throughput": self.steady_throughput.to_json()}


def windowed_throughput(timelines: list[RequestTimeline], start: float, end: float,
                        slo: Slo | None = None) -> Throughput:
    """The server's output inside [start, end): see the module docstring for what is counted."""
    if not end > start:
        raise ValueError(f"an empty window [{start}, {end})")
    done = [r for r in timelines if r.ok]
    inside = lambda t: start <= t < end  # noqa: E731
    finished = [r for r in done if inside(r.end_s)]
    return Throughput(end - start, len(finished), sum(r.prompt_tokens for r in done if inside(r.token_s[0])),
                      sum(1 for r in done for t in r.token_s if inside(t)),
                      None if slo is None else sum(map(slo.met, finished)))


def split_warmup(timelines: list[RequestTimeline], *, warmup_s: float | None = None,
                 warmup_requests: int | None = None, slo: Slo | None = None) -> SteadyState:
    """Split a run at the end of its warm-up, given in seconds from the first send or as a number of requests."""
    if (warmup_s is None) == (warmup_requests is None):
        raise ValueError("give exactly one of warmup_s, warmup_requests")
    if not timelines:
        raise ValueError("no requests to split")
    by_send = sorted(timelines, key=lambda r: (r.sent_s, r.index))
    t0, last_sent = by_send[0].sent_s, by_send[-1].sent_s
    if warmup_s is not None:
        if isinstance(warmup_s, bool) or not isinstance(warmup_s, (int, float)) or not math.isfinite(warmup_s) \
                or warmup_s < 0:
            raise UsageError(f"--warmup-s must be a number of seconds >= 0, got {warmup_s}")
        start, how = t0 + warmup_s, f"{warmup_s:g} s"
        cold = [r for r in by_send if r.sent_s < start]
        steady = by_send[len(cold):]
    else:
        if isinstance(warmup_requests, bool) or not isinstance(warmup_requests, int) or warmup_requests < 0:
            raise UsageError(f"--warmup-requests must be a whole number >= 0, got {warmup_requests}")
        cold, steady = by_send[:warmup_requests], by_send[warmup_requests:]
        how = f"{warmup_requests} requests"
        start = steady[0].sent_s if steady else math.inf
    if not steady or not last_sent > start:
        raise UsageError(f"the warm-up ({how}) covers every arrival of the stream ({len(timelines)} requests over "
                         f"{last_sent - t0:.3g} s): warm up less or send a longer stream")
    return SteadyState(how, summarize(timelines, slo=slo), summarize(cold, slo=slo) if cold else None,
                       len(steady), sum(1 for r in steady if not r.ok), Latency.of(steady), (start, last_sent),
                       windowed_throughput(timelines, start, last_sent, slo))
