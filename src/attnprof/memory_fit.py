"""Will it fit? Memory estimates made before anything is allocated, against what the device holds.

An allocation past a GPU's memory raises and becomes an `oom` row, but one past the CPU's RAM swaps or is killed, and
a model's weights or a serving grid's largest cell can be known too large before a byte is allocated. So every
command checks its sizes here first: the inputs and outputs of a workload (and the score matrix of the variants that
hold it), a model's weights, and one forward of a model at `batch` x `seq` tokens with its KV cache and logits.
A size that cannot fit is one `UsageError` ("... needs N GiB, the device (D) has M GiB of ..."), exit 2; a serve grid's
larger cell that cannot fit is a row (`model_point_misfit`).
"""

from __future__ import annotations

from typing import Any

from attnprof.errors import UsageError

GIB = 1024**3
BYTES = {"fp64": 8, "fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1}


def device_memory(device: str) -> tuple[int, str] | None:
    """(bytes, what they are) this device can hold: a GPU's total memory, the CPU's available RAM (from
    /proc/meminfo, else sysconf); None when it cannot be told."""
    if device.startswith("cuda"):
        import torch

        try:
            index = torch.device(device).index
            total = torch.cuda.get_device_properties(0 if index is None else index).total_memory
        except (RuntimeError, AssertionError, ValueError):
            return None
        return int(total), "memory"
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024, "available RAM"
    except (OSError, ValueError, IndexError):
        pass
    try:
        import os

        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), "available RAM"
    except (ValueError, OSError, AttributeError):
        return None


def gib(n: float) -> str:
    value = n / GIB
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def misfit(needed: int, device: str) -> str | None:
    """"needs N GiB, the device has M GiB of …" when `needed` bytes exceed what `device` holds, else None."""
    have = device_memory(device)
    if have is None or needed <= have[0]:
        return None
    return f"needs {gib(needed)} GiB, the device ({device}) has {gib(have[0])} GiB of {have[1]}"


def check_fits(needed: int, device: str, what: str, hint: str = "") -> None:
    """UsageError "… needs N GiB, the device has M GiB" when `needed` bytes exceed what `device` holds."""
    if why := misfit(needed, device):
        raise UsageError(f"{what} {why}" + (f"; {hint}" if hint else ""))


# the variants that hold the whole [B, H, Sq, Sk] score matrix (and its softmax) in memory
SCORE_MATRIX = ("naive", "inplace", "naive-compiled")


def check_workload_fits(workload: Any, variants: list[Any] = (), *, scores_as: str | None = None) -> None:
    """Before allocating: the inputs, an output per variant and the fp64 oracle's output must fit on the device,
    and, on the CPU (where an allocation past RAM swaps or is killed rather than raising), the score matrix of
    the variants that materialise it (`scores_as`: a name for a call that may, such as SDPA's math fallback). On a
    GPU those run and are an `oom` row."""
    w = workload
    elt = BYTES.get(w.dtype, 4)
    q = w.batch * w.heads * w.seq * w.head_dim
    kv = w.batch * w.kv_heads * w.kv_seq * w.head_dim
    base = (2 * q + 2 * kv) * elt + q * 8 * 2  # q, k, v, one output; the oracle's fp64 output and a variant's copy
    shape = f"{w.batch}x{w.heads}x{w.seq}x{w.head_dim}"
    check_fits(base, w.device, f"the workload {shape} {w.dtype} (inputs, outputs and the fp64 oracle's output)",
               "reduce --batch, --heads or --seq")
    names = [v.name for v in variants if v.name in SCORE_MATRIX] + ([scores_as] if scores_as else [])
    if names and not w.device.startswith("cuda"):
        scores = 2 * w.batch * w.heads * w.seq * w.kv_seq * max(elt, 4)
        check_fits(base + scores, w.device,
                   f"{', '.join(names)} on {shape} (the {w.batch}x{w.heads}x{w.seq}x{w.kv_seq} score matrix and its "
                   "softmax)", "drop them from --variants, or reduce --seq")


# --- models ---------------------------------------------------------------------------------------------------------

def model_parameters(config: Any) -> int:
    """About how many parameters a Llama-like decoder of `config` has (embeddings, attention, MLP, head)."""
    hidden = int(getattr(config, "hidden_size", 0) or 0)
    heads = int(getattr(config, "num_attention_heads", 1) or 1)
    kv = int(getattr(config, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(config, "head_dim", None) or hidden // heads)
    layers = int(getattr(config, "num_hidden_layers", 0) or 0)
    inter = int(getattr(config, "intermediate_size", 0) or 4 * hidden)
    vocab = int(getattr(config, "vocab_size", 0) or 0)
    tied = bool(getattr(config, "tie_word_embeddings", False))
    attention = hidden * heads * head_dim * 2 + hidden * kv * head_dim * 2
    mlp = 3 * hidden * inter
    return vocab * hidden * (1 if tied else 2) + layers * (attention + mlp + 2 * hidden) + hidden


def check_model_fits(config: Any, dtype: str, device: str, name: str) -> None:
    """The model's weights must fit on the device before transformers allocates them."""
    params = model_parameters(config)
    check_fits(params * BYTES.get(dtype, 4), device, f"model {name} ({params:.3g} parameters in {dtype})",
               "use a smaller preset or config")


def model_point_bytes(config: Any, dtype: str, device: str, batch: int, seq: int, *, prefill: bool = True,
                      repeated_kv: bool = False) -> int:
    """Bytes a forward of `batch` x `seq` tokens holds at its peak, roughly: weights + K and V of every layer + the fp32
    logits of the last position (the prefill keeps one per row, `logits_to_keep=1`, as `generate` does) + (a prefill
    on the CPU) eager's one-layer score matrix, where a too-large allocation swaps instead of raising. (Logits for
    every position refused llama-1b decode at 64 x 8k on a 140 GiB H200 as needing 270 GiB.)

    `repeated_kv`: the attention copies one layer's K and V out to the query heads (`serving.loops.repeats_kv`:
    transformers' eager function, and its sdpa function on the static cache). For llama-1b at 64 x 32k that is
    2 x 8.01 GiB beside the 64 GiB cache: SDPA ran out of memory asking for the first 8.01 GiB on an 80 GB H100, where
    the kernel, which reads the 8 KV heads in place, ran."""
    elt = BYTES.get(dtype, 4)
    heads = int(getattr(config, "num_attention_heads", 1) or 1)
    kv = int(getattr(config, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(config, "head_dim", None) or int(getattr(config, "hidden_size", 0) or 0) // heads)
    layers = int(getattr(config, "num_hidden_layers", 0) or 0)
    vocab = int(getattr(config, "vocab_size", 0) or 0)
    per_token = 2 * layers * kv * head_dim * elt
    scores = batch * heads * seq * seq * max(elt, 4) if prefill and not device.startswith("cuda") else 0
    repeated = 2 * batch * heads * seq * head_dim * elt if repeated_kv and heads > kv else 0
    return model_parameters(config) * elt + batch * seq * per_token + batch * vocab * 4 + scores + repeated


def prefill_chunk(config: Any, dtype: str, device: str, batch: int, context: int, new_tokens: int, *,
                  memory: int | None = None) -> int | None:
    """Tokens per prefill chunk for a decode point whose decode state fits but whose one-shot prefill would not, or
    None (prefill the prompt at once: the default, and every point where the estimate says it fits).

    The prefill's transient peak per token, beyond weights and cache, is estimated as the MLP's gate, up and product
    (3 x intermediate_size in the model's dtype) plus four fp32 copies of the hidden state (RMSNorm upcasts). On the
    H100 llama-1b's decode at 128 x 8k and 64 x 32k ran out of memory asking for exactly the MLP's 16 and 32 GiB,
    with the KV cache (34 and 69 GB) fitting. A chunk is the largest power of two whose peak takes at most half the
    memory the weights, the cache and the logits leave (CUDA graphs keep the prefill's buffers), and at least 64.
    `memory`: the device's bytes (default: what `device_memory` says of a CUDA device; the CPU is never chunked)."""
    if memory is None:
        have = device_memory(device) if device.startswith("cuda") else None
        if have is None:
            return None
        memory = have[0]
    hidden = int(getattr(config, "hidden_size", 0) or 0)
    inter = int(getattr(config, "intermediate_size", 0) or 4 * hidden)
    per_token = 3 * inter * BYTES.get(dtype, 4) + 4 * hidden * 4
    free = memory - model_point_bytes(config, dtype, device, batch, context + new_tokens, prefill=False)
    if free <= 0 or batch * context * per_token <= free:  # no room even for the cache: `model_point_misfit` says so
        return None
    chunk = 1 << max(6, int(free // 2 // max(batch * per_token, 1)).bit_length() - 1)
    return chunk if chunk < context else None


def _point_parts(repeated_kv: bool) -> str:
    """What `model_point_bytes` counted, as its messages say it."""
    return "(weights, KV cache, logits and one layer's K/V repeated to the query heads)" if repeated_kv else \
        "(weights, KV cache and logits)"


def check_model_batch_fits(config: Any, dtype: str, device: str, name: str, batch: int, seq: int, hint: str, *,
                           prefill: bool = True) -> None:
    check_fits(model_point_bytes(config, dtype, device, batch, seq, prefill=prefill), device,
               f"{name} on {batch}x{seq} tokens {_point_parts(False)}", hint)


def model_point_misfit(config: Any, dtype: str, device: str, batch: int, seq: int, *, prefill: bool = True,
                       repeated_kv: bool = False) -> str | None:
    """Why one serve point cannot fit on `device` ("(what was counted) needs N GiB, the device has M GiB of ..."), or
    None when it may."""
    why = misfit(model_point_bytes(config, dtype, device, batch, seq, prefill=prefill, repeated_kv=repeated_kv), device)
    return f"{_point_parts(repeated_kv)} {why}" if why else None
