"""`attnprof.expect_fused`: passes a clean fused run, fails a fallback with the reason, usable in any suite."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import attnprof


def qkv(s=16):
    return torch.randn(1, 4, s, 8), torch.randn(1, 4, s, 8), torch.randn(1, 4, s, 8)


def test_clean_fused_run_passes():
    q, k, v = qkv()
    with attnprof.expect_fused() as calls:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert out.shape == q.shape and [c.backend for c in calls] == ["cpu_flash"]


def test_forced_math_fails_with_reason_and_site():
    q, k, v = qkv()
    with pytest.raises(AssertionError) as info:
        with attnprof.expect_fused(), sdpa_kernel([SDPBackend.MATH]):
            F.scaled_dot_product_attention(q, k, v, is_causal=True)
    msg = str(info.value)
    assert "1 of 1 attention call(s)" in msg and "ran math" in msg
    assert "cpu_flash refused" in msg and "switched off" in msg and "test_audit_expect.py" in msg


def test_dropout_fallback_fails_and_names_dropout():
    q, k, v = qkv()
    with pytest.raises(AssertionError, match="dropout_p=0.5"):
        with attnprof.expect_fused():
            F.scaled_dot_product_attention(q, k, v, is_causal=True)
            F.scaled_dot_product_attention(q, k, v, dropout_p=0.5)


def test_allow_names_acceptable_backends():
    q, k, v = qkv()
    with attnprof.expect_fused(allow=["math", "cpu_flash"]), sdpa_kernel([SDPBackend.MATH]):
        F.scaled_dot_product_attention(q, k, v)
    with pytest.raises(AssertionError, match="outside allow=\\['flash'\\]"):
        with attnprof.expect_fused(allow=["flash"]):
            F.scaled_dot_product_attention(q, k, v)


def test_unknown_allow_name_is_refused_before_running():
    ran = []
    with pytest.raises(ValueError, match="unknown backend"):
        with attnprof.expect_fused(allow=["flashy"]):
            ran.append(1)
    assert not ran


def test_no_attention_call_is_a_failure_unless_allowed():
    with pytest.raises(AssertionError, match="at least 1 attention call"):
        with attnprof.expect_fused():
            torch.ones(3) @ torch.ones(3)
    with attnprof.expect_fused(min_calls=0):
        pass


def test_exception_in_the_block_propagates_unchanged():
    with pytest.raises(KeyError):
        with attnprof.expect_fused():
            raise KeyError("mine")


def test_real_model_sdpa_passes_and_eager_fails():
    from attnprof.models import build_model, padded_batch

    sdpa = build_model("tiny-qwen", attn_implementation="sdpa")
    ids, mask = padded_batch(sdpa.config, batch=2, seq=10)
    with torch.no_grad(), attnprof.expect_fused() as calls:
        sdpa(input_ids=ids, attention_mask=mask)
    assert len(calls) == sdpa.config.num_hidden_layers
    eager = build_model("tiny-qwen", attn_implementation="eager")
    with pytest.raises(AssertionError, match="attn_implementation='sdpa'"):
        with torch.no_grad(), attnprof.expect_fused():
            eager(input_ids=ids, attention_mask=mask)
