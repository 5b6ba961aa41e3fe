"""The dispatch watcher: which SDPA backend each call really took, with no profiler.

Inside `watch()`, every `F.scaled_dot_product_attention` call (from any module, however it was imported) is seen
by a `TorchFunctionMode`; while it runs, a `TorchDispatchMode` records the aten operators it reaches. The backend
is read from what executed — `aten::_scaled_dot_product_cudnn_attention` is cuDNN, a call that reached no fused
operator ran the math path — never from a table of expected cases.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

# aten operator name fragment → backend, most specific first.
FUSED_OPS: tuple[tuple[str, str], ...] = (
    ("_scaled_dot_product_cudnn_attention", "cudnn"),
    ("_cudnn_attention_forward", "cudnn"),
    ("_scaled_dot_product_flash_attention_for_cpu", "cpu_flash"),
    ("_scaled_dot_product_fused_attention_overrideable", "overrideable"),
    ("_scaled_dot_product_efficient_attention", "efficient"),
    ("_efficient_attention_forward", "efficient"),
    ("_scaled_dot_product_flash_attention", "flash"),
    ("_flash_attention_forward", "flash"),
)


def backend_of(op_names: list[str]) -> tuple[str, str | None]:
    """(backend, the fused aten op) for the operators one SDPA call executed; no fused op means math."""
    for name in op_names:
        for fragment, backend in FUSED_OPS:
            if fragment in name:
                return backend, name
    return "math", None


@dataclass
class DispatchRecord:
    """One SDPA call: what ran, on what. Shapes are `[B, H, S, D]`."""

    backend: str
    fused_op: str | None
    ops: list[str] = field(default_factory=list)
    q_shape: tuple = ()
    k_shape: tuple = ()
    dtype: str = ""
    device: str = ""

    def to_json(self) -> dict:
        return {"backend": self.backend, "fused_op": self.fused_op, "q_shape": list(self.q_shape),
                "k_shape": list(self.k_shape), "dtype": self.dtype, "device": self.device}


class _OpRecorder(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func.overloadpacket.__name__) if hasattr(func, "overloadpacket") else str(func))
        return func(*args, **(kwargs or {}))


class _SdpaWatcher(TorchFunctionMode):
    def __init__(self, records: list[DispatchRecord]) -> None:
        super().__init__()
        self.records = records

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is not F.scaled_dot_product_attention:
            return func(*args, **kwargs)
        with _OpRecorder() as recorder:
            out = func(*args, **kwargs)
        backend, fused = backend_of(recorder.ops)
        q, k = args[0], args[1]
        self.records.append(DispatchRecord(backend=backend, fused_op=fused, ops=recorder.ops,
                                           q_shape=tuple(q.shape), k_shape=tuple(k.shape),
                                           dtype=str(q.dtype).replace("torch.", ""), device=str(q.device)))
        return out


@contextlib.contextmanager
def watch() -> Iterator[list[DispatchRecord]]:
    """`with watch() as calls: model(x)` → `calls` lists one `DispatchRecord` per SDPA call."""
    records: list[DispatchRecord] = []
    with _SdpaWatcher(records):
        yield records
