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

`Fp8StaticCache` is the serving cache (`serve --kv-dtype fp8`, the production loop): a transformers `StaticCache`
whose layers preallocate only the FP8 bytes (half the bf16 cache) at static addresses, so `generate`'s compiled
decode step and its CUDA graph take it as they take the bf16 static cache. There is no dequantised copy: after the
prompt, `update` returns the FP8 tensors themselves, and only an implementation that reads FP8 (our kernel's
`flash_attn_with_kvcache` with `k_descale`/`v_descale`) can attend over them; it finds the descales by the layer
(`static_fp8`), which works inside a compiled graph, where a tensor attribute would not. The prompt (the first,
uncompiled call) is attended dequantised, which is exact.
"""

from __future__ import annotations

import functools
import inspect

import torch
from transformers.cache_utils import Cache, DynamicLayer, StaticCache, StaticLayer

from attnprof.workload import KV_DTYPES, Fp8KV, fp8_dequantize, fp8_descale, fp8_quantize

HEADROOM = 2.0  # one binade above the prompt's largest |k| / |v| before a later token saturates
FP8_DTYPES = frozenset(KV_DTYPES.values())


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


def cache_argument(model) -> str:
    """The name under which `model`'s forward and `generate` take a cache object: "cache" (transformers 5.24) or
    "past_key_values" (5.17, deprecated in 5.24)."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


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


class Fp8StaticLayer(StaticLayer):
    """A `StaticLayer` storing FP8 bytes: `keys`/`values` `[B, Hkv, max_len, D]` in the FP8 format, fp32 descales
    `[B, Hkv]` fixed by the first call after a reset (the prompt), all at static addresses. `v_keys`: the values are
    stored `[B, Hkv, D, max_len]` (the keys contiguous) and `values` is its `[B, Hkv, max_len, D]` view, the layout our
    kernel's FP8 decode reads as Vᵀ tiles (its `V_KEYS` path: no byte-wise gather of the value tile)."""

    def __init__(self, max_cache_len: int, fmt: torch.dtype = torch.float8_e4m3fn, v_keys: bool = False,
                 **kwargs) -> None:
        super().__init__(max_cache_len, **kwargs)
        self.fmt = fmt
        self.v_keys = v_keys
        self.scaled = False  # a plain bool: False in the prompt's (eager) call, True in the compiled decode steps

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        b, h, _, d = key_states.shape
        self.device, self.batch_size, self.num_heads = key_states.device, b, h
        self.dtype = key_states.dtype  # the model's: transformers 5.17's StaticLayer keeps it (5.24 does not)
        self.k_head_dim, self.v_head_dim = d, value_states.shape[-1]
        # The storage is uint8 (`k_bytes`, `v_bytes`), written by index_copy_ on itself, as StaticLayer writes its
        # cache: index_copy_ through a float8 -> uint8 view (there is no float8 index_copy_ on every device) made
        # inductor's CUDA graph write each step into a fresh copy of the whole cache and copy it back (3.2 + 1.5 ms per
        # step at batch 16 over 8k keys on an H100: the FP8 cache ran at 0.38x the bf16 one). `keys`/`values` are
        # the FP8 views attention reads. v_keys: `v_bytes` is [B, Hkv, D, rows] and `values` its sliced, transposed
        # view; each head-dim row starts on 16 bytes (`max_len` rounded up to 16 keys: the kernel's Vᵀ tiles come by
        # 16-byte copies only then). `v_bytes` is the padded tensor itself, not a slice of it, so the buffers a compiled
        # step takes and writes stay whole graph inputs (handed over as a slice, the H100 copied the whole cache each
        # step); `stored()` slices.
        self.k_bytes = torch.zeros(b, h, self.max_cache_len, d, dtype=torch.uint8, device=self.device)
        if self.v_keys:
            rows = -(-self.max_cache_len // 16) * 16
            self.v_bytes = torch.zeros(b, h, self.v_head_dim, rows, dtype=torch.uint8, device=self.device)
        else:
            self.v_bytes = torch.zeros(b, h, self.max_cache_len, d, dtype=torch.uint8, device=self.device)
        self.keys, self.values = self._views()
        self.k_descale = torch.ones(b, h, dtype=torch.float32, device=self.device)
        self.v_descale = torch.ones(b, h, dtype=torch.float32, device=self.device)
        self.cumulative_length = self.cumulative_length.to(self.device)
        if not torch.compiler.is_compiling():  # as StaticLayer: fixed data pointers for CUDA graphs
            for t in (self.k_bytes, self.v_bytes, self.k_descale, self.v_descale, self.cumulative_length):
                torch._dynamo.mark_static_address(t)
        self.is_initialized = True

    def stored(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The cache's bytes as uint8 `[B, Hkv, max_len, D]` views (what `static_fp8` hands the kernel)."""
        if self.v_keys:
            return self.k_bytes, self.v_bytes[..., : self.max_cache_len].transpose(2, 3)
        return self.k_bytes, self.v_bytes

    def _views(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The cache as FP8 `[B, Hkv, max_len, D]` views of its bytes."""
        keys, values = self.stored()
        return keys.view(self.fmt), values.view(self.fmt)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        prompt = not self.scaled
        if prompt:
            self.k_descale.copy_(fp8_descale(key_states, self.fmt, HEADROOM))
            self.v_descale.copy_(fp8_descale(value_states, self.fmt, HEADROOM))
            self.scaled = True
        n = key_states.shape[-2]
        pos = torch.arange(n, device=self.device) + self.cumulative_length
        self.cumulative_length.add_(n)
        k8, v8 = (fp8_quantize(x, d, self.fmt).view(torch.uint8) for x, d in ((key_states, self.k_descale),
                                                                              (value_states, self.v_descale)))
        # on the storage itself, not on `stored()`'s transposed view (the write must target the graph's input)
        self.k_bytes.index_copy_(2, pos, k8)
        if self.v_keys:
            self.v_bytes.index_copy_(3, pos, v8.transpose(2, 3))
        else:
            self.v_bytes.index_copy_(2, pos, v8)
        keys, values = self._views()
        if prompt:  # attended dequantised (exact, head dim contiguous whatever the storage); later calls read the bytes
            return (fp8_dequantize(keys, self.k_descale, key_states.dtype),
                    fp8_dequantize(values, self.v_descale, value_states.dtype).contiguous())
        return keys, values

    def reset(self) -> None:
        self.scaled = False
        self.cumulative_length.zero_()
        if self.is_initialized:  # in place: the addresses stay
            self.k_bytes.zero_()
            self.v_bytes.zero_()
            self.k_descale.fill_(1.0)
            self.v_descale.fill_(1.0)


_LIVE: dict[int, Fp8StaticLayer] = {}  # layer index -> the layer of the newest Fp8StaticCache (see static_fp8)


class Fp8StaticCache(StaticCache):
    """`StaticCache` of `Fp8StaticLayer`s for `config` (every layer full attention); `kv_dtype` "fp8" or "fp8_e5m2".
    The newest one made is the one `static_fp8` finds: serve one at a time."""

    def __init__(self, config, max_cache_len: int, kv_dtype: str = "fp8", v_keys: bool = False) -> None:
        types = getattr(config.get_text_config(decoder=True), "layer_types", None) or []
        if any(t != "full_attention" for t in types):
            raise ValueError(f"an FP8 static cache holds full-attention layers only; this model has "
                             f"{sorted(set(types))}")
        super().__init__(config, max_cache_len=max_cache_len)
        self.kv_dtype = kv_dtype
        self.layers = [Fp8StaticLayer(max_cache_len, KV_DTYPES[kv_dtype], v_keys) for _ in self.layers]
        _LIVE.clear()
        _LIVE.update(enumerate(self.layers))

    def reset(self) -> None:
        for layer in self.layers:
            layer.reset()


def static_fp8(module, key: torch.Tensor, value: torch.Tensor) -> Fp8KV | None:
    """The FP8 cache and descales when `key`/`value` are FP8 tensors from an `Fp8StaticCache`'s layer of the
    attention `module` (its `layer_idx`), else None: the layer's uint8 storage itself (`Fp8KV.fmt` says the format),
    so a compiled step hands the kernel the buffers it writes in place, not dtype views of them (which inductor may
    materialise). Works while dynamo traces (a global dict and a layer's attributes, where a tensor's own attribute
    would not be seen)."""
    if key.dtype not in FP8_DTYPES:
        return None
    layer = _LIVE.get(getattr(module, "layer_idx", -1))
    if layer is None or not layer.is_initialized or layer.keys.shape != key.shape:
        return None
    return Fp8KV(*layer.stored(), layer.k_descale, layer.v_descale, fmt=layer.fmt)
