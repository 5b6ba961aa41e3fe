"""The watcher records what really ran (from the aten op), with the envelope and the call site."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from attnprof.audit import explain, watch
from attnprof.dispatch.sdpa_checks import preferred_backend
from attnprof.workload import Workload


def qkv(b=1, h=4, s=16, d=8, hk=None, sk=None, dtype=torch.float32):
    return (torch.randn(b, h, s, d, dtype=dtype), torch.randn(b, hk or h, sk or s, d, dtype=dtype),
            torch.randn(b, hk or h, sk or s, d, dtype=dtype))


def test_preferred_backend_on_cpu_is_cpu_flash():
    assert preferred_backend("cpu") == "cpu_flash"


def test_fused_call_records_backend_and_envelope():
    q, k, v = qkv(b=2, h=4, hk=2, s=5, sk=11, d=24)
    with watch() as calls:
        F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    (rec,) = calls
    assert rec.backend == "cpu_flash" and rec.fused and not rec.fell_back
    assert rec.fused_op == "_scaled_dot_product_flash_attention_for_cpu"
    assert rec.q_shape == (2, 4, 5, 24) and rec.k_shape == (2, 2, 11, 24) and rec.v_shape == (2, 2, 11, 24)
    assert rec.gqa and rec.enable_gqa and rec.causal and rec.mask == "none" and rec.dropout == 0.0
    assert rec.dtypes == ("float32",) * 3 and rec.device == "cpu"
    assert rec.strides["q"] == q.stride() and all(rec.contiguous.values())
    assert rec.location and "test_audit_watch.py" in rec.location
    assert rec.to_json()["envelope"] == rec.envelope() == "2x4/2x5→11x24 float32 causal"


@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.float32])
def test_mask_kind_and_dtype(mask_dtype):
    q, k, v = qkv()
    mask = torch.ones(16, 16, dtype=torch.bool).tril()
    if mask_dtype is not torch.bool:
        mask = torch.zeros(16, 16).masked_fill(~mask, float("-inf"))
    with watch() as calls:
        F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    rec = calls[0]
    assert rec.mask == ("bool" if mask_dtype is torch.bool else "additive")
    assert rec.mask_dtype == str(mask_dtype).replace("torch.", "") and rec.mask_shape == (16, 16)


def test_forced_math_is_caught_with_reason():
    q, k, v = qkv()
    with watch() as calls, sdpa_kernel([SDPBackend.MATH]):
        F.scaled_dot_product_attention(q, k, v, is_causal=True)
    rec = calls[0]
    assert rec.backend == "math" and rec.fused_op is None and not rec.fused and rec.fell_back
    assert "bmm" in rec.ops  # the math path's own operators, as executed
    assert "switched off" in rec.refusals["cpu_flash"]
    text = explain(rec).text()
    assert "ran math, not cpu_flash" in text and "sdpa_kernel" in text


def test_dropout_fallback_reason_comes_from_pytorchs_choice():
    q, k, v = qkv()
    with watch() as calls:
        F.scaled_dot_product_attention(q, k, v, dropout_p=0.25)
    rec = calls[0]
    assert rec.backend == "math" and rec.dropout == 0.25
    assert "dropout_p=0.25" in rec.refusals["cpu_flash"]
    assert any("dropout_p=0.0" in tip for tip in explain(rec).advice)


def test_strided_last_dim_fallback_reason():
    q, k, v = (t.transpose(-1, -2).contiguous().transpose(-1, -2) for t in qkv())
    with watch() as calls:
        F.scaled_dot_product_attention(q, k, v)
    rec = calls[0]
    assert rec.backend == "math" and not rec.contiguous["q"]
    assert "not contiguous" in rec.refusals["cpu_flash"]
    assert any(".contiguous()" in tip for tip in explain(rec).advice)


def test_nothing_recorded_outside_the_block_and_records_are_ordered():
    q, k, v = qkv()
    with watch() as calls:
        F.scaled_dot_product_attention(q, k, v)
        with sdpa_kernel([SDPBackend.MATH]):
            F.scaled_dot_product_attention(q, k, v)
    F.scaled_dot_product_attention(q, k, v)
    assert [c.backend for c in calls] == ["cpu_flash", "math"] and [c.index for c in calls] == [0, 1]


def test_transformers_model_call_sites_one_per_layer():
    from attnprof.audit.model import audit_model

    audit = audit_model("tiny-llama", batch=2, seq=12)
    paths = [r.module for r in audit.records]
    assert paths == [f"model.layers.{i}.self_attn" for i in range(audit.layers)]
    assert all(r.module_class == "LlamaAttention" for r in audit.records)
    assert all(r.q_shape[0] == 2 and r.q_shape[2] == 12 for r in audit.records)


def test_call_site_of_a_plain_module():
    class Attn(torch.nn.Module):
        def forward(self, q, k, v):
            return F.scaled_dot_product_attention(q, k, v)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = torch.nn.ModuleList([Attn(), Attn()])

        def forward(self, q, k, v):
            return self.blocks[1](self.blocks[0](q, k, v), k, v)

    with watch() as calls:
        Net()(*qkv())
    assert [c.module for c in calls] == ["blocks.0", "blocks.1"]


def test_eager_flex_attention_is_recorded_as_unfused():
    from torch.nn.attention.flex_attention import flex_attention

    q, k, v = qkv()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with watch(hook="mode") as calls:  # eager flex is seen by the TorchFunctionMode hook
            flex_attention(q, k, v)
    assert [c.kind for c in calls] == ["flex"]
    assert not calls[0].fused and calls[0].fell_back and "torch.compile" in explain(calls[0]).advice[0]


def test_explain_workload_on_cpu():
    ok = explain(Workload(batch=1, heads=2, seq=8, head_dim=16))
    assert ok.ok and ok.backend == "cpu_flash"


def test_patch_hook_restores_sdpa_and_reuses_identical_envelopes():
    import torch.nn.functional as F

    from attnprof.dispatch.watch import clear_cache

    original = F.scaled_dot_product_attention
    q, k, v = qkv()
    clear_cache()  # the cache is process-wide: earlier tests may have observed this envelope already
    with watch() as calls:
        for _ in range(3):
            F.scaled_dot_product_attention(q, k, v, is_causal=True)
        with sdpa_kernel([SDPBackend.MATH]):  # other enabled backends: a different envelope, observed afresh
            F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert F.scaled_dot_product_attention is original
    assert [c.observed for c in calls] == [True, False, False, True]
    assert [c.backend for c in calls] == ["cpu_flash", "cpu_flash", "cpu_flash", "math"]
    assert [c.index for c in calls] == [0, 1, 2, 3]


def test_a_fallback_call_is_also_observed_once_per_envelope():
    """A call that falls back gets its reasons (a second cache); that must not stop the envelope cache working.
    (Found on the H200, where every watched call fell back and was observed afresh: ~80 µs each.)"""
    import torch.nn.functional as F

    from attnprof.dispatch.watch import clear_cache

    q, k, v = qkv()
    clear_cache()
    with watch() as calls, sdpa_kernel([SDPBackend.MATH]):  # the CPU's preferred backend (cpu_flash) is disabled
        for _ in range(3):
            F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert [c.backend for c in calls] == ["math"] * 3
    assert all(c.fell_back and c.refusals for c in calls), [c.refusals for c in calls]
    assert [c.observed for c in calls] == [True, False, False]


def test_observe_every_records_the_operators_of_every_call():
    import torch.nn.functional as F

    q, k, v = qkv()
    with watch(observe="every") as calls:
        for _ in range(2):
            F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert all(c.observed and c.ops for c in calls)


def test_a_reference_bound_before_the_block_needs_the_mode_hook():
    from torch.nn.functional import scaled_dot_product_attention as bound  # bound at import, as some code does

    q, k, v = qkv()
    with watch() as patched:
        bound(q, k, v)
    with watch(hook="mode") as moded:
        bound(q, k, v)
    assert patched == [] and [c.backend for c in moded] == ["cpu_flash"]
