"""Real models whose attention has softcap, sliding windows or sinks, on our kernel (CPU, Triton's interpreter).

Gemma 2 (logit softcap on every layer, a sliding window on alternate ones), Mistral (a window on every layer) and
gpt-oss (learned sinks, alternate sliding layers, MoE), tiny and random, built by transformers from their configs with
head dim 64. The child (this file under TRITON_INTERPRET=1) runs each in fp16 on the `kernel` implementation (the
registry adapter, `models.attention.register_variant`, which hands the features to the repo's `flash_attn_func` and,
under a mask, to `flash_attn_with_kvcache`) and holds the logits against the same weights in fp64 eager: error <= 2 x
fp16 eager's. A static-cache `generate` (every layer gets the whole cache and a bool mask with the window in it) must
pick fp64's greedy tokens. The prompt is longer than the window, so the window really cuts.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from interpreter_child import run_child

INTERPRETER_CHILD = True  # its child starts in the background once tests are collected (conftest.py)

ROOT = Path(__file__).resolve().parents[1]
BASE = dict(hidden_size=256, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            head_dim=64, vocab_size=97, max_position_embeddings=256)
FAMILIES = {
    "gemma2": dict(BASE, model_type="gemma2", attn_logit_softcapping=5.0, final_logit_softcapping=30.0,
                   sliding_window=6, query_pre_attn_scalar=64),
    "mistral": dict(BASE, model_type="mistral", sliding_window=6),
    "gpt_oss": dict(BASE, model_type="gpt_oss", num_local_experts=4, num_experts_per_tok=2, sliding_window=6,
                    layer_types=["sliding_attention", "full_attention"], max_position_embeddings=131072),
}


def _child() -> dict:
    import copy

    import torch
    import transformers

    from attnprof.models.attention import register_variant, takes
    from attnprof.models.features import not_taken
    from attnprof.variants import kernel_hub
    from tiny_models import counting, greedy_mismatches

    module = kernel_hub.load()
    calls: dict = {}
    for entry in ("flash_attn_func", "flash_attn_with_kvcache"):  # counted: the features reached our kernel
        setattr(module, entry, counting(getattr(module, entry), calls, entry))
    name = register_variant(kernel_hub.kernel_variant())
    out: dict = {"takes": list(takes(name))}
    for family, fields in FAMILIES.items():
        config = transformers.AutoConfig.for_model(**fields)

        def build(dtype, impl, source=None, config=config, family=family):
            torch.manual_seed(0)
            moe = {"experts_implementation": "eager"} if family == "gpt_oss" else {}  # grouped_mm has no fp64
            model = transformers.AutoModelForCausalLM.from_config(copy.deepcopy(config), attn_implementation=impl,
                                                                  dtype=dtype, **moe).eval()  # each its own config
            if source is not None:
                model.load_state_dict({k: v.to(dtype) for k, v in source.state_dict().items()})
            return model

        ref = build(torch.float64, "eager")
        if family == "gpt_oss":  # the sinks start at zero: make them matter
            with torch.no_grad():
                for layer in ref.model.layers:
                    layer.self_attn.sinks.normal_(2.0, 1.0)
        eager, ours = build(torch.float16, "eager", ref), build(torch.float16, name, ref)
        ids = torch.randint(3, 97, (2, 20), generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            want = ref(ids).logits
            # the same weights without the window (and Gemma 2's softcap): how much the features change the answer
            bare = dict(fields, sliding_window=4096, attn_logit_softcapping=None)
            plain = build(torch.float64, "eager", ref, transformers.AutoConfig.for_model(**bare))

            def rel(a, want=want):
                return ((a.double() - want).norm() / want.norm()).item()

            calls.clear()
            row = {"asks": sorted(not_taken(config)), "err": rel(ours(ids).logits), "eager": rel(eager(ids).logits),
                   "calls": sum(calls.values())}
            row["window_matters"] = rel(plain(ids).logits)
            prompt = ids[0, :12].tolist()
            got = ours.generate(ids[:1, :12], max_new_tokens=5, do_sample=False, pad_token_id=0, eos_token_id=-1,
                                cache_implementation="static")
            tokens = got[0, 12:].tolist()
            row["static"] = {"tokens": tokens, "mismatches": greedy_mismatches(ref, prompt, tokens),
                             "cache_calls": calls.get("flash_attn_with_kvcache", 0)}
        out[family] = row
    return out


@pytest.fixture(scope="module")
def child() -> dict:
    return run_child(__file__)


def test_the_kernel_adapter_takes_softcap_windows_and_sinks(child):
    assert set(child["takes"]) == {"softcap", "sliding_window", "s_aux"}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_logits_match_fp64_within_twice_fp16_eager(child, family):
    r = child[family]
    assert r["asks"], r  # the config really asks for a feature
    # both layers ran our kernel: flash_attn_func without a mask, flash_attn_with_kvcache under a (sliding) mask
    assert r["calls"] == 2, r
    assert r["err"] <= 2 * r["eager"], r


@pytest.mark.parametrize("family", ["gemma2", "mistral", "gpt_oss"])
def test_the_features_change_the_answer(child, family):
    """Without its window (and Gemma 2's softcap) the model's logits move far more than the kernel's error: the check
    above could not pass with the features ignored."""
    r = child[family]
    assert r["window_matters"] > 20 * r["err"], r


@pytest.mark.parametrize("family", list(FAMILIES))
def test_static_cache_generate_picks_fp64s_greedy_tokens(child, family):
    r = child[family]["static"]
    assert r["cache_calls"] >= 2 * 4, r  # 2 layers x the 4 decode steps over the static cache, at least
    assert len(r["tokens"]) == 5 and not r["mismatches"], r


if __name__ == "__main__":
    assert os.environ.get("TRITON_INTERPRET") == "1", "run the child with TRITON_INTERPRET=1"
    print(json.dumps(_child()))
