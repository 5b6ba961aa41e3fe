"""Arm timings cached per device and software versions, beside the ceilings (`bench.ceilings.cache_path`).

The timing of a replayed call depends on the device, torch, CUDA, cuDNN (its plans), Triton (flex and kernels) and
the call itself. So an entry is keyed by `versions(device)` (the ceilings' key plus Triton's version), the arm and
the call's envelope (shapes, dtypes, strides, mask, causal flag, scale) and how it was timed (samples, reps); a new
driver, torch or cuDNN is a miss and a new measurement. User variants (`package.module:function`) are never cached:
their code can change under the same name. Failures other than a refusal are not cached either (an OOM can pass).
"""

from __future__ import annotations

import json
from pathlib import Path

from attnprof.audit.arm_timing import ArmResult
from attnprof.bench.ceilings import cache_key, cache_path
from attnprof.dispatch.watch import DispatchRecord
from attnprof.errors import UsageError
from attnprof.files import write_json
from attnprof.provenance import _version

SCHEMA = "attnprof.regret-cache/1"


def path() -> Path:
    return cache_path().parent / "regret.json"


def versions(device: str) -> str:
    return f"{cache_key(device)} | triton {_version('triton')}"


def entry_key(device: str, arm: str, rec: DispatchRecord, *, samples: int, reps: int) -> str:
    strides = ",".join(f"{k}{list(v)}" for k, v in sorted(rec.strides.items()))
    call = (f"q{list(rec.q_shape)} k{list(rec.k_shape)} v{list(rec.v_shape)} {'/'.join(rec.dtypes) or rec.dtype} "
            f"{strides} mask={rec.mask}{list(rec.mask_shape) if rec.mask_shape else ''}{rec.mask_dtype or ''} "
            f"causal={rec.causal} gqa={rec.enable_gqa} scale={rec.scale}")
    return f"{versions(device)} || {arm} || {call} || samples={samples} reps={reps}"


def cacheable(arm: str, result: ArmResult) -> bool:
    return ":" not in arm and result.status in ("ok", "rejected")


def load() -> dict[str, dict]:
    p = path()
    try:
        data = json.loads(p.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UsageError(f"regret cache {p} is unreadable ({exc}); delete it or pass --no-cache") from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise UsageError(f"regret cache {p} is not {SCHEMA}; delete it or pass --no-cache")
    return dict(data.get("entries") or {})


def lookup(entries: dict[str, dict], key: str) -> ArmResult | None:
    found = entries.get(key)
    return ArmResult.from_json(found) if found is not None else None


def store(new: dict[str, ArmResult]) -> Path | None:
    """Add these entries to the cache file (read again first: another process may have written)."""
    if not new:
        return None
    entries = load()
    for key, result in new.items():
        entries[key] = result.to_json() | {"cached": False}
    return write_json(path(), {"schema": SCHEMA, "entries": entries})
