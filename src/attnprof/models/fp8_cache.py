"""An FP8 KV cache for transformers models: what a serving engine's `kv_cache_dtype="fp8"` does to a model's numbers.

`Fp8Cache` is a transformers `Cache` whose layers store every key and value in an FP8 format (e4m3 or e5m2) as
x / descale, with one fp32 descale per (sequence, kv head) fixed by the first tokens the layer sees (the prompt):
the power of two that puts `HEADROOM` × their largest |x| at or below the format's largest value; later tokens
past that saturate, as in an engine with calibrated scales. Attention reads the cache dequantised in the model's
dtype, which power-of-two descales make exact: every implementation (eager, sdpa, flex) then computes the model
*with an FP8 cache* exactly, and `verify --model --kv-dtype fp8` can ask what the cache costs the model and whether
each implementation still agrees with eager attention over the same cache. The stored bytes ride along (`fp8_of`):
our kernel reads them through `flash_attn_with_kvcache` with the descales, and a user function with a `kv_cache=`
parameter gets them, so a wrong descale in either fails the model gate.
"""

from __future__ import annotations

import functools

import torch
from transformers.cache_utils import Cache, DynamicLayer

from attnprof.workload import KV_DTYPES, Fp8KV, fp8_dequantize, fp8_descale, fp8_quantize

HEADROOM = 2.0  # one binade above the prompt's largest |k| / |v| before a later token saturates


class Fp8Layer(DynamicLayer):
    """A `DynamicLayer` holding FP8 keys/values (`keys8`, `values8`) and their descales; `keys`/`values` are the
    dequantised cache the attention reads."""

    def __init__(self, fmt: torch.dtype = torch.float8_e4m3fn) -> None:
        super().__init__()
        self.fmt = fmt
        self.keys8 = self.values8 = self.k_descale = self.v_descale = None

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        if self.k_descale is None:  # the first tokens (the prompt) fix the scales
            self.k_descale = fp8_descale(key_states, self.fmt, HEADROOM)
            self.v_descale = fp8_descale(value_states, self.fmt, HEADROOM)
        k8 = fp8_quantize(key_states, self.k_descale, self.fmt)
        v8 = fp8_quantize(value_states, self.v_descale, self.fmt)
        self.keys8 = k8 if self.keys8 is None else torch.cat([self.keys8, k8], dim=-2)
        self.values8 = v8 if self.values8 is None else torch.cat([self.values8, v8], dim=-2)
        # the new tokens dequantised onto the cache read so far (exact: the same values as dequantising it all)
        self.keys = torch.cat([self.keys, fp8_dequantize(k8, self.k_descale, key_states.dtype)], dim=-2)
        self.values = torch.cat([self.values, fp8_dequantize(v8, self.v_descale, value_states.dtype)], dim=-2)
        # the bytes as stored ride on the dequantised keys: an implementation with an FP8 path (our kernel, a user
        # function taking kv_cache=) reads them instead (`fp8_of`)
        self.keys._attnprof_fp8 = Fp8KV(self.keys8, self.values8, self.k_descale, self.v_descale)
        return self.keys, self.values


def fp8_of(key: torch.Tensor, value: torch.Tensor) -> Fp8KV | None:
    """The FP8 cache behind `key`/`value` when they are an `Fp8Layer`'s dequantised cache (the same tensors, not a
    slice or copy of them), else None."""
    c = getattr(key, "_attnprof_fp8", None)
    if c is None or c.k.shape != key.shape or c.v.shape != value.shape:
        return None
    return c


class Fp8Cache(Cache):
    """One `Fp8Layer` per model layer, made as the model asks for them; `kv_dtype` "fp8" (e4m3) or "fp8_e5m2"."""

    def __init__(self, kv_dtype: str = "fp8") -> None:
        # `layer_class_to_replicate` is called with no arguments for each new layer
        super().__init__(layer_class_to_replicate=functools.partial(Fp8Layer, KV_DTYPES[kv_dtype]))
        self.kv_dtype = kv_dtype
