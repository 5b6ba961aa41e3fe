"""Serving metrics (serving/metrics.py, serving/steady.py) against hand-computed values on small synthetic timelines.

Times are binary fractions of a second so every expected millisecond below is exact. The main timeline:

    r0  prompt 10  sent 0      tokens 0.125 0.1875 0.25 0.375     TTFT 125  TPOT 83.33  E2EL 375  ITL 62.5 62.5 125
    r1  prompt 20  sent 0.25   tokens 0.5 0.625                   TTFT 250  TPOT 125    E2EL 375  ITL 125
    r2  prompt 30  sent 1      tokens 1.0625                      TTFT 62.5 (one token: no TPOT, no ITL)
    r3  prompt 40  sent 1.25   token 1.375, then CUDA OOM at 1.5  failed (its token is not counted)
    r4  prompt 5   sent 1.5    not finished, given up at 2.5      failed
    r5  prompt 5   sent 1.75   not finished, given up at 2        failed
duration 0 → 2.5 s; completed 3 (60 prompt, 7 output tokens).
"""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from attnprof.errors import UsageError
from attnprof.serving.metrics import Failure, RequestTimeline, Slo, percentile, summarize, token_cost
from attnprof.serving.steady import split_warmup, windowed_throughput

OOM, LATE = "OutOfMemoryError: CUDA out of memory", "not finished within 2 s"


def timeline() -> list[RequestTimeline]:
    return [RequestTimeline(0, 10, 0.0, (0.125, 0.1875, 0.25, 0.375)),
            RequestTimeline(1, 20, 0.25, (0.5, 0.625)),
            RequestTimeline(2, 30, 1.0, (1.0625,)),
            RequestTimeline(3, 40, 1.25, (1.375,), error=OOM, ended_s=1.5),
            RequestTimeline(5, 5, 1.75, error=LATE, ended_s=2.0),
            RequestTimeline(4, 5, 1.5, error=LATE, ended_s=2.5)]


def test_throughput_counts_completed_requests_over_the_whole_duration():
    m = summarize(timeline())
    t = m.throughput
    assert (m.requests, m.completed, m.failed) == (6, 3, 3)
    assert (t.duration_s, t.input_tokens, t.output_tokens) == (2.5, 60, 7)
    assert t.request_throughput == pytest.approx(1.2)
    assert t.output_throughput == pytest.approx(2.8)
    assert t.total_token_throughput == pytest.approx(26.8)
    assert t.request_goodput is None and t.good is None  # no SLO, no goodput


def test_latencies_are_vllms_definitions():
    lat = summarize(timeline()).latency
    assert (lat.ttft_ms.n, lat.ttft_ms.p50, lat.ttft_ms.p90, lat.ttft_ms.p99) == (3, 125.0, 225.0, 247.5)
    assert lat.ttft_ms.mean == pytest.approx(437.5 / 3)
    assert lat.ttft_ms.std == pytest.approx(77.9512, rel=1e-5)  # population std, as numpy
    assert lat.tpot_ms.n == 2  # the one-token request has no TPOT
    assert (lat.tpot_ms.p50, lat.tpot_ms.p90, lat.tpot_ms.p99) == pytest.approx((625 / 6, 725 / 6, 747.5 / 6))
    assert (lat.itl_ms.n, lat.itl_ms.p50, lat.itl_ms.p90, lat.itl_ms.mean) == (4, 93.75, 125.0, 93.75)
    assert (lat.e2el_ms.p50, lat.e2el_ms.p90) == (375.0, 375.0)


def test_failures_are_counted_with_their_reasons_never_dropped():
    m = summarize(timeline())
    assert m.failures == (Failure(3, OOM), Failure(4, LATE), Failure(5, LATE))
    assert list(m.failure_reasons().items()) == [(LATE, 2), (OOM, 1)]  # most frequent first
    j = m.to_json()
    assert j["failed"] == 3 and j["failure_reasons"] == {LATE: 2, OOM: 1} and len(j["failures"]) == 3


def test_peak_output_per_second_and_peak_concurrency():
    m = summarize(timeline())
    assert m.max_output_tokens_per_s == 6.0  # second 0 holds r0's 4 and r1's 2 tokens; r2's is in second 1
    assert m.max_concurrent_requests == 2  # r0 [0, 0.375) overlaps r1 [0.25, 0.625)
    touching = [RequestTimeline(0, 1, 0.0, (0.25, 0.5)), RequestTimeline(1, 1, 0.5, (0.75,))]
    assert summarize(touching).max_concurrent_requests == 1  # half-open: an end and a send at once do not overlap


@pytest.mark.parametrize("slo, good", [
    (Slo(ttft_ms=125, tpot_ms=100), 2),  # r0 at the TTFT limit counts (<=); r1's TTFT 250 misses; r2's TPOT is 0
    (Slo(tpot_ms=80), 1),  # only the one-token request (TPOT counted as 0)
    (Slo(e2el_ms=100), 1),
    (Slo(ttft_ms=1000, tpot_ms=1000, e2el_ms=1000), 3),  # failed requests are never good
])
def test_goodput_under_an_slo(slo, good):
    t = summarize(timeline(), slo=slo).throughput
    assert t.good == good and t.request_goodput == pytest.approx(good / 2.5)


@pytest.mark.parametrize("kw, message", [
    ({}, "needs at least one of --slo-ttft-ms"),
    ({"ttft_ms": 0}, "--slo-ttft-ms must be a positive number of milliseconds, got 0"),
    ({"tpot_ms": -5}, "--slo-tpot-ms must be a positive number of milliseconds, got -5"),
    ({"e2el_ms": math.nan}, "--slo-e2el-ms must be a positive number"),
    ({"ttft_ms": math.inf}, "--slo-ttft-ms must be a positive number"),
])
def test_a_bad_slo_is_a_usage_error(kw, message):
    with pytest.raises(UsageError) as info:
        Slo(**kw)
    assert message in str(info.value) and info.value.exit_code == 2


def test_cost_per_million_input_and_output_tokens():
    t = summarize(timeline()).throughput  # 24 input and 2.8 output tokens/s
    c = token_cost(t, 3.6)  # $3.60 per GPU-hour: $1000 per (token/s · 1M tokens)
    assert (c.usd_per_m_output, c.usd_per_m_input, c.usd_per_m_total) == pytest.approx(
        (1000 / 2.8, 1000 / 24, 1000 / 26.8))
    assert c.split_usd_per_m_input is None
    split = token_cost(t, 3.6, output_input_ratio=4.0)
    assert split.split_usd_per_m_input == pytest.approx(1000 / 35.2)
    assert split.split_usd_per_m_output == pytest.approx(4000 / 35.2)
    # the split prices pay exactly the hour: (24 · p_in + 2.8 · p_out) $/1M tokens per second · 3600 s
    assert (24 * split.split_usd_per_m_input + 2.8 * split.split_usd_per_m_output) * 3600 / 1e6 == pytest.approx(3.6)
    assert token_cost(t, 3.6, gpus=2).usd_per_m_output == pytest.approx(2000 / 2.8)


@pytest.mark.parametrize("price", [0, -1.0, math.nan, math.inf, True])
def test_a_bad_price_is_a_usage_error(price):
    with pytest.raises(UsageError, match="--gpu-hour-price must be a positive number of dollars per GPU-hour"):
        token_cost(summarize(timeline()).throughput, price)


def test_a_run_where_nothing_completed_prices_nothing():
    dead = [RequestTimeline(0, 8, 0.0, error=OOM, ended_s=0.5), RequestTimeline(1, 8, 0.25, error=OOM, ended_s=0.5)]
    m = summarize(dead)
    assert (m.completed, m.failed, m.throughput.output_throughput) == (0, 2, 0.0)
    assert m.latency.ttft_ms is None and m.max_concurrent_requests == 0
    assert token_cost(m.throughput, 3.5).usd_per_m_output is None


def test_timelines_that_cannot_be_real_are_refused():
    with pytest.raises(ValueError, match="must not decrease"):
        RequestTimeline(0, 1, 0.0, (0.5, 0.25))
    with pytest.raises(ValueError, match="precede the send time"):
        RequestTimeline(0, 1, 1.0, (0.5,))
    with pytest.raises(ValueError, match="completed without a token time"):
        RequestTimeline(0, 1, 0.0, ())


def test_percentile_is_numpys_linear_interpolation():
    rng = random.Random(0)
    for n in (1, 2, 7, 100):
        xs = [rng.expovariate(1.0) for _ in range(n)]
        for q in (0, 50, 90, 99, 100):
            assert percentile(xs, q) == pytest.approx(float(np.percentile(xs, q)))


# ----------------------------------------------------------------------------------------------- steady state --

def cold_start() -> list[RequestTimeline]:
    """8 requests every 0.25 s, 100 prompt tokens, 4 output tokens 0.125 s apart; the first two wait 0.5 s for their
    first token (a cold server), the rest 0.0625 s."""
    out = []
    for i in range(8):
        sent = 0.25 * i
        first = sent + (0.5 if i < 2 else 0.0625)
        out.append(RequestTimeline(i, 100, sent, tuple(first + 0.125 * k for k in range(4))))
    return out


def test_the_cold_start_is_reported_apart_from_the_steady_state():
    s = split_warmup(cold_start(), warmup_s=0.5)
    # whole run: 6 × 62.5 and 2 × 500 ms, so p90 (position 6.3 of 0..7) and the mean carry the cold start
    assert (s.whole.latency.ttft_ms.p90, s.whole.latency.ttft_ms.mean) == (500.0, 171.875)
    assert s.steady_latency.ttft_ms.p90 == 62.5 and s.steady_latency.ttft_ms.n == 6
    assert s.cold.requests == 2 and s.cold.latency.ttft_ms.p50 == 500.0
    assert (s.steady_requests, s.steady_failed, s.window_s) == (6, 0, (0.5, 1.75))


def test_steady_throughput_counts_the_servers_work_inside_the_window():
    w = split_warmup(cold_start(), warmup_s=0.5).steady_throughput
    # tokens in [0.5, 1.75): r0..r5 all 4 (cold r0/r1 included: the server made them then), r6 its first 2, r7 none
    assert (w.duration_s, w.output_tokens, w.input_tokens, w.completed) == (1.25, 26, 700, 6)
    assert w.output_throughput == pytest.approx(20.8) and w.total_token_throughput == pytest.approx(580.8)
    assert w.request_throughput == pytest.approx(4.8)
    by_count = split_warmup(cold_start(), warmup_requests=2)
    assert by_count.window_s == (0.5, 1.75) and by_count.steady_throughput == w and by_count.warmup == "2 requests"


def test_steady_goodput_and_the_whole_run_stay_vllms():
    s = split_warmup(cold_start(), warmup_s=0.5, slo=Slo(ttft_ms=100))
    assert s.steady_throughput.good == 4  # r2..r5 complete in the window and meet it; cold r0, r1 do not
    assert s.whole.throughput.good == 6 and s.whole.throughput.duration_s == 2.1875
    w = windowed_throughput(cold_start(), 0.0, 0.5)
    assert (w.output_tokens, w.completed) == (0, 0)  # nothing came out before the first token at 0.5


@pytest.mark.parametrize("kw, message", [
    ({"warmup_s": 2.0}, "covers every arrival of the stream"),
    ({"warmup_s": 1.75}, "covers every arrival"),  # the window would be empty
    ({"warmup_requests": 8}, "covers every arrival"),
    ({"warmup_s": -1.0}, "--warmup-s must be a number of seconds >= 0"),
    ({"warmup_requests": -1}, "--warmup-requests must be a whole number >= 0"),
])
def test_a_warmup_that_leaves_no_steady_state_is_a_usage_error(kw, message):
    with pytest.raises(UsageError, match=message):
        split_warmup(cold_start(), **kw)


def test_steady_state_keeps_failures_in_every_phase():
    s = split_warmup(timeline(), warmup_s=1.0)
    assert s.cold.requests == 2 and s.cold.failed == 0
    assert (s.steady_requests, s.steady_failed) == (4, 3)
    assert s.whole.failed == 3 and s.steady_latency.ttft_ms.n == 1
    assert s.to_json()["steady_failed"] == 3


def test_a_steady_window_shorter_than_a_request_is_too_short_for_a_steady_state():
    """Arrivals after the warm-up spanning less than a request's median end-to-end latency (the H200's 40-request
    stream: 0.95 s against 1.2–3.4 s) give a reason, not numbers; a long enough window gives no reason."""
    from attnprof.serving.continuous import _too_short

    slow = [RequestTimeline(i, 10, 0.25 * i, (0.25 * i + 1.0, 0.25 * i + 2.0)) for i in range(5)]  # E2EL 2 s
    split = split_warmup(slow, warmup_requests=1)  # window 0.25 → 1.0 s
    assert "too short for a steady state" in _too_short(split, slow)
    fast = [RequestTimeline(i, 10, 0.25 * i, (0.25 * i + 0.05, 0.25 * i + 0.1)) for i in range(5)]  # E2EL 0.1 s
    assert _too_short(split_warmup(fast, warmup_requests=1), fast) is None
