"""`attnprof verify --kv-dtype fp8`: the keys and values as an FP8 KV cache, on the CPU.

The gate judges each variant against the fp64 oracle of the dequantised cache it was given (a wrong descale is a
failure, whatever the format's own rounding), and each row also says what the cache costs: its error against the
oracle of the unquantized keys/values, as a multiple of plain PyTorch's error on those (`lossy_factor`). Our kernel
reads the FP8 bytes through `flash_attn_with_kvcache` (Triton's interpreter, in a child process); user functions
with a `kv_cache=` parameter get the cache as stored (`tests.broken:fp8_*`).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest
import torch

from attnprof.cli import main
from attnprof.errors import UsageError
from attnprof.workload import Workload, quantize_kv
from interpreter_child import child_report

INTERPRETER_CHILD = True  # its child starts in the background once tests are collected (conftest.py)

ROOT = Path(__file__).resolve().parents[1]
CONFIG = {"model_type": "llama", "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 1,
          "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512, "max_position_embeddings": 256,
          "head_dim": 64}  # head dim 64: one the kernel takes (tiny-llama's 32 is not)
BROKEN = ("tests.broken:fp8_k_descale_2x", "tests.broken:fp8_v_descale_ignored")


def test_quantized_cache_is_exact_in_the_workload_dtype_and_within_the_format():
    w = Workload(batch=2, heads=4, kv_heads=2, seq=16, head_dim=64, dtype="fp16", kv_dtype="e4m3")
    assert w.kv_dtype == "fp8" and "kv=fp8" in w.label() and w.to_json()["kv_dtype"] == "fp8"
    i = w.make_inputs(0)
    c = i.fp8
    assert c.k.dtype == torch.float8_e4m3fn and c.k_descale.shape == (2, 2)
    assert torch.equal(torch.exp2(torch.log2(c.k_descale).round()), c.k_descale)  # powers of two
    exact = c.k.double() * c.k_descale.double()[:, :, None, None]
    assert torch.equal(i.k.double(), exact)  # the dequantised values the oracle and the variants get: exact
    assert c.k.float().abs().amax() <= 448 and c.k.float().abs().amax() > 224  # the range is used, not wasted
    err = ((i.k - c.k_orig).double().norm() / c.k_orig.double().norm()).item()
    assert 0.005 < err < 0.05  # e4m3's 3 mantissa bits: a few percent, and not zero (it was quantized)
    assert i.unquantized().k is c.k_orig and i.unquantized().fp8 is None
    plain = w.replace(kv_dtype=None)
    assert w.input_bytes() < plain.input_bytes()  # one byte per cached element


def test_e5m2_and_bad_kv_dtypes():
    c = Workload(seq=8, dtype="bf16", kv_dtype="fp8_e5m2").make_inputs(1).fp8
    assert c.v.dtype == torch.float8_e5m2
    x = torch.tensor([960.0, -1000.0, 3.0, 0.0]).view(1, 1, 1, 4)
    x8, d, deq = quantize_kv(x, torch.float8_e4m3fn)
    assert d.item() == 4.0  # the power of two that brings 1000 under 448
    assert deq.flatten().tolist() == [960.0, -1024.0, 3.0, 0.0]  # 240·4 exact; 250 rounds to 256 (e4m3's grid)
    with pytest.raises(UsageError, match="unknown KV-cache dtype 'fp7'"):
        Workload(kv_dtype="fp7")
    with pytest.raises(UsageError, match="not fp64"):
        Workload(dtype="fp64", kv_dtype="fp8")


def test_a_wrong_descale_fails_the_gate_and_the_cost_is_reported(tmp_path, capsys):
    out = tmp_path / "v"
    rc = main(["verify", "--device", "cpu", "--dtype", "fp16", "--kv-dtype", "fp8", "--cases", "gqa,chunk",
               "--variants", ",".join(["sdpa", "tests.broken:fp8_correct", *BROKEN]), "--seed", "3",
               "--out", str(out)])
    assert rc == 1  # the broken descales fail
    data = json.loads((out / "verify.json").read_text())
    summary = data["kernel"]["summary"]
    assert summary["sdpa"]["status"] == "pass" and summary["tests.broken:fp8_correct"]["status"] == "pass"
    for name in BROKEN:
        assert summary[name]["status"] == "fail", name
    assert all(c["workload"]["kv_dtype"] == "fp8" for c in data["kernel"]["cases"])
    sdpa = [r for c in data["kernel"]["cases"] for r in c["results"] if r["variant"] == "sdpa"]
    assert all(r["lossy_factor"] > 5 for r in sdpa), [r["lossy_factor"] for r in sdpa]  # e4m3 costs >> fp16
    md = (out / "verify.md").read_text()
    assert "fp8 KV cache" in md and "× plain PyTorch fp16" in md
    reads = {r["variant"]: r["kv_read"] for c in data["kernel"]["cases"] for r in c["results"]}
    assert reads["sdpa"] == "the cache dequantised" and "kv_cache=" in reads["tests.broken:fp8_correct"]
    assert "`sdpa` the cache dequantised" in md
    assert "fp8 KV cache, fp16" in capsys.readouterr().out


def test_without_the_flag_nothing_is_quantized(tmp_path):
    rc = main(["verify", "--device", "cpu", "--dtype", "fp16", "--cases", "gqa", "--variants",
               "sdpa,tests.broken:fp8_correct", "--seed", "3", "--out", str(tmp_path / "v")])
    data = json.loads((tmp_path / "v" / "verify.json").read_text())
    assert rc == 0 and all(r["lossy_factor"] is None for c in data["kernel"]["cases"] for r in c["results"])


@pytest.mark.parametrize("argv, words", [
    (["--kv-dtype", "fp7"], "unknown KV-cache dtype 'fp7'"),
    (["--kv-dtype", "fp8", "--dtype", "fp64"], "not fp64"),
])
def test_bad_kv_dtype_use_is_one_line_and_exit_2(tmp_path, capsys, argv, words):
    assert main(["verify", "--device", "cpu", *argv, "--out", str(tmp_path / "v")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0], err
    assert not (tmp_path / "v").exists()


def test_model_level_over_an_fp8_cache_gates_each_implementation_and_says_what_it_costs(tmp_path, capsys):
    rc = main(["verify", "--device", "cpu", "--model", "tiny-llama", "--dtype", "fp32,bf16", "--kv-dtype", "fp8",
               "--impls", "eager,sdpa", "--seed", "2", "--out", str(tmp_path / "v")])
    assert rc == 0
    model = json.loads((tmp_path / "v" / "verify.json").read_text())["model"]
    rows = {(r["impl"], r["dtype"]): r for r in model["results"]}
    for dtype in ("fp32", "bf16"):
        assert rows[("sdpa (kv fp8)", dtype)]["status"] == "pass"
        assert rows[("eager (kv fp8)", dtype)]["status"] == "baseline"
        cost = model["fp8_cost"][dtype]
        assert cost["kl_mean"] > 1e-7 and cost["max_abs"] > 1e-3  # the cache does move the logits
        assert cost["tokens"] == 8
    # the FP8 rows are further from the 16-bit model than bf16 rounding alone moves it
    assert model["fp8_cost"]["fp32"]["kl_mean"] > rows[("eager", "bf16")]["agreement"]["kl_mean"]
    assert model["kv_dtype"] == "fp8" and "fp8 KV cache costs tiny-llama" in capsys.readouterr().out
    assert "(kv fp8)" in (tmp_path / "v" / "verify.md").read_text()


def test_model_level_catches_a_wrong_descale_in_an_implementation_reading_the_fp8_bytes(tmp_path):
    """User functions with `kv_cache=` get the cache's FP8 bytes inside the model: a key descale off by 2x and an
    ignored value descale fail against eager fp32 over the same cache; the same code with the descales right passes."""
    impls = ",".join(["eager", "tests.broken:fp8_correct", *BROKEN])
    rc = main(["verify", "--device", "cpu", "--model", "tiny-llama", "--dtype", "fp16", "--kv-dtype", "fp8",
               "--impls", impls, "--seed", "2", "--out", str(tmp_path / "v")])
    assert rc == 1
    rows = {r["impl"]: r for r in json.loads((tmp_path / "v" / "verify.json").read_text())["model"]["results"]}
    assert rows["tests.broken:fp8_correct (kv fp8)"]["status"] == "pass"
    for name in BROKEN:
        assert rows[f"{name} (kv fp8)"]["status"] == "fail", rows[f"{name} (kv fp8)"]
        assert rows[name]["status"] == "pass"  # without the FP8 cache they are the correct function


def _child() -> dict:
    """Our kernel under Triton's interpreter (this file run as a child: the kernel module must load with it on):
    `verify --kv-dtype fp8` on a chunk case, a head-dim-64 model with the cache's FP8 reads counted, then serve's
    production decode step over an FP8 static cache."""
    out = tempfile.mkdtemp(prefix="fp8-kernel-")
    config = os.path.join(out, "config.json")
    with open(config, "w") as f:
        json.dump(CONFIG, f)
    import attnprof.models.attention as A

    reads = []
    fp8_of = A.fp8_of
    def counting(k, v):
        c = fp8_of(k, v)
        reads.append(c is not None)
        return c
    A.fp8_of = counting
    kernel_rc = main(["verify", "--device", "cpu", "--dtype", "fp16,bf16", "--kv-dtype", "fp8", "--cases", "chunk",
                      "--variants", "kernel", "--seed", "5", "--out", out + "/kernel"])
    model_rc = main(["verify", "--device", "cpu", "--model", config, "--dtype", "fp16", "--kv-dtype", "fp8", "--impls",
                     "eager,kernel", "--model-batch", "2", "--model-seq", "12", "--decode-tokens", "3", "--seed", "2",
                     "--out", out + "/model"])

    # serve's production decode over an FP8 static cache: generate compiled by dynamo (backend "eager": the trace, the
    # static cache and the custom op as on a GPU, without inductor), against eager over the FP8 cache verify uses
    from attnprof.models import build_model
    from attnprof.models import kernel_cache as KC
    from attnprof.models.attention import resolve_impls
    from attnprof.models.fp8_cache import Fp8Cache, Fp8StaticCache, cache_argument
    from attnprof.serving.loops import _generation_config
    from attnprof.serving.throughput import _prompt
    from decode_points import static_decode_point

    kernel = resolve_impls("kernel", "cpu")[0]
    model = build_model(config, attn_implementation="eager", dtype="fp16", device="cpu", seed=3)
    ids = _prompt(model.config, 2, 10, "cpu", 3)
    descaled, keys_contiguous = [], []
    module = KC._CACHE_MODULES[0]  # the kernel's calls inside the custom op (opaque to dynamo: counting adds no guard)
    entry = module.flash_attn_with_kvcache
    def counting(*a, **kw):
        descaled.append(kw.get("k_descale") is not None)
        keys_contiguous.append(a[2].stride(1) == 1)  # v_cache [B, S, Hkv, D] with the keys contiguous
        return entry(*a, **kw)
    module.flash_attn_with_kvcache = counting

    def generate(cache, compiled, **kw):
        out = model.generate(ids, attention_mask=torch.ones_like(ids), **{cache_argument(model): cache}, **kw,
                             generation_config=_generation_config(6, 24, compiled, "eager", check=True, own_cache=True))
        return out.sequences, torch.stack([x.float() for x in out.logits])

    ref_tokens, ref_logits = generate(Fp8Cache("fp8"), False)
    model.set_attn_implementation(kernel.attn_implementation)
    static = Fp8StaticCache(model.config, max_cache_len=24)
    tokens, logits = generate(static, True)
    serve = {"tokens_equal": bool(torch.equal(tokens, ref_tokens)),
             "max_logit_diff": float((logits - ref_logits).abs().max()), "logit_scale": float(ref_logits.abs().max()),
             "fp8_calls": sum(descaled), "calls": len(descaled)}
    # a key descale doubled in place after the prompt, between two calls of the same compiled step (a logits processor
    # runs outside it): the step must read the live descale, not a constant baked in when dynamo traced it
    def doubling(input_ids, scores):
        if input_ids.shape[1] == ids.shape[1] + 1:  # after the first decode step
            static.layers[0].k_descale.mul_(2)
        return scores
    static.reset()
    _, wrong = generate(static, True, logits_processor=[doubling])
    serve["doubled_descale_diff"] = float((wrong - ref_logits).abs().max())
    # the values stored keys-contiguous (`v_keys`, the kernel's V_KEYS decode): the same tokens and logits
    del descaled[:], keys_contiguous[:]
    vk_tokens, vk_logits = generate(Fp8StaticCache(model.config, max_cache_len=24, v_keys=True), True)
    serve["v_keys"] = {"tokens_equal": bool(torch.equal(vk_tokens, ref_tokens)),
                       "max_logit_diff": float((vk_logits - ref_logits).abs().max()),
                       "fp8_calls": sum(descaled), "keys_contiguous_calls": sum(keys_contiguous)}
    torch._dynamo.reset()
    del descaled[:], keys_contiguous[:]
    point = static_decode_point(model, "kernel (kv fp8)", batch=2, context=10, new_tokens=6, device="cpu", reps=1,
                                backend="eager", kv_dtype="fp8")
    serve["point"] = {"status": point.status, "kv_dtype": point.kv_dtype, "graph_breaks": point.graph_breaks}
    serve["point_reads"] = {"fp8": sum(descaled), "keys_contiguous": sum(keys_contiguous)}
    return {"kernel_rc": kernel_rc, "model_rc": model_rc, "fp8_reads": sum(reads), "serve": serve, "tmp": out}



def test_the_static_cache_is_written_in_place_in_a_compiled_step():
    """The FP8 static cache's decode write, as inductor compiles it: both index_put_ write the graph's input buffers
    themselves. Written through float8 -> uint8 views instead, the write went to a view; on the H100 inductor's CUDA
    graph then copied the whole cache into a new buffer and back every step (4.6 ms at batch 16 over 8k keys: the FP8
    cache at 0.38x the bf16 one). `v_keys` (V stored [B, Hkv, D, L]) too: its write is transposed."""
    from torch._inductor import config as inductor_config

    from attnprof.models.fp8_cache import Fp8StaticLayer

    targets = []

    class Seen(Exception):
        """Raised once the post-grad graph is read: the C++ code generation after it is not needed."""

    def record(graph):
        targets.extend(n.args[0].op for n in graph.nodes if n.op == "call_function" and "index_put" in str(n.target))
        raise Seen

    layer = Fp8StaticLayer(60, v_keys=True)  # 60 keys: the V rows are padded to 64 (16-byte aligned)
    layer.update(torch.randn(2, 4, 8, 16), torch.randn(2, 4, 8, 16))  # the prompt, eager: fixes the descales

    def step(k, v):
        keys, values = layer.update(k, v)
        return keys[:, :, :1].float().sum() + values[:, :, :1].float().sum()

    torch._dynamo.reset()
    with inductor_config.patch(post_grad_custom_post_pass=record, force_disable_caches=True):
        with pytest.raises(Exception) as raised:
            torch.compile(step, backend="inductor")(torch.randn(2, 4, 1, 16), torch.randn(2, 4, 1, 16))
    torch._dynamo.reset()
    assert "Seen" in str(raised.value), raised.value  # stopped by `record` (inductor wraps it), nothing else
    assert targets == ["placeholder", "placeholder"], targets
    assert layer.values.stride(2) == 1 and layer.values.stride(3) == 64
    assert layer.values.shape == layer.keys.shape == (2, 4, 60, 16)


@pytest.fixture(scope="module")
def kernel_child():
    yield from child_report(__file__)


def test_the_kernel_reads_the_fp8_cache_and_passes(kernel_child):
    """Within the gate of its dequantised cache, its cost reported; bf16 is refused under the interpreter."""
    last, tmp = kernel_child, Path(kernel_child["tmp"])
    assert last["kernel_rc"] == 0, last
    data = json.loads((tmp / "kernel" / "verify.json").read_text())
    rows = {(c["name"], c["workload"]["dtype"]): r for c in data["kernel"]["cases"] for r in c["results"]}
    r = rows[("chunk", "fp16")]  # 33 queries over 161 keys, causal: decode's Sq=1 is the kvcache tests' own
    assert r["status"] == "pass" and r["lossy_factor"] > 5, r
    assert "flash_attn_with_kvcache" in r["kv_read"]
    assert rows[("chunk", "bf16")]["status"] == "rejected" and "interpreter" in rows[("chunk", "bf16")]["reason"]


def test_our_kernel_reads_the_model_cache_fp8_bytes_and_passes(kernel_child):
    """Inside a model the kernel gets the FP8 bytes of the cache with its descales (`models.fp8_cache.fp8_of`,
    counted) and passes against eager fp32 over the same cache."""
    last, tmp = kernel_child, Path(kernel_child["tmp"])
    assert last["model_rc"] == 0 and last["fp8_reads"] > 0, last
    rows = {r["impl"]: r for r in json.loads((tmp / "model" / "verify.json").read_text())["model"]["results"]}
    assert rows["kernel (kv fp8)"]["status"] == "pass" and rows["kernel"]["status"] == "pass"


def test_production_decode_over_an_fp8_static_cache_reads_the_bytes_and_matches_eager_over_fp8(kernel_child):
    """`serve --kv-dtype fp8`'s step: generate compiled by dynamo over `Fp8StaticCache` with our kernel reading the
    FP8 bytes (every decode call passes descales) gives eager-over-the-FP8-cache's tokens and logits to fp16
    rounding; a key descale doubled after the prompt moves them (the compiled step reads the live descale)."""
    serve = kernel_child["serve"]
    assert serve["tokens_equal"], serve
    assert serve["max_logit_diff"] < 1e-2 * max(1.0, serve["logit_scale"]), serve
    assert serve["fp8_calls"] >= 5 and serve["fp8_calls"] == serve["calls"], serve  # 5 decode steps x 1 layer
    assert serve["doubled_descale_diff"] > 20 * serve["max_logit_diff"], serve
    assert serve["point"] == {"status": "ok", "kv_dtype": "fp8", "graph_breaks": 0}, serve
    vk = serve["v_keys"]  # the values stored keys-contiguous: every decode call reads them so, with the same result
    assert vk["tokens_equal"] and vk["max_logit_diff"] < 1e-2 * max(1.0, serve["logit_scale"]), vk
    assert vk["fp8_calls"] >= 5 and vk["keys_contiguous_calls"] == vk["fp8_calls"], vk
    # serve's point stores V head-dim-contiguous, as K (keys-contiguous measured slower there: serving/loops.py)
    assert serve["point_reads"]["fp8"] > 0 and serve["point_reads"]["keys_contiguous"] == 0, serve["point_reads"]


if __name__ == "__main__":
    assert os.environ.get("TRITON_INTERPRET") == "1", "run the child with TRITON_INTERPRET=1"
    print(json.dumps(_child()))
