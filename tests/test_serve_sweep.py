"""The load sweep (serving/sweep.py): throughput per GPU against tokens/s per user, its Pareto front, the best point
at an interactivity floor, and $/1M output tokens along it; hand-computed points."""

from __future__ import annotations

import pytest

from attnprof.errors import UsageError
from attnprof.serving.metrics import RequestTimeline, summarize
from attnprof.serving.sweep import Sweep, SweepPoint


def point(impl: str, load: float, per_user: float | None, per_gpu: float, failed: int = 0) -> SweepPoint:
    return SweepPoint(impl, load, per_gpu, per_user, None, None, None, 10 - failed, failed)


A = [point("a", 1, 50, 100), point("a", 2, 40, 300), point("a", 4, 30, 250), point("a", 8, 10, 400)]
B = [point("b", 1, 60, 200, failed=1), point("b", 2, 45, 350), point("b", 4, None, 500)]


def test_a_point_from_a_served_stream():
    timelines = [RequestTimeline(0, 10, 0.0, (0.125, 0.1875, 0.25, 0.375)), RequestTimeline(1, 20, 0.25, (0.5, 0.625)),
                 RequestTimeline(2, 30, 1.0, (1.0625,)), RequestTimeline(3, 5, 1.5, error="late", ended_s=2.5)]
    p = SweepPoint.from_metrics("eager", 4, summarize(timelines), gpus=2, gpu_hour_price=3.6)
    assert p.output_tokens_per_s_per_gpu == pytest.approx(7 / 2.5 / 2)
    assert p.tpot_p50_ms == pytest.approx(625 / 6) and p.tokens_per_s_per_user == pytest.approx(9.6)
    assert p.ttft_p50_ms == 125.0 and (p.completed, p.failed) == (3, 1)
    assert p.usd_per_m_output == pytest.approx(7.2 / (2.8 * 3600) * 1e6)  # two GPUs' hour on 2.8 output tokens/s


def test_the_pareto_front_drops_dominated_loads():
    s = Sweep("concurrency", 1, 3.5, tuple(A + B))
    assert [p.load for p in s.pareto("a")] == [1, 2, 8]  # load 4 (30, 250) is beaten by load 2 (40, 300)
    assert [p.load for p in s.pareto("b")] == [1, 2]  # load 4 has no TPOT: not on a per-user axis
    assert [p.load for p in s.curve("a")] == [1, 2, 4, 8] and s.impls() == ["a", "b"]
    assert s.to_json()["pareto"] == {"a": [1, 2, 8], "b": [1, 2]}


def test_best_at_an_interactivity_floor():
    s = Sweep("concurrency", 1, 3.5, tuple(A + B))
    assert {k: v and v.load for k, v in s.best_at(35).items()} == {"a": 2, "b": 2}
    assert {k: v and v.load for k, v in s.best_at(55).items()} == {"a": None, "b": None}  # b's 60 tok/s point failed
    assert s.best_at(5)["a"].output_tokens_per_s_per_gpu == 400


@pytest.mark.parametrize("make, error, message", [
    (lambda: Sweep("qps", 1, 3.5, ()), UsageError, "axis must be one of concurrency, rate"),
    (lambda: Sweep("concurrency", 0, 3.5, ()), UsageError, "--gpus must be a whole number >= 1"),
    (lambda: Sweep("concurrency", 1, 3.5, (point("a", 1.5, 1, 1),)), UsageError, "whole number of requests"),
    (lambda: Sweep("rate", 1, 3.5, (point("a", 0, 1, 1),)), UsageError, "must be positive"),
    (lambda: Sweep("rate", 1, 3.5, (point("a", 2, 1, 1), point("a", 2, 3, 4))), ValueError, "appears twice"),
])
def test_a_bad_sweep_is_refused(make, error, message):
    with pytest.raises(error, match=message):
        make()
    assert Sweep("rate", 2, 3.5, (point("a", 0.5, 1, 1),)).axis == "rate"  # fractional rates are fine
