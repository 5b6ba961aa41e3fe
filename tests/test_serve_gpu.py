"""`serve` on a CUDA GPU: kernel-time attention share, the stage-four kernel inside a model, continuous batching."""

from __future__ import annotations

import json

import pytest

from attnprof.models import build_model
from attnprof.serving.continuous import serve_stream
from attnprof.serving.requests import Request
from attnprof.serving.throughput import measure_decode, measure_prefill, resolve_impls

pytestmark = pytest.mark.cuda

# Llama-shaped, small, head dim 64 (what fused kernels support everywhere), GQA 8:2.
SMALL = {"model_type": "llama", "hidden_size": 512, "intermediate_size": 1024, "num_hidden_layers": 2,
         "num_attention_heads": 8, "num_key_value_heads": 2, "vocab_size": 1024, "max_position_embeddings": 4096}


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("cfg") / "config.json"
    path.write_text(json.dumps(SMALL))
    return build_model(str(path), attn_implementation="eager", dtype="bf16", device="cuda")


@pytest.mark.parametrize("impl", ["eager", "sdpa", "sdpa-cudnn", "kernel"])
def test_prefill_and_decode_on_the_gpu(model, impl):
    (chosen,) = resolve_impls(impl, "cuda", config=model.config, dtype="bf16", context=512)
    if chosen.rejected:
        pytest.skip(f"{impl}: {chosen.rejected}")
    model.set_attn_implementation(chosen.attn_implementation)
    with chosen.context():
        p = measure_prefill(model, impl, batch=2, context=512, device="cuda", reps=3)
        d = measure_decode(model, impl, batch=4, context=256, new_tokens=6, device="cuda")
    assert p.status == "ok" and p.tokens == 1024 and p.share.basis == "gpu-kernels"
    assert 0 < p.attention_share < 1 and p.peak_mib > 0
    if impl == "eager":
        assert "fused_attention" not in p.share.roles and "softmax" in p.share.roles
    else:
        assert "fused_attention" in p.share.roles
        expected = {"kernel": {"kernel"}, "sdpa-cudnn": {"cudnn"}}.get(impl, {"cudnn", "flash", "efficient"})
        assert set(p.share.backends) <= expected
    assert d.status == "ok" and d.tokens == 4 * 5 and d.share.attention_ms > 0
    assert d.share.attention_host_ms is not None and d.share.attention_host_ms > 0


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_continuous_batching_on_the_gpu(model, impl):
    reqs = [Request(0.0, 100, 8), Request(0.01, 300, 5), Request(0.02, 40, 12)]
    r = serve_stream(model, impl, reqs, device="cuda", timeout_s=60, num_blocks=64, max_batch_tokens=512)
    assert r.failures == [] and r.completed == 3
    assert r.output_tokens == 25 and r.input_tokens == 440
