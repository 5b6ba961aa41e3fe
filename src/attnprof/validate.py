"""Up-front validation, in one place: results rows and trace events.

A row or an event that does not hold what its readers rely on is a corrupt input: one `UsageError` naming the file
and the line (or event), exit 2 — never a traceback further down, and never a NaN analysed as a real number.
"""

from __future__ import annotations

import math
from typing import Any

from attnprof.errors import UsageError

LATENCY_KEYS = ("p20", "p50", "p80")
NUMBERS = ("tokens", "flops", "min_bytes", "intensity", "tflops", "gbps", "pct_matmul_peak", "pct_copy_peak",
           "peak_mib")


def _finite_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_row(row: dict[str, Any], where: str, statuses: tuple[str, ...]) -> None:
    """A bench results row: required keys and types. `where` is `file, line N`."""
    for name in ("key", "variant"):
        if not isinstance(row.get(name), str) or not row.get(name):
            raise UsageError(f"{where}: {name!r} missing or not a string (got {row.get(name)!r})")
    status = row.get("status")
    if status not in statuses:
        raise UsageError(f"{where}: status {status!r} is not one of {', '.join(statuses)}")
    for name, kinds in (("workload", dict), ("provenance", dict), ("ceilings", dict), ("speedup", dict),
                        ("label", str), ("target", str), ("reason", str), ("peak_mib_note", str)):
        if name in row and not isinstance(row[name], (kinds, type(None))):
            raise UsageError(f"{where}: {name!r} is a {type(row[name]).__name__}, not a{'n object' if kinds is dict else ' string'}")
    for name in NUMBERS:
        value = row.get(name)
        if value is not None and not _finite_number(value):
            raise UsageError(f"{where}: {name!r} is {value!r}, not a finite number")
    if "workload" in row and row["workload"] is not None:
        for name, value in row["workload"].items():
            if name in ("batch", "heads", "kv_heads", "seq", "kv_seq", "head_dim") and value is not None and (
                    not isinstance(value, int) or isinstance(value, bool) or value < 0):
                raise UsageError(f"{where}: workload.{name} is {value!r}, not a size")
            if name in ("dtype", "device", "layout", "mask") and value is not None and not isinstance(value, str):
                raise UsageError(f"{where}: workload.{name} is {value!r}, not a string")
    if status != "ok":
        return
    lat = row.get("latency_ms")
    if not isinstance(lat, dict):
        raise UsageError(f"{where}: an ok row without a latency_ms object (got {lat!r})")
    for name in LATENCY_KEYS:
        value = lat.get(name)
        if not _finite_number(value) or value < 0:
            raise UsageError(f"{where}: latency_ms.{name} is {value!r}, not a finite number of milliseconds "
                             "(a broken measurement cannot be reported as ok)")


def event_times(raw: dict[str, Any], index: int, path: Any) -> tuple[float, float]:
    """`ts` and `dur` of a trace event as finite numbers (absent = 0); anything else is a corrupt trace."""
    out = []
    for name in ("ts", "dur"):
        value = raw.get(name, 0.0)
        if isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                value = None
        if not _finite_number(value):
            raise UsageError(f"{path}: corrupt trace: event {index} ({str(raw.get('name', ''))[:40]!r}) has "
                             f"{name} {raw.get(name)!r}, not a finite number")
        out.append(float(value))
    return out[0], out[1]


# --- sizes against the device's memory --------------------------------------------------------------------------

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


# --- model configurations ------------------------------------------------------------------------------------------

def _int_field(fields: dict[str, Any], name: str) -> int | None:
    value = fields.get(name)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        raise UsageError(f"{name} is {value!r}, not an integer")
    return value


def check_model_fields(fields: dict[str, Any], where: str) -> None:
    """The attention geometry of a decoder config (a dict of config.json fields, or a config's `to_dict()`):
    positive heads and layers, hidden size divisible by the heads (unless head_dim is given), KV heads dividing
    the heads. Bad ones are one UsageError naming `where` (transformers would divide by zero or fail deep inside)."""
    try:
        heads = _int_field(fields, "num_attention_heads")
        kv = _int_field(fields, "num_key_value_heads")
        hidden = _int_field(fields, "hidden_size")
        layers = _int_field(fields, "num_hidden_layers")
        head_dim = _int_field(fields, "head_dim")
        for name in ("intermediate_size", "vocab_size"):
            value = _int_field(fields, name)
            if value is not None and value <= 0:
                raise UsageError(f"{name} is {value}; it must be positive")
    except UsageError as exc:
        raise UsageError(f"{where}: {exc}") from None
    problem = None
    if heads is not None and heads <= 0:
        problem = f"num_attention_heads is {heads}; a model needs at least one attention head"
    elif layers is not None and layers <= 0:
        problem = f"num_hidden_layers is {layers}; a model needs at least one layer"
    elif hidden is not None and hidden <= 0:
        problem = f"hidden_size is {hidden}; it must be positive"
    elif head_dim is not None and head_dim <= 0:
        problem = f"head_dim is {head_dim}; it must be positive"
    elif kv is not None and kv <= 0:
        problem = f"num_key_value_heads is {kv}; it must be positive"
    elif heads and hidden and not head_dim and hidden % heads:
        problem = (f"hidden_size {hidden} is not divisible by num_attention_heads {heads} "
                   f"(head dim {hidden / heads:g}); set head_dim or change one of them")
    elif heads and kv and heads % kv:
        problem = (f"num_key_value_heads {kv} does not divide num_attention_heads {heads} "
                   "(grouped-query attention shares each KV head among a whole number of query heads)")
    if problem:
        raise UsageError(f"{where}: {problem}")


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


# --- --kernel ------------------------------------------------------------------------------------------------------

def check_kernel(spec: Any, asked: bool) -> None:
    """A `--kernel` the user gave that cannot be loaded for a reason of its own (a folder that is not a kernel repo, a
    broken metadata.json, a Hub name without --trust-remote-kernel) is a UsageError now, before any device check
    could hide it behind "no CUDA device". The default repo and load failures of the system are rows, as before."""
    if not asked or spec is None:
        return
    from attnprof.variants import kernel_hub

    if spec.path is not None:
        try:
            problem = kernel_hub.metadata_problem(spec.path)
        except ImportError:
            return  # no `kernels` library: the variant's row says so
        if problem:
            raise UsageError(f"--kernel {spec.path}: {problem}")
    elif not spec.trust_remote and spec.repo_id not in kernel_hub._local_overrides():
        raise UsageError(f"--kernel {spec.label()} is code from the Hugging Face Hub; pass --trust-remote-kernel to "
                         "allow loading it")


def model_point_bytes(config: Any, dtype: str, device: str, batch: int, seq: int, *, prefill: bool = True,
                      repeated_kv: bool = False) -> int:
    """Bytes a forward of `batch` x `seq` tokens holds at its peak, roughly: weights + K and V of every layer + the fp32
    logits of the last position (the prefill keeps one per row, `logits_to_keep=1`, as `generate` does) + (a prefill
    on the CPU) eager's one-layer score matrix, where a too-large allocation swaps instead of raising. (Logits for
    every position refused llama-1b decode at 64 x 8k on a 140 GiB H200 as needing 270 GiB.)

    `repeated_kv`: the attention copies one layer's K and V out to the query heads (`serving.loops.repeats_kv`:
    transformers' eager function, and its sdpa function on the static cache). For llama-1b at 64 x 32k that is 2 x 8.01 GiB beside
    the 64 GiB cache: SDPA ran out of memory asking for the first 8.01 GiB on an 80 GB H100 (session 17), where the
    kernel, which reads the 8 KV heads in place, ran."""
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


def check_serve_fits(plan: dict, device: str) -> None:
    """`serve`'s smallest prefill and decode points, before the first is run: when even they cannot fit, nothing can
    run (exit 2). A larger point of a grid that cannot fit is a row that says so (`oom`, not run), so one cell past
    the device's memory does not cost the cells that fit (`serving.session`)."""
    config, dtype, name = plan["config"], plan["dtype"], plan["model"]
    if plan.get("batch") and plan.get("context"):
        check_model_batch_fits(config, dtype, device, f"{name} prefill", min(plan["batch"]), min(plan["context"]),
                               "reduce --batch or --context")
    if plan.get("decode_batch"):
        check_model_batch_fits(config, dtype, device, f"{name} decode", min(plan["decode_batch"]),
                               min(plan["decode_context"]) + plan["new_tokens"], "reduce --decode-batch or --decode-context",
                               prefill=False)


def check_positions(length: int, max_positions: int, model: str, flag: str) -> None:
    """`length` positions (a prompt, plus the tokens generated after it) must fit the model's
    max_position_embeddings (0: not set): past it, RoPE models run on positions they were never meant for and
    transformers only logs a reminder. One check for serve, audit and verify."""
    if max_positions and length > max_positions:
        raise UsageError(f"{flag} {length} is longer than {model} allows (max_position_embeddings {max_positions})")
