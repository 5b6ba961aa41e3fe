"""Where a slower decode loses its time: the answer picks "per new shape inside attention" only when the repeat pass
and the cold profile show it, and names cuDNN only when the row's recorded dispatch says cudnn."""

from __future__ import annotations

import pytest

from attnprof.serving.cost import annotate_static, answer
from attnprof.serving.share import Share
from attnprof.serving.throughput import Point


def _point(impl, first, repeat, warm_host, cold_host, backends=(), warm_wall=35.0, cold_wall=None):
    """A decode point at batch 1, context 1024 (16 new tokens): first-pass and repeat-pass ITL p50, and the host
    time inside the attention calls of a warm and a cold profiled step (ms)."""
    share = Share(attention_ms=0.2, busy_ms=2.5, backends=backends, attention_host_ms=warm_host,
                  step_wall_ms=warm_wall)
    cold = Share(attention_ms=0.2, busy_ms=2.5, backends=backends, attention_host_ms=cold_host,
                 step_wall_ms=cold_wall or warm_wall + cold_host - warm_host)
    return Point(impl=impl, mode="decode", batch=1, context=1024, new_tokens=16, tokens=15, seconds=15 * first / 1e3,
                 step_ms=first, itl_ms={"p50": first, "p99": first * 1.2},
                 itl_repeat_ms={"p50": repeat, "p99": repeat * 1.2}, share=share, cold_share=cold, cold_context=1041)


def _answer(*points):
    return answer([], annotate_static([p.to_json() for p in points], "decode", 3.5), [], 3.5)


EAGER = _point("eager", 22.9, 22.5, warm_host=9.1, cold_host=9.5, warm_wall=40.0, cold_wall=41.0)


def test_a_cost_paid_once_per_new_kv_length_inside_attention():
    # the H200 pattern: 80 ms per step on new KV lengths, 21 on the repeat pass, the cold step's attention calls
    # take ~60 ms of host time where warm ones take 4
    text = _answer(EAGER, _point("sdpa", 80.1, 21.0, warm_host=4.0, cold_host=62.0, backends=("cudnn",)))
    assert ("sdpa loses 57.2 ms per step to eager on the first pass over new KV lengths but gains 1.5 ms on a repeat "
            "pass over the same lengths (its profiled steps took 35 ms warm and 93 cold, eager's 40 and 41); in a "
            "cold step its attention calls take 62 ms of host time (4 warm; eager's 9.5 cold): the cost is paid once "
            "per new KV length, inside the attention calls (its SDPA calls ran cuDNN") in text
    assert "neither its GPU work" not in text and "host outside" not in text


def test_cudnn_is_named_only_when_the_dispatch_says_cudnn():
    text = _answer(EAGER, _point("sdpa-flash", 80.1, 21.0, warm_host=4.0, cold_host=62.0, backends=("flash",)))
    assert "inside the attention calls." in text and "cuDNN" not in text


@pytest.mark.parametrize("repeat, cold_host", [
    (78.0, 62.0),  # still slow on the repeat pass: not a first-sight cost, whatever the cold step says
    (21.0, 4.2),  # gone on the repeat pass, but the cold step's attention calls are as fast as warm ones
])
def test_without_both_signs_the_answer_keeps_the_measured_fallback(repeat, cold_host):
    text = _answer(EAGER, _point("sdpa", 80.1, repeat, warm_host=4.0, cold_host=cold_host, backends=("cudnn",)))
    assert "sdpa loses 57.2 ms per step to eager on the first pass over new KV lengths" in text
    assert ("neither its GPU work (2.5 ms busy per step, eager 2.5) nor the host time inside its attention calls "
            "(4 ms, eager 9.1) explains it: the time goes to the host outside the attention calls, or to waiting. "
            f"In a cold step its attention calls take {cold_host:.3g} ms of host time (4 warm).") in text
    assert "once per new KV length" not in text and "cuDNN" not in text


def test_rows_without_a_repeat_pass_or_cold_profile_read_as_before():
    old = [p.to_json() for p in (EAGER, _point("sdpa", 80.1, 21.0, warm_host=4.0, cold_host=62.0))]
    for r in old:  # a report written before the repeat pass and the cold profile existed
        del r["itl_repeat_ms"], r["cold_share"]
    text = answer([], annotate_static(old, "decode", 3.5), [], 3.5)
    assert "sdpa loses 57.2 ms per step to eager (its profiled steps took 35 ms, eager's 40); neither" in text
    assert "first pass" not in text and "cold step" not in text
