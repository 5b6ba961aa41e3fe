"""The envelope grid: which SDPA backend each kind of input really gets on this device, and why.

Each cell changes one thing (or one pair of things) around a friendly base — head dim (odd ones and > 256),
dtype, mask kind (none, causal flag, boolean, additive float, right and left padding), GQA, Sq != Sk (decode
Sq = 1 and a chunked prefill), non-contiguous inputs (a `[B, S, H, D]` view, a strided last dim), dropout — and
is run for real under `watch()`: the backend in the table is the aten operator that executed, and for every cell
that missed the device's fastest backend, the reasons are PyTorch's (see `reasons`). A cell SDPA cannot run at all
says so with PyTorch's error. `crosscheck` re-runs cells under `torch.profiler` and classifies the kernels that
ran, so the table is checked against a second witness.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from attnprof.audit.reasons import advise
from attnprof.dispatch.sdpa_checks import preferred_backend
from attnprof.dispatch.watch import DispatchRecord, watch
from attnprof.errors import first_line
from attnprof.profiling.capture import capture
from attnprof.profiling.summary import summarize
from attnprof.profiling.trace import load_trace
from attnprof.variants.base import no_fp8_attention
from attnprof.variants.kernel_hub import KERNEL
from attnprof.variants.sdpa import SDPA, sdpa_call
from attnprof.workload import Inputs, Workload

DEFAULT_HEAD_DIMS = (64, 128, 256, 59, 96, 320, 512)
CPU_HEAD_DIMS = (64, 59, 320)


@dataclass(frozen=True)
class Cell:
    """One probe: a workload plus what `Workload` cannot say (dropout, a strided last dim)."""

    axis: str  # which thing this cell varies: head_dim, dtype, mask, gqa, seq, layout, dropout
    workload: Workload
    dropout: float = 0.0
    last_dim_strided: bool = False

    @property
    def label(self) -> str:
        extra = [f"dropout={self.dropout:g}"] if self.dropout else []
        return " ".join([self.workload.label(), *extra, *(["last-dim-strided"] if self.last_dim_strided else [])])


@dataclass
class CellResult:
    cell: Cell
    status: str  # ok | error
    backend: str | None = None
    fused_op: str | None = None
    preferred: str | None = None
    refusals: dict = field(default_factory=dict)
    advice: list = field(default_factory=list)
    error: str | None = None
    profiler_backend: str | None = None  # filled by crosscheck
    profiler_kernels: list = field(default_factory=list)
    record: DispatchRecord | None = None  # the watcher's record of the call

    @property
    def fell_back(self) -> bool:
        return self.status == "ok" and self.backend != self.preferred

    @property
    def agrees(self) -> bool | None:
        return None if self.profiler_backend is None else self.profiler_backend == self.backend

    def to_json(self) -> dict:
        return {"axis": self.cell.axis, "label": self.cell.label, "workload": self.cell.workload.to_json(),
                "dropout": self.cell.dropout, "last_dim_strided": self.cell.last_dim_strided,
                "status": self.status, "backend": self.backend, "fused_op": self.fused_op,
                "preferred": self.preferred, "fell_back": self.fell_back, "refusals": self.refusals,
                "advice": self.advice, "error": self.error, "profiler_backend": self.profiler_backend,
                "profiler_agrees": self.agrees, "profiler_kernels": self.profiler_kernels}


def grid(device: str, *, head_dims: tuple[int, ...] | None = None, dtypes: tuple[str, ...] | None = None,
         batch: int = 2, heads: int = 8, seq: int | None = None) -> list[Cell]:
    """The cells for `device`: head dims × dtypes, then one-factor changes around the base."""
    cuda = device.startswith("cuda")
    if dtypes is None:
        dtypes = ("bf16", "fp16", "fp32") if cuda else ("fp32", "bf16")
    head_dims = head_dims or (DEFAULT_HEAD_DIMS if cuda else CPU_HEAD_DIMS)
    seq = seq or (512 if cuda else 32)
    base = Workload(batch=batch, heads=heads, seq=seq, head_dim=128 if cuda else 64, dtype=dtypes[0], causal=True,
                    device=device)
    cells = [Cell("head_dim×dtype", base.replace(head_dim=d, dtype=t)) for t in dtypes for d in head_dims]
    cells += [Cell("mask", base.replace(causal=False))]
    for mask in ("bool", "additive", "pad-right", "pad-left"):
        cells += [Cell("mask", base.replace(mask=mask, dtype=t)) for t in dict.fromkeys((dtypes[0], dtypes[-1]))]
    cells += [Cell("gqa", base.replace(kv_heads=max(1, heads // 4))),
              Cell("gqa", base.replace(kv_heads=max(1, heads // 4), mask="pad-right"))]
    cells += [Cell("seq", base.replace(seq=1, kv_seq=seq)), Cell("seq", base.replace(seq=1, kv_seq=seq, causal=False)),
              Cell("seq", base.replace(seq=seq // 2, kv_seq=seq)),
              Cell("seq", base.replace(seq=1, kv_seq=seq, kv_heads=max(1, heads // 4), causal=False))]
    cells += [Cell("layout", base.replace(transposed=True)), Cell("layout", base, last_dim_strided=True)]
    cells += [Cell("dropout", base, dropout=0.1)]
    return cells


def _inputs(cell: Cell, seed: int) -> Inputs:
    inputs = cell.workload.make_inputs(seed)
    if cell.last_dim_strided:
        def strided(x: torch.Tensor) -> torch.Tensor:
            return x.transpose(-1, -2).contiguous().transpose(-1, -2)  # same [B, H, S, D] values, stride(-1) = S
        inputs = Inputs(strided(inputs.q), strided(inputs.k), strided(inputs.v), inputs.causal, inputs.scale,
                        inputs.attn_mask, inputs.valid)
    return inputs


def call(cell: Cell, inputs: Inputs) -> torch.Tensor:
    """The SDPA call the cell describes: `attnprof.variants.sdpa.sdpa_call`, plus dropout when asked."""
    if not cell.dropout:
        return sdpa_call(inputs)
    gqa = inputs.k.shape[1] != inputs.q.shape[1]
    return F.scaled_dot_product_attention(inputs.q, inputs.k, inputs.v, attn_mask=inputs.attn_mask,
                                          dropout_p=cell.dropout, is_causal=inputs.causal, scale=inputs.scale,
                                          enable_gqa=gqa)


def probe(cell: Cell, seed: int = 0) -> CellResult:
    """Run one cell under the watcher: what ran and, when it was not the fastest backend, why."""
    preferred = preferred_backend(cell.workload.device)
    if cell.workload.fp8_attention:  # SDPA has no FP8 path: say so, and what could run FP8 attention here
        return CellResult(cell, "error", preferred=preferred, error=fp8_verdict(cell.workload))
    try:
        inputs = _inputs(cell, seed)
        with watch() as calls:
            call(cell, inputs)
    except (RuntimeError, torch.OutOfMemoryError) as exc:  # SDPA refused every allowed backend, or OOM
        return CellResult(cell, "error", preferred=preferred, error=first_line(exc, typed=False))
    rec = calls[-1]
    return CellResult(cell, "ok", rec.backend, rec.fused_op, rec.preferred, dict(rec.refusals), advise(rec),
                      record=rec)


def fp8_verdict(workload: Workload) -> str:
    """Why SDPA runs no FP8 attention, and whether our kernel can run this one (its FP8 path or its reason)."""
    kernel = KERNEL.check(workload)
    could = (f"the kernel can: {kernel.note} (attnprof bench --dtype fp8 --variants kernel)" if kernel.ok
             else f"the kernel cannot either: {kernel.reason}")
    return f"{no_fp8_attention(SDPA)}; {could}"


def crosscheck(result: CellResult, folder, seed: int = 0) -> CellResult:
    """Profile the cell once with torch.profiler and read the backend from the kernel names that ran."""
    if result.status != "ok":
        return result
    inputs = _inputs(result.cell, seed)
    path = capture(lambda: call(result.cell, inputs), folder / "crosscheck.json", device=result.cell.workload.device,
                   steps=1, warmup=1)
    summary = summarize(load_trace(path))
    path.unlink(missing_ok=True)
    fused = [k for k in summary.kernels if k.role == "fused_attention"]
    result.profiler_backend = fused[0].backend if fused else "math"
    result.profiler_kernels = [k.name for k in fused] or [k.name for k in summary.kernels if k.role in
                                                          ("gemm", "softmax")][:3]
    return result


def run_grid(cells: list[Cell], *, seed: int = 0, crosscheck_every: int = 0, folder=None,
             on_cell: Callable[[int], None] | None = None) -> list[CellResult]:
    """Probe every cell; with `crosscheck_every = n`, profile every n-th cell (1 = all) into `folder`."""
    results = []
    for i, cell in enumerate(cells):
        result = probe(cell, seed)
        if crosscheck_every and folder is not None and i % crosscheck_every == 0:
            result = crosscheck(result, folder, seed)
        results.append(result)
        if on_cell:
            on_cell(i + 1)
    return results

