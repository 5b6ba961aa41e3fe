"""Up-front validation of what users hand in: results rows, trace events, model configs and `--kernel`.

A row or an event that does not hold what its readers rely on is a corrupt input: one `UsageError` naming the file
and the line (or event), exit 2 — never a traceback further down, and never a NaN analysed as a real number. The same
for a config whose attention geometry transformers would divide by zero on, and a `--kernel` that cannot load for a
reason of its own. Whether sizes fit the device's memory is `attnprof.memory_fit`.
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


# --- --kernel ------------------------------------------------------------------------------------------------------

def check_kernel(spec: Any, asked: bool) -> None:
    """A `--kernel` the user gave that cannot be loaded for a reason of its own (a folder that is not a kernel repo, a
    broken metadata.json, a Hub name without --trust-remote-kernel) is a UsageError up front, before any device check
    could hide it behind "no CUDA device". The default repo and load failures of the system are rows."""
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


def check_positions(length: int, max_positions: int, model: str, flag: str) -> None:
    """`length` positions (a prompt, plus the tokens generated after it) must fit the model's
    max_position_embeddings (0: not set): past it, RoPE models run on positions they were never meant for and
    transformers only logs a reminder. One check for serve, audit and verify."""
    if max_positions and length > max_positions:
        raise UsageError(f"{flag} {length} is longer than {model} allows (max_position_embeddings {max_positions})")
