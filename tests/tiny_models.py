"""A tiny Llama from a config and two checks around it, shared by the transformers tests on the CPU and the GPU.

`tiny_llama` builds the same random weights in any dtype and attention implementation (so fp16 on our kernel can be
held against fp64 eager); `counting` wraps an entry point to count its calls while keeping its signature (transformers
reads the parameters it may pass); `greedy_mismatches` says where generated tokens differ from what the fp64 model
picks greedily by more than fp16 can tell apart.
"""

from __future__ import annotations

import copy
import functools

MARGIN = 0.02  # fp64 top-2 logit gap under which fp16 may pick either token


def tiny_llama(dtype, attn_implementation: str, source=None):
    """A 2-layer Llama (4 query heads over 2 kv heads, head dim 64) from a config; weights copied from `source`."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=64, vocab_size=97, max_position_embeddings=256)
    torch.manual_seed(0)
    model = LlamaForCausalLM._from_config(copy.deepcopy(cfg), attn_implementation=attn_implementation,
                                          dtype=dtype).eval()
    if source is not None:
        model.load_state_dict({k: v.to(dtype) for k, v in source.state_dict().items()})
    return model


def counting(fn, calls: dict, key: str):
    @functools.wraps(fn)  # keeps the signature: transformers reads the parameters it may pass
    def wrapper(*args, **kwargs):
        calls[key] = calls.get(key, 0) + 1
        return fn(*args, **kwargs)
    return wrapper


def greedy_mismatches(ref, prompt: list[int], tokens: list[int]) -> list[dict]:
    """Positions where `tokens` is not fp64's greedy choice by more than MARGIN."""
    import torch

    ids = torch.tensor([prompt + tokens[:-1]], device=next(ref.parameters()).device)
    with torch.no_grad():
        logits = ref(ids).logits[0, len(prompt) - 1:]
    bad = []
    for i, t in enumerate(tokens):
        gap = (logits[i].max() - logits[i, t]).item()
        if gap > MARGIN:
            bad.append({"step": i, "token": t, "best": int(logits[i].argmax()), "gap": gap})
    return bad
