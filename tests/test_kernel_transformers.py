"""Our kernel inside a real transformers model (tiny Llama from a config, fp16, CPU through Triton's interpreter).

`attnprof.serving.flash_registration.hub_attention()` registers the kernel repo (loaded with `kernels`) under transformers'
own flash wrappers. The child (this file run with TRITON_INTERPRET=1) checks, against the same model in fp64 eager:
  - a dense forward and a left-padded one (padding goes through `flash_attn_varlen_func`): logits within twice
    the error of eager fp16;
  - continuous batching (`generate_batch`): every request completes with the tokens the fp64 model picks
    greedily (a different token only where fp64's top two logits are closer than fp16 can tell apart), and our
    `flash_attn_varlen_func` did the attention. The decode fast path (`flash_attn_with_kvcache` over the paged
    cache) is CUDA-only in transformers, so on the CPU it stays off; test_kernel_serving_cuda.py runs it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from interpreter_child import run_child

INTERPRETER_CHILD = True  # its child starts in the background once tests are collected (conftest.py)

ROOT = Path(__file__).resolve().parents[1]


def _child() -> dict:
    import torch
    from transformers import ContinuousBatchingConfig, GenerationConfig

    from attnprof.serving import flash_registration
    from attnprof.variants import kernel_hub
    from tiny_models import counting, greedy_mismatches, tiny_llama

    module = kernel_hub.load()
    calls: dict = {}
    for name in flash_registration.ENTRY_POINTS:  # before registration: transformers keeps these function objects
        setattr(module, name, counting(getattr(module, name), calls, name))
    ha = flash_registration.hub_attention()
    out: dict = {"interpreted": bool(module.INTERPRETED), "hub": {"dense": ha.dense, "paged": ha.paged,
                 "rejected": ha.rejected, "fast": ha.decode_fast_path}, "route": flash_registration.kernels_route_problem()}
    ours = tiny_llama(torch.float16, ha.dense)
    eager = tiny_llama(torch.float16, "eager", ours)
    ref = tiny_llama(torch.float64, "eager", ours)

    def rel(a, b):
        return ((a.double() - b).norm() / b.norm()).item()

    ids = torch.randint(0, 97, (2, 37), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = ref(ids).logits
        out["dense"] = {"err": rel(ours(ids).logits, want), "eager": rel(eager(ids).logits, want),
                        "used": ours.config._attn_implementation, "calls": dict(calls)}
        mask = torch.ones_like(ids)
        mask[0, :9] = 0  # left padding: the real tokens of row 0 sit at positions 9..36
        got = ours(ids, attention_mask=mask).logits
        pos = torch.arange(9, 37)[None]
        want0, base0 = ref(ids[:1, 9:], position_ids=pos).logits[0], eager(ids[:1, 9:], position_ids=pos).logits[0]
        out["padded"] = {"err": rel(got[0, 9:], want0), "eager": rel(base0, want0),
                         "err_unpadded_row": rel(got[1], want[1]), "eager_unpadded_row": rel(eager(ids[1:]).logits[0],
                                                                                             want[1]),
                         "varlen_calls": calls.get("flash_attn_varlen_func", 0)}

    calls.clear()
    prompts = [[5, 6, 7, 8, 9], [10, 11, 12], list(range(20, 60))]
    gen = GenerationConfig(do_sample=False, max_new_tokens=5, eos_token_id=-1, pad_token_id=0)
    used = ha.apply(ours, paged=True)
    results = ours.generate_batch(prompts, generation_config=gen,
                                  continuous_batching_config=ContinuousBatchingConfig(num_blocks=16, max_batch_tokens=64))
    ha.apply(ours)
    requests = []
    for i, prompt in enumerate(prompts):
        r = results.get(f"req_{i}")
        tokens = list(r.generated_tokens) if r is not None else []
        requests.append({"error": None if r is None else r.error, "tokens": tokens,
                         "mismatches": greedy_mismatches(ref, prompt, tokens) if tokens else []})
    out["continuous"] = {"used": used, "after": ours.config._attn_implementation, "requests": requests,
                         "calls": dict(calls)}

    # transformers' static cache (the production `generate` loop): every layer gets the whole preallocated cache and a
    # bool mask; attnprof's adapter runs our kernel through flash_attn_with_kvcache over [leftpad, seqlen)
    from attnprof.models.attention import register_variant

    static = tiny_llama(torch.float16, register_variant(kernel_hub.kernel_variant()), ours)
    calls.clear()
    prompts = [[5, 6, 7, 8, 9, 10, 11], [12, 13, 14]]
    ids = torch.tensor([prompts[0], [0] * 4 + prompts[1]])
    mask = torch.tensor([[1] * 7, [0] * 4 + [1] * 3])
    with torch.no_grad():
        got = static.generate(ids, attention_mask=mask, max_new_tokens=4, do_sample=False, pad_token_id=0,
                              eos_token_id=-1, cache_implementation="static")
    rows = [got[i, 7:].tolist() for i in range(2)]
    out["static"] = {"tokens": rows, "calls": dict(calls),
                     "mismatches": [greedy_mismatches(ref, p, t) for p, t in zip(prompts, rows)]}

    # the prompt prefilled in chunks of 3 (7 = 3 + 3 + 1), as `serve` does when a batch's one-shot prefill would not
    # fit (`memory_fit.prefill_chunk`): the second and third chunks' queries attend to the cache the earlier ones wrote
    calls.clear()
    with torch.no_grad():
        got = static.generate(ids, attention_mask=mask, max_new_tokens=4, do_sample=False, pad_token_id=0,
                              eos_token_id=-1, cache_implementation="static", prefill_chunk_size=3)
    rows = [got[i, 7:].tolist() for i in range(2)]
    out["static_chunked"] = {"tokens": rows, "calls": dict(calls),
                             "mismatches": [greedy_mismatches(ref, p, t) for p, t in zip(prompts, rows)]}

    # the same loop compiled, as `serve --loop production` runs it (dynamo with the eager backend: the CPU has no CUDA
    # graphs): one graph per step, for a batch with a left-padded row too. Its prefill comes with no mask (SDPA's
    # top-left is_causal over the whole cache, which the adapter once took bottom-right: token 0 was wrong). On the
    # H200 a compiled batch > 1 once raised inside the adapter: a graph break in every layer, the cache update
    # recompiling per layer past dynamo's limit, the step unfused (issue 30: 0.25x SDPA at batch 16).
    from torch._dynamo.utils import counters as dynamo_counters
    from transformers import CompileConfig

    torch._dynamo.reset()
    dynamo_counters.clear()
    config = CompileConfig(backend="eager", fullgraph=False)
    config._compile_all_devices = True  # transformers compiles only on accelerators unless told
    with torch.no_grad():
        got = static.generate(ids, attention_mask=mask, max_new_tokens=4, do_sample=False, pad_token_id=0,
                              eos_token_id=-1, cache_implementation="static", compile_config=config)
    rows = [got[i, 7:].tolist() for i in range(2)]
    out["static_compiled"] = {"tokens": rows, "graph_breaks": dict(dynamo_counters["graph_break"]),
                              "graphs": dynamo_counters["stats"]["unique_graphs"],
                              "mismatches": [greedy_mismatches(ref, p, t) for p, t in zip(prompts, rows)]}

    # the production loop compiles the decode step: our call over the cache must be one op of that graph (fullgraph
    # raises on a graph break; aot_eager runs the op's fake on the way), give the eager call's answer, and take other
    # batch sizes and cache lengths without a recompile (dynamic shapes: no guard on B, Sk or the split count; batch 1
    # is left out because dynamo specializes every size-1 dimension, for any op)
    from attnprof.models.kernel_cache import kernel_over_cache

    step = lambda *a: kernel_over_cache(module, "kernel", *a, 0.125)  # noqa: E731
    calls.clear()
    import attnprof.models.kernel_cache as cache_adapter

    cache_adapter._CACHE_MODULES.clear()  # as in a fresh process: the compiled call comes first (it did on the H200, where
    register_variant(kernel_hub.kernel_variant())  # the module list appended inside the graph was empty at its run)
    torch._dynamo.reset()
    dynamo_counters.clear()
    compiled = torch.compile(step, backend="aot_eager", fullgraph=True, dynamic=True)
    g = torch.Generator().manual_seed(3)
    out["compiled"] = []
    for b, sk, written in ((3, 16, [10, 16, 1]), (5, 16, [16, 1, 7, 9, 2]), (3, 40, [33, 20, 40])):
        q = torch.randn(b, 4, 1, 64, generator=g).half()  # [B, Hq, Sq, D]: one decode query per sequence
        k, v = (torch.randn(b, 2, sk, 64, generator=g).half() for _ in range(2))  # the whole static cache
        cache_mask = (torch.arange(sk)[None, :] < torch.tensor(written)[:, None])[:, None, None, :]  # [B, 1, 1, Sk]
        try:
            got_step = compiled(q, k, v, cache_mask)
            want_step = step(q, k, v, cache_mask)
            out["compiled"].append({"error": None, "diff": (got_step.float() - want_step.float()).abs().max().item()})
        except Exception as e:  # noqa: BLE001 - the test reports what broke the graph
            out["compiled"].append({"error": f"{type(e).__name__}: {str(e).splitlines()[0]}"})
    holey = cache_mask[:, 0, 0].clone()  # [B, Sk]
    holey[1, 3] = False  # sequence 1 skips key 3: not one range
    holey = holey[:, None, None, :]  # a view, as the others (dynamo guards on an input's being a view)
    poisoned = compiled(q, k, v, holey)
    try:
        step(q, k, v, holey)
        eager_holey = None
    except ValueError as e:
        eager_holey = str(e)
    out["compiled_runs"] = {"calls": calls.get("flash_attn_with_kvcache", 0), "graphs": dynamo_counters["stats"]["unique_graphs"],
                            "graph_breaks": dict(dynamo_counters["graph_break"]),
                            "holey_nan_rows": [bool(poisoned[i].isnan().all()) for i in range(2)],
                            "holey_eager": eager_holey}
    return out


@pytest.fixture(scope="module")
def child() -> dict:
    return run_child(__file__)


def test_registered_under_a_flash_name_transformers_accepts(child):
    assert child["interpreted"]
    hub = child["hub"]
    assert hub["rejected"] is None and "flash" in hub["dense"] and "/" not in hub["dense"]
    assert not hub["fast"], "transformers' decode fast path needs CUDA"


def test_the_kernels_route_is_explained_when_transformers_refuses_this_kernels(child):
    route = child["route"]
    if route is None:
        pytest.skip("this transformers accepts the installed kernels: the attn_implementation='org/repo' route is open")
    assert "kernels" in route and "transformers" in route


def test_dense_logits_match_fp64_within_twice_eager(child):
    r = child["dense"]
    assert r["used"] == child["hub"]["dense"]
    assert r["calls"].get("flash_attn_func", 0) == 2, r  # one per layer: our kernel ran, not a fallback
    assert r["err"] <= 2 * r["eager"], r


def test_padded_batch_runs_through_varlen(child):
    r = child["padded"]
    assert r["varlen_calls"] == 2, r
    assert r["err"] <= 2 * r["eager"] and r["err_unpadded_row"] <= 2 * r["eager_unpadded_row"], r


def test_continuous_batching_runs_on_our_varlen_kernel(child):
    r = child["continuous"]
    assert r["used"] == child["hub"]["paged"] and r["after"] == child["hub"]["dense"]
    assert r["calls"].get("flash_attn_varlen_func", 0) > 0, r
    for i, req in enumerate(r["requests"]):
        assert req["error"] is None and len(req["tokens"]) == 5, (i, req)
        assert not req["mismatches"], (i, req["mismatches"])


def test_static_cache_generate_runs_our_kernel_over_the_cache_with_left_padding(child):
    """The production `generate` loop's static cache: a bool mask over the whole cache went to a ValueError on the
    H200 ("flash_attn_func takes no attention mask"); now flash_attn_with_kvcache takes each row's key range, the
    left-padded row included, and the tokens are fp64's greedy ones."""
    r = child["static"]
    assert r["calls"].get("flash_attn_with_kvcache", 0) >= 2 * 4, r  # 2 layers × (prefill + 3 decode steps)
    for tokens, bad in zip(r["tokens"], r["mismatches"]):
        assert len(tokens) == 4 and not bad, r


def test_a_prompt_prefilled_in_chunks_runs_our_kernel_over_the_cache_it_filled(child):
    """Chunked prefill (`serve`'s production decode when the whole batch's prompt would not fit at once): each chunk
    after the first attends to the keys the earlier chunks wrote, the left-padded row included; fp64's greedy tokens,
    the one-shot prefill's tokens."""
    r = child["static_chunked"]
    assert r["calls"].get("flash_attn_with_kvcache", 0) >= 2 * (3 + 3), r  # 2 layers × (3 chunks + 3 decode steps)
    for tokens, bad in zip(r["tokens"], r["mismatches"]):
        assert len(tokens) == 4 and not bad, r
    assert r["tokens"] == child["static"]["tokens"], r


def test_compiled_static_cache_generate_is_one_graph_for_a_padded_batch(child):
    r = child["static_compiled"]
    assert not r["graph_breaks"] and r["graphs"] == 1, r
    assert not any(r["mismatches"]), r  # fp64's greedy tokens, the left-padded row included
    assert r["tokens"] == child["static"]["tokens"], r


def test_our_cache_call_is_one_op_of_a_compiled_graph_for_any_batch_and_length(child):
    """On the H200 the call was `torch.compiler.disable`d (inductor failed on the launcher): a graph break per layer,
    21.0 ms/token. As the custom op `attnprof::kvcache_attention`, fullgraph compiles, the answer is eager's, and
    batches 3, 5, 3 over caches of 16 and 40 keys run one compiled graph: no recompile."""
    for case in child["compiled"]:
        assert case["error"] is None and case["diff"] == 0.0, child["compiled"]
    r = child["compiled_runs"]
    assert r["graphs"] == 1 and not r["graph_breaks"], r
    assert r["calls"] == 2 * 3 + 1, r  # eager + compiled per case, the holey mask compiled (eager refuses it first)


def test_a_mask_that_is_no_key_range_is_nan_inside_a_graph_and_refused_in_eager(child):
    r = child["compiled_runs"]
    assert r["holey_nan_rows"] == [False, True], r  # only the sequence with the hole, never a silent answer
    assert r["holey_eager"] and "not one causal key range" in r["holey_eager"], r


if __name__ == "__main__":
    assert os.environ.get("TRITON_INTERPRET") == "1", "run the child with TRITON_INTERPRET=1"
    print(json.dumps(_child()))
