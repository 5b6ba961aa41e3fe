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
