"""The request stream (Poisson / JSONL) and serving it through transformers' continuous batching on the CPU."""

from __future__ import annotations

import json
import statistics

import pytest

from attnprof.errors import UsageError
from attnprof.models import build_model
from attnprof.serving.continuous import Request, check_fits, load_requests, poisson_requests, serve_stream


def test_poisson_stream_is_seeded_clipped_and_at_the_rate():
    kw = dict(prompt_median=100, prompt_sigma=0.8, output_median=20, output_sigma=0.5, max_prompt=300,
              max_output=50)
    a = poisson_requests(2000, 8.0, seed=3, **kw)
    assert a == poisson_requests(2000, 8.0, seed=3, **kw)
    assert a[0].arrival_s == 0 and all(x.arrival_s <= y.arrival_s for x, y in zip(a, a[1:]))
    assert all(1 <= r.prompt_tokens <= 300 and 1 <= r.output_tokens <= 50 for r in a)
    gaps = [y.arrival_s - x.arrival_s for x, y in zip(a, a[1:])]
    assert statistics.mean(gaps) == pytest.approx(1 / 8.0, rel=0.1)
    assert statistics.median(r.prompt_tokens for r in a) == pytest.approx(100, rel=0.15)


@pytest.mark.parametrize("rate", [0.0, -1.0, float("nan")])
def test_rate_must_be_positive(rate):
    with pytest.raises(UsageError, match="--rate must be a positive"):
        poisson_requests(4, rate, prompt_median=8, prompt_sigma=0.5, output_median=4, output_sigma=0.5,
                         max_prompt=16, max_output=8)


def test_request_file_replays_lengths_and_arrivals(tmp_path):
    f = tmp_path / "reqs.jsonl"
    f.write_text('{"prompt_tokens": 5, "output_tokens": 2, "arrival_s": 0.5}\n\n'
                 '{"prompt_tokens": 7, "output_tokens": 3, "arrival_s": 0.1}\n')
    assert load_requests(f) == [Request(0.1, 7, 3), Request(0.5, 5, 2)]
    g = tmp_path / "lengths.jsonl"
    g.write_text('{"prompt_tokens": 5, "output_tokens": 2}\n{"prompt_tokens": 9, "output_tokens": 4}\n')
    reqs = load_requests(g, rate=2.0)
    assert [(r.prompt_tokens, r.output_tokens) for r in reqs] == [(5, 2), (9, 4)] and reqs[0].arrival_s == 0


@pytest.mark.parametrize("lines, where, what", [
    (['{"prompt_tokens": 5, "output_tokens": 2}', "{not json"], ":2:", "not JSON"),
    (['{"prompt_tokens": 5, "output_tokens": 2}', '{"prompt_tokens": 0, "output_tokens": 2}'], ":2:",
     "prompt_tokens must be a positive integer"),
    (['{"prompt_tokens": 5, "output_tokens": 2.5}'], ":1:", "output_tokens must be"),
    (['[5, 2]'], ":1:", "expected an object"),
    (['{"prompt_tokens": 5, "output_tokens": 2, "arrival_s": 0}', '', '{"prompt_tokens": 5, "output_tokens": 2}'],
     ":3:", "arrival_s missing here"),
    (['{"prompt_tokens": 5, "output_tokens": 2, "arrival_s": -1}'], ":1:", "arrival_s must be"),
])
def test_a_bad_request_line_is_named(tmp_path, lines, where, what):
    f = tmp_path / "bad.jsonl"
    f.write_text("\n".join(lines) + "\n")
    with pytest.raises(UsageError) as info:
        load_requests(f, rate=1.0)
    assert where in str(info.value) and what in str(info.value)


def test_missing_file_and_too_long_requests(tmp_path):
    with pytest.raises(UsageError, match="no such request file"):
        load_requests(tmp_path / "nope.jsonl", rate=1.0)
    with pytest.raises(UsageError, match="request 1: 1000 prompt \\+ 30 output tokens exceed"):
        check_fits([Request(0, 10, 10), Request(0.1, 1000, 30)], 1024)


@pytest.fixture(scope="module")
def model():
    return build_model("tiny-llama", attn_implementation="eager")


@pytest.mark.parametrize("impl, ran_as", [("eager", "paged|eager"), ("sdpa", "sdpa")])
def test_stream_is_served_and_every_token_counted(model, impl, ran_as):
    reqs = [Request(0.0, 12, 3), Request(0.01, 20, 5), Request(0.02, 7, 2)]
    r = serve_stream(model, impl, reqs, device="cpu", timeout_s=60)
    assert r.status == "ok" and r.failures == [] and r.completed == 3
    assert r.ran_as.endswith(ran_as)
    assert r.input_tokens == 12 + 20 + 7
    assert r.output_tokens == 3 + 5 + 2 and r.short == 0
    assert r.ttft_ms["p50"] > 0 and r.itl_ms["p99"] >= r.itl_ms["p50"] > 0
    assert model.config._attn_implementation == "eager"  # put back as it was


def test_unsupported_implementation_is_rejected_with_reason(model):
    r = serve_stream(model, "flex_attention", [Request(0.0, 4, 2)], device="cpu")
    assert r.status == "rejected" and "no paged form of 'flex_attention'" in r.reason


def test_unfinished_requests_count_as_failed(model):
    reqs = [Request(0.0, 8, 2), Request(60.0, 8, 2)]  # the second arrives after the deadline
    r = serve_stream(model, "sdpa", reqs, device="cpu", timeout_s=3.0)
    assert r.completed == 1 and r.output_tokens == 2
    assert r.failed == 1 and r.failures[0]["request"] == 1 and "limit" in r.failures[0]["error"]
    assert json.dumps(r.to_json())  # serialisable
