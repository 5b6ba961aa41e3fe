"""`expect_fused()`: a test assertion that no attention call fell back to an unfused path.

    with attnprof.expect_fused():
        model(input_ids)

raises `AssertionError` listing every offending call (module path, envelope, the backend that ran) with PyTorch's
reason for refusing each faster backend and what to change. It is a plain context manager, usable in any pytest
suite; the detection comes from the aten operator each call executed (see `attnprof.audit.watch`).

A block that makes no attention call at all fails too (`min_calls=1`): a model that silently switched to a
hand-written attention (transformers' "eager") would otherwise pass an assertion it never exercised.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator

from attnprof.audit.watch import DispatchRecord, watch
from attnprof.backends import SDPA_FUSED

# What `allow=` may name. "fused" is any fused kernel; "preferred" is the fastest backend of this device.
ALLOWABLE = ("fused", "preferred", *SDPA_FUSED, "flex", "kernel", "math")


def offending(calls: list[DispatchRecord], allow: Iterable[str] = ("fused",)) -> list[DispatchRecord]:
    """The calls whose backend `allow` does not accept. Unknown names in `allow` are a ValueError."""
    allowed = set(allow)
    unknown = allowed - set(ALLOWABLE)
    if unknown:
        raise ValueError(f"unknown backend(s) {sorted(unknown)} in allow=; valid: {', '.join(ALLOWABLE)}")
    return [c for c in calls if not _accepted(c, allowed)]


def _accepted(call: DispatchRecord, allowed: set[str]) -> bool:
    if "fused" in allowed and call.fused:
        return True
    if "preferred" in allowed and call.preferred is not None and call.backend == call.preferred:
        return True
    if call.backend in ("flex", "kernel") and not call.fused:
        return "math" in allowed  # eager flex is an unfused implementation
    return call.backend in allowed


def describe(calls: list[DispatchRecord]) -> str:
    """One paragraph per call: where, what ran, why the faster backends refused, what to change."""
    from attnprof.audit.reasons import explain

    return "\n".join(explain(c).text() for c in calls)


@contextlib.contextmanager
def expect_fused(allow: Iterable[str] = ("fused",), *, min_calls: int = 1) -> Iterator[list[DispatchRecord]]:
    """Fail (AssertionError) when an attention call inside the block ran a backend `allow` does not name.

    `allow` names acceptable backends: "fused" (default: any fused kernel), "preferred" (only the fastest backend
    of this device, e.g. cuDNN on an H200), or specific ones: "cudnn", "flash", "efficient", "cpu_flash", "flex",
    "kernel", "math". Yields the list of `DispatchRecord`s, filled as the block runs.
    """
    allowed = tuple(allow)
    offending([], allowed)  # validate the names before the block runs
    with watch() as calls:
        yield calls
    bad = offending(calls, allowed)
    if bad:
        raise AssertionError(f"{len(bad)} of {len(calls)} attention call(s) ran a backend outside "
                             f"allow={list(allowed)}:\n{describe(bad)}")
    if len(calls) < min_calls:
        raise AssertionError(f"expected at least {min_calls} attention call(s), saw {len(calls)}: is the model "
                             "using SDPA (attn_implementation='sdpa') at all?")
