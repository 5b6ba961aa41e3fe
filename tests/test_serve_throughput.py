"""Prefill / decode on a real transformers model (tiny preset, CPU): tokens counted from outputs, attention scoped."""

from __future__ import annotations

import math

import pytest
import torch
from torch.profiler import profile

from attnprof.errors import UsageError
from attnprof.measure.timing import percentile
from attnprof.models import build_model
from attnprof.serving.share import ATTENTION_RANGE, attention_scope
from attnprof.serving.throughput import (
    amdahl,
    cold_context,
    measure_decode,
    measure_prefill,
    resolve_impls,
)


@pytest.fixture(scope="module")
def model():
    return build_model("tiny-llama", attn_implementation="eager")


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_prefill_counts_the_tokens_in_the_cache(model, impl):
    model.set_attn_implementation(impl)
    p = measure_prefill(model, impl, batch=2, context=17, device="cpu", reps=2)
    assert p.status == "ok"
    assert p.tokens == 2 * 17
    assert p.tokens_per_s == pytest.approx(p.tokens / p.seconds)
    assert p.share.attention_ms > 0 and p.share.basis == "cpu-ops"
    assert p.share.attention_host_ms == p.share.attention_ms  # on the CPU the attention's op time is host time
    assert 0 < p.attention_share < 1
    if impl == "sdpa":
        assert "fused_attention" in p.share.roles and p.share.backends == ("cpu_flash",)
    else:  # the tutorial's pieces, no fused kernel
        assert {"gemm", "softmax"} <= set(p.share.roles) and "fused_attention" not in p.share.roles


def test_decode_counts_generated_tokens_and_times_only_decode(model):
    model.set_attn_implementation("sdpa")
    p = measure_decode(model, "sdpa", batch=3, context=9, new_tokens=5, device="cpu")
    assert p.status == "ok" and p.new_tokens == 5
    assert p.tokens == 3 * (5 - 1)  # the first new token belongs to the prefill
    assert p.itl_ms["p50"] > 0 and p.itl_ms["p99"] >= p.itl_ms["p50"]
    assert p.share is not None and p.share.attention_ms > 0
    # the repeat pass: the same generate again, timed the same way
    assert math.isfinite(p.itl_repeat_ms["p99"]) and p.itl_repeat_ms["p99"] >= p.itl_repeat_ms["p50"] > 0
    # the cold profile: a prompt past every KV length the point used (9 + 5 + 1), its steps recorded
    assert p.cold_context == 15 and p.cold_share is not None
    assert math.isfinite(p.cold_share.step_wall_ms) and p.cold_share.step_wall_ms > 0
    assert p.cold_share.attention_host_ms > 0 and p.cold_share.backends == p.share.backends == ("cpu_flash",)
    data = p.to_json()
    assert data["itl_repeat_ms"] == p.itl_repeat_ms and data["cold_share"]["step_wall_ms"] == p.cold_share.step_wall_ms
    assert data["cold_context"] == 15


def test_the_cold_prompt_meets_kv_lengths_the_point_never_used():
    # timed passes decode over KV lengths 101 … 108; the cold steps (3) over 111 … 113, or below the prompt
    assert cold_context(100, 9, 3, max_positions=4096) == 110
    assert cold_context(100, 9, 3, max_positions=None) == 110
    assert cold_context(100, 9, 3, max_positions=112) == 95  # 110 + 4 tokens would not fit: steps reach 98
    assert cold_context(4, 9, 3, max_positions=14) is None  # neither fits


def test_attention_scope_wraps_every_layer_and_changes_nothing(model):
    model.set_attn_implementation("eager")
    ids = torch.randint(3, model.config.vocab_size, (1, 11))
    with torch.inference_mode():
        plain = model(input_ids=ids).logits
        with attention_scope(model), profile() as prof:
            scoped = model(input_ids=ids).logits
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    ranges = [e for e in prof.events() if e.name == ATTENTION_RANGE]
    assert len(ranges) == model.config.num_hidden_layers
    torch.testing.assert_close(scoped, plain, rtol=0, atol=0)
    assert "eager" not in ALL_ATTENTION_FUNCTIONS._local_mapping  # restored


def test_amdahl_and_percentiles():
    # half the step was attention, attention got 10× faster → 1 / (0.5 + 0.05)
    assert amdahl(0.5, 10.0, 1.0) == pytest.approx(1 / 0.55)
    assert amdahl(0.0, 10.0, 1.0) == pytest.approx(1.0)
    assert percentile([1, 2, 3, 4, 5], 50) == 3
    assert percentile([1.0, 2.0], 99) == pytest.approx(1.99)


def test_impls_put_eager_first_and_refuse_unknown_names(model):
    assert [i.name for i in resolve_impls("sdpa,eager", "cpu")] == ["eager", "sdpa"]
    no_kernel = resolve_impls(None, "cpu", config=model.config, dtype="fp32")  # what `serve` asks: with the model
    assert [i.name for i in no_kernel] == ["eager", "sdpa"]  # no kernel on a CPU
    kernel = resolve_impls("kernel", "cpu", config=model.config, dtype="fp32")[0]
    assert kernel.rejected and "fp32" in kernel.rejected
    with pytest.raises(UsageError, match="unknown attention implementation 'fast'"):
        resolve_impls("eager,fast", "cpu")


def test_a_pinned_sdpa_backend_runs_inside_its_context(model):
    (pinned,) = resolve_impls("sdpa-math", "cpu", config=model.config, dtype="fp32")
    assert pinned.rejected is None and pinned.attn_implementation == "sdpa"
    model.set_attn_implementation(pinned.attn_implementation)
    with pinned.context():
        p = measure_prefill(model, "sdpa-math", batch=1, context=13, device="cpu", reps=1)
    assert p.tokens == 13 and "fused_attention" not in p.share.roles  # math: the unfused ops, no fused kernel


def test_decode_steps_are_marked_between_generates_own_tokens():
    """The profiled decode steps are the gaps between the tokens `generate` streams (not a hand-written loop):
    `steps` complete ranges, none left open, the prompt's put not counted."""
    from torch.profiler import ProfilerActivity, profile

    from attnprof.serving.share import STEP_RANGE
    from attnprof.serving.throughput import _StepMarks

    marks = _StepMarks(steps=3)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for token in range(6):  # the prompt, then 5 new tokens: ranges 1→2, 2→3, 3→4
            marks.put(token)
            torch.ones(4).sum()
        marks.end()
    ranges = [e for e in prof.events() if e.name == STEP_RANGE]
    assert len(ranges) == 3 and marks.open is None
