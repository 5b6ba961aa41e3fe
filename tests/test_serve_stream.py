"""Serving a request stream through transformers' continuous batching on the CPU (the stream itself, drawn or read
from a file, is tests/test_serve_requests.py's)."""

from __future__ import annotations

import json

import pytest

from attnprof.models import build_model
from attnprof.serving.continuous import serve_stream
from attnprof.serving.requests import Request


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
