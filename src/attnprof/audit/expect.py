"""`expect_fused()`: a test assertion that no attention call fell back to an unfused path.

    with attnprof.expect_fused():
        model(input_ids)

raises `AssertionError` listing every offending call (module path, envelope, the backend that ran) with PyTorch's
reason for refusing each faster backend and what to change. It is a plain context manager, usable in any pytest
suite; the detection comes from the aten operator each call executed (see `attnprof.dispatch.watch`).

A block that makes no attention call at all fails too (`min_calls=1`): a model that silently switched to a
hand-written attention (transformers' "eager") would otherwise pass an assertion it never exercised.

`allow="measured"` judges by time instead of by name: after the block, each call site's recorded calls are replayed
on every SDPA backend (first call at a new KV length and repeat call, `attnprof.audit.regret`), and the block fails
when what ran costs more than `tolerance` (default 0.10) above the fastest allowed backend for that site.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator

from attnprof.audit.phases import group_sites
from attnprof.audit.reasons import explain
from attnprof.audit.regret import measure
from attnprof.backends import SDPA_FUSED
from attnprof.dispatch.watch import DispatchRecord, watch

# What `allow=` may name. "fused" is any fused kernel; "preferred" is the fastest backend of this device.
ALLOWABLE = ("fused", "preferred", "measured", *SDPA_FUSED, "flex", "kernel", "math")


def offending(calls: list[DispatchRecord], allow: Iterable[str] = ("fused",)) -> list[DispatchRecord]:
    """The calls whose backend `allow` does not accept. Unknown names in `allow` are a ValueError."""
    allowed = {allow} if isinstance(allow, str) else set(allow)
    unknown = allowed - set(ALLOWABLE)
    if unknown:
        raise ValueError(f"unknown backend(s) {sorted(unknown)} in allow=; valid: {', '.join(ALLOWABLE)}")
    rules = allowed - {"measured"}  # "measured" is judged by time (`measured_offenders`), not per call
    return [c for c in calls if not _accepted(c, rules)] if rules else []


def _accepted(call: DispatchRecord, allowed: set[str]) -> bool:
    if "fused" in allowed and call.fused:
        return True
    if "preferred" in allowed and call.preferred is not None and call.backend == call.preferred:
        return True
    if call.backend in ("flex", "kernel") and not call.fused:
        return "math" in allowed  # eager flex is an unfused implementation
    return call.backend in allowed


def row_of(record: DispatchRecord) -> dict:
    """A call as the row `violates` judges: what `attnprof audit` writes for a grid cell, from a recorded call."""
    return {"backend": record.backend, "fused": record.fused, "preferred": record.preferred, "error": None}


def violates(row: dict, require: str) -> bool:
    """The rule of `expect_fused(allow=[require])`, on a row (an error row ran nothing, so it breaks any rule);
    `attnprof audit --require` judges its grid rows and its recorded calls with it."""
    if row.get("error") or row.get("rejected"):
        return True
    if require == "fused":
        return not row["fused"]
    if require == "preferred":
        return row["backend"] != row["preferred"]
    return row["backend"] != require


def describe(calls: list[DispatchRecord]) -> str:
    """One paragraph per call: where, what ran, why the faster backends refused, what to change."""
    return "\n".join(explain(c).text() for c in calls)


@contextlib.contextmanager
def expect_fused(allow: Iterable[str] | str = ("fused",), *, min_calls: int = 1,
                 tolerance: float = 0.10) -> Iterator[list[DispatchRecord]]:
    """Fail (AssertionError) when an attention call inside the block ran a backend `allow` does not name.

    `allow` names acceptable backends: "fused" (default: any fused kernel), "preferred" (only the fastest backend
    of this device, e.g. cuDNN on an H200), or specific ones: "cudnn", "flash", "efficient", "cpu_flash", "flex",
    "kernel", "math"; or "measured": the block's calls are timed on every SDPA backend after it ran, and a call site
    whose backend costs more than `tolerance` (a fraction, > 0) above the fastest fails. Yields the list of
    `DispatchRecord`s, filled as the block runs.
    """
    allowed = (allow,) if isinstance(allow, str) else tuple(allow)
    offending([], allowed)  # validate the names before the block runs
    if not tolerance > 0:
        raise ValueError(f"tolerance must be > 0 (a fraction of the fastest backend), got {tolerance}")
    with watch(observe="every" if "measured" in allowed else "first") as calls:
        yield calls
    bad = offending(calls, allowed)
    if bad:
        raise AssertionError(f"{len(bad)} of {len(calls)} attention call(s) ran a backend outside "
                             f"allow={list(allowed)}:\n{describe(bad)}")
    if len(calls) < min_calls:
        raise AssertionError(f"expected at least {min_calls} attention call(s), saw {len(calls)}: is the model "
                             "using SDPA (attn_implementation='sdpa') at all?")
    if "measured" in allowed:
        over = measured_offenders(calls, tolerance)
        if over:
            raise AssertionError(f"{len(over)} call site(s) ran a backend more than {100 * tolerance:.0f} % slower "
                                 "than the fastest measured one:\n" + "\n".join(over))


def measured_offenders(calls: list[DispatchRecord], tolerance: float) -> list[str]:
    """One line per call site (× shape class) whose measured regret exceeds `tolerance` or could not be measured."""
    sites = group_sites(calls)
    if not sites:
        return []
    steps = len({c.k_shape[2] for s in sites if s.shape_class == "decode" for c in s.calls})
    lines = []
    for r in measure(sites, device=sites[0].calls[0].device, steps=steps, tolerance=tolerance):
        if r.verdict == "unmeasured":
            lines.append(f"{r.site.key}: what ran could not be re-measured ({r.unmeasured})")
        elif r.verdict == "over":
            lines.append(f"{r.site.key}: ran {', '.join(r.ran)}; fastest {r.best.arm} ({r.best.backend}); regret "
                         f"{r.regret_pct:.0f} %, {r.per_call_ms:.3g} ms per call; " + "; ".join(r.fixes))
    return lines
