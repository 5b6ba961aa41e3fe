"""attnprof: what attention layers really do on the GPU.

The public API, imported lazily so that `attnprof --help` does not pay for importing torch:
`Workload`, `resolve_variants`, `VARIANTS`, `reference_attention`, `run_stages`, `watch`, `explain`, `expect_fused`.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "Workload": "attnprof.workload",
    "Inputs": "attnprof.workload",
    "VARIANTS": "attnprof.variants",
    "resolve_variants": "attnprof.variants",
    "reference_attention": "attnprof.variants",
    "run_stages": "attnprof.stages",
    "watch": "attnprof.audit",
    "explain": "attnprof.audit",
    "expect_fused": "attnprof.audit.expect",
    "UsageError": "attnprof.errors",
    "CheckFailed": "attnprof.errors",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'attnprof' has no attribute {name!r}")
