"""One way to run a variant: `run(variant, workload)` → `Run`, the single measurement path of every command.

`stages`, `bench`'s sweep, `verify`'s kernel level and `benchmarks/kernel_bench.py` call `run()`; `serve`'s static
points, which measure a whole model rather than one attention call, go through its failure half, `attempt()`. So
there is one answer to "what happened when this ran":

| status | meaning |
| --- | --- |
| ok | it ran, and what was asked of it held (a finite output and timing; within the gate when one was given) |
| lossy | it ran, its output is finite, and it is further from the fp64 oracle than the gate allows |
| rejected | `Variant.supports` refused the workload before anything ran, with its reason (never a crash) |
| oom | the allocator refused; the reason names the bytes asked for when the message says them |
| error | it raised, or its output (in rows that see a key) or its timing is NaN/Inf: never `ok` (without a reference, the first call's output is checked) |

A compiled function that hits dynamo's recompile limit (`torch._dynamo hit config.recompile_limit`) runs eagerly for
every shape it has not compiled before, for the rest of the process, silently after that one warning: for flex
that means unfused. `recompile_limit_hits()` captures the warning; `unfused_since(name)` says, for the rest of the
process, since when a function whose name contains `name` has been past its limit (`verify` labels such rows
`flex (unfused)`).

One `failure(exc)` maps an exception to its status and reason (one OOM detector, one "first line"). A variant
that returns `None` or the wrong shape (`VariantFailed`) or calls `sys.exit` is an `error` row like one that raises;
a `UsageError` (the user's command line, e.g. a user function with the wrong signature) and Ctrl-C propagate.
Errors against the oracle go through `oracle.agreement` (`Reference`): rows that see no key are compared apart
from the others, the same way everywhere. Whether an agreement is `lossy` is decided here when the caller passes a
`Gate` (plain PyTorch's error in the same dtype, times k); without one a finite output is `ok`.

The order inside one run: `supports()`; a first call (compilation, autotuning, lazy loads: never measured); the
measured call (under the dispatch watcher and the CUDA peak-memory counter when asked), its output checked against
the reference; `steps` profiled calls written as a Chrome trace; the CPU peak from that profile (or from one
profiled call); then `reps` timed calls (`measure.timing`). Everything runs under `torch.no_grad()`.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Generic, TypeVar

import torch

from attnprof.dispatch.watch import DispatchRecord, watch
from attnprof.errors import UsageError, first_line
from attnprof.measure.memory import cpu_peak_or_reason, cuda_peak, peak_mib
from attnprof.measure.timing import Timing, time_call
from attnprof.oracle.agreement import Agreement, Reference
from attnprof.oracle.gate import Gate, Verdict
from attnprof.profiling.summary import Summary
from attnprof.variants.base import Variant, check_output
from attnprof.workload import Inputs, Workload

T = TypeVar("T")


class Status(str, Enum):
    """What happened when a variant ran (see the module docstring). A `str`: `Status.OK == "ok"`, JSON writes it."""

    OK = "ok"
    LOSSY = "lossy"
    REJECTED = "rejected"
    OOM = "oom"
    ERROR = "error"

    def __str__(self) -> str:
        return self.value

    @property
    def ran(self) -> bool:
        """It ran to the end: its numbers exist (ok or lossy)."""
        return self in (Status.OK, Status.LOSSY)


_OOM_TEXT = ("can't allocate memory", "not enough memory", "out of memory")
_ASKED = re.compile(r"[Tt]ried to allocate (([\d.]+) ?([KMGT]i?B|bytes))")
_UNITS = {"bytes": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40, "KB": 10**3, "MB": 10**6,
          "GB": 10**9, "TB": 10**12}


def is_oom(exc: BaseException) -> bool:
    """A CUDA OOM, or the CPU allocator refusing (`DefaultCPUAllocator: can't allocate memory`)."""
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    text = str(exc).lower()
    return isinstance(exc, (RuntimeError, MemoryError)) and any(t in text for t in _OOM_TEXT)


def asked_bytes(exc: BaseException) -> int | None:
    """The allocation the allocator refused, in bytes, when its message says it."""
    m = _ASKED.search(str(exc))
    return int(float(m.group(2)) * _UNITS[m.group(3)]) if m else None


def failure(exc: BaseException) -> tuple[Status, str]:
    """The status and the one-line reason of an exception raised while a variant ran."""
    if is_oom(exc):
        m = _ASKED.search(str(exc))
        return Status.OOM, "out of memory" + (f": asked for {m.group(1)}" if m else "") + f" ({first_line(exc)[:200]})"
    if isinstance(exc, SystemExit):  # sys.exit inside a variant: its failure, not the tool's exit code
        return Status.ERROR, f"raised SystemExit({exc.code!r}): the variant called sys.exit; the run went on"
    return Status.ERROR, first_line(exc)[:400]


_PAST_LIMIT: dict[str, str] = {}  # function name → the warning's first lines: past dynamo's recompile limit
_LIMIT_FN = re.compile(r"function: '([^']+)'")


class _LimitHandler(logging.Handler):
    attnprof_listener = True  # stderr.third_party_noise quiets third-party records for every handler but this kind

    def __init__(self, hits: list[str]) -> None:
        super().__init__(logging.WARNING)
        self.hits = hits

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if "hit config." in text:  # "torch._dynamo hit config.recompile_limit (8)\n   function: 'flex_attention' …"
            lines = [x.strip() for x in text.splitlines()[:2]]
            m = _LIMIT_FN.search(text)
            _PAST_LIMIT.setdefault(m.group(1) if m else "?", "; ".join(lines))
            self.hits.append("; ".join(lines))


@contextlib.contextmanager
def recompile_limit_hits() -> Iterator[list[str]]:
    """While open, dynamo's "hit config.recompile_limit" warnings (their first two lines) are appended to the list;
    the functions they name are remembered for `unfused_since`. The limit the hits are judged by is the one in force
    when the block opened, and it is put back when it closes: code inside may raise it for good (transformers 5.17's
    chunked prefill sets 64), and what runs after must keep its guard."""
    import torch._dynamo

    hits: list[str] = []
    handler = _LimitHandler(hits)
    logger = logging.getLogger("torch._dynamo.convert_frame")
    limit = torch._dynamo.config.recompile_limit
    logger.addHandler(handler)
    try:
        yield hits
    finally:
        logger.removeHandler(handler)
        torch._dynamo.config.recompile_limit = limit


def unfused_since(name: str) -> str | None:
    """The recompile-limit warning of a function whose name contains `name`, seen in this process (None: none)."""
    return next((text for fn, text in _PAST_LIMIT.items() if name in fn), None)


@dataclass(frozen=True)
class Attempt(Generic[T]):
    """What `attempt(fn)` gave: fn's value, or the failure's status and reason (value None)."""

    status: Status
    value: T | None = None
    reason: str | None = None
    asked_bytes: int | None = None


def attempt(fn: Callable[[], T], *, device: str) -> Attempt[T]:
    """`fn()`, or its failure (see `failure`): any exception, `SystemExit` too (a variant that calls `sys.exit` is
    an error row, not the tool's exit); a UsageError and Ctrl-C (KeyboardInterrupt) propagate. Memory is freed after
    a failure, and after every call on CUDA (a collection per call costs ~0.1 s on the CPU, where refcounting frees
    a success)."""
    try:
        return Attempt(Status.OK, value=fn())
    except UsageError:
        raise
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - every failure of a measured call is its result
        status, reason = failure(exc)
        got = Attempt(status, reason=reason, asked_bytes=asked_bytes(exc) if status is Status.OOM else None)
    finally:
        if device.startswith("cuda"):  # device memory back before the next call allocates
            gc.collect()
            torch.cuda.empty_cache()
    gc.collect()  # a failure's traceback held the call's frames in cycles: free their tensors now
    return got


@dataclass(frozen=True)
class Run:
    """One variant on one workload: its status and every measurement that was asked for and completed."""

    variant: str
    family: str
    status: Status
    reason: str | None = None
    asked_bytes: int | None = None  # oom: the allocation refused
    agreement: Agreement | None = None  # against the reference, when one was given
    verdict: Verdict | None = None  # the gate's verdict, when a gate was given
    calls: tuple[DispatchRecord, ...] = ()  # the watched call's attention dispatches
    summary: Summary | None = None  # the profiled steps
    trace: Path | None = None
    peak_mib: float | None = None  # extra memory of one call
    peak_note: str | None = None  # why peak_mib is unknown
    timing: Timing | None = None
    output: torch.Tensor | None = None  # with keep_output: `[B, Hq, Sq, D]`

    @property
    def ok(self) -> bool:
        return self.status is Status.OK


@dataclass
class _Measured:
    """What the measuring steps fill in as they complete (a failure keeps what came before it)."""

    agreement: Agreement | None = None
    verdict: Verdict | None = None
    calls: tuple[DispatchRecord, ...] = ()
    summary: Summary | None = None
    trace: Path | None = None
    peak_mib: float | None = None
    peak_note: str | None = None
    timing: Timing | None = None
    output: torch.Tensor | None = None
    nonfinite: int = 0  # without a reference: NaN/Inf elements of the first call's output, in rows that see a key


def run(variant: Variant, workload: Workload, inputs: Inputs | None = None, *, seed: int = 0,
        reference: Reference | None = None, gate: Gate | None = None, watch: bool = False,
        profile: Path | None = None, steps: int = 5, memory: bool = False, reps: int | None = None,
        warmup: int = 3, l2_flush: bool = False, warm: bool = True, keep_output: bool = False,
        cuda_graph: bool = False) -> Run:
    """Run `variant` on `workload` (on `inputs`, default `workload.make_inputs(seed)`) and measure what is asked.

    reference: compare the output with the fp64 oracle (`Run.agreement`); gate: also judge it (`lossy`);
    watch: record the SDPA dispatch of the measured call; profile: write `steps` profiled calls there as a trace;
    memory: the extra memory of one call; reps: time that many calls after `warmup` (`l2_flush` between them;
    `cuda_graph`: as replays of one captured call, GPU time without the launch's host cost);
    warm: make one unmeasured call first; keep_output: keep the measured call's output. See the module docstring.
    """
    support = variant.check(workload)
    if not support.ok:
        return Run(variant.name, variant.family, Status.REJECTED, reason=support.reason)
    got = _Measured()
    tried = attempt(lambda: _measure(variant, workload, inputs, seed, got, reference=reference, gate=gate,
                                     watched=watch, profile=profile, steps=steps, memory=memory, reps=reps,
                                     warmup=warmup, l2_flush=l2_flush, warm=warm, keep_output=keep_output,
                                     cuda_graph=cuda_graph),
                    device=workload.device)
    status, reason = tried.status, tried.reason
    if status is Status.OK:
        status, reason = _judge(got)
    return Run(variant.name, variant.family, status, reason=reason, asked_bytes=tried.asked_bytes,
               agreement=got.agreement, verdict=got.verdict, calls=got.calls, summary=got.summary, trace=got.trace,
               peak_mib=got.peak_mib, peak_note=got.peak_note, timing=got.timing, output=got.output)


def _measure(variant: Variant, workload: Workload, inputs: Inputs | None, seed: int, got: _Measured, *,
             reference: Reference | None, gate: Gate | None, watched: bool, profile: Path | None, steps: int,
             memory: bool, reps: int | None, warmup: int, l2_flush: bool, warm: bool, keep_output: bool,
             cuda_graph: bool) -> None:
    device = workload.device
    cuda = device.startswith("cuda")
    inputs = inputs if inputs is not None else workload.make_inputs(seed)

    def call() -> torch.Tensor:
        with torch.no_grad():
            return variant(inputs)

    if warm:
        first = call()
        if reference is None:  # nothing else looks at the output: it must at least be finite
            check_output(variant.name, first, inputs.q)
            got.nonfinite = _nonfinite(first, inputs)
        del first
    if watched or reference is not None or keep_output or (memory and cuda):
        with contextlib.ExitStack() as stack:
            calls = stack.enter_context(watch()) if watched else []
            peak = stack.enter_context(cuda_peak(device)) if memory and cuda else None
            out = call()
        got.calls = tuple(calls)
        if peak is not None:
            got.peak_mib = peak.extra_mib
        check_output(variant.name, out, inputs.q)
        if reference is not None:
            got.agreement = reference.compare(out, workload.dtype)
            if gate is not None:
                got.verdict = gate.judge(got.agreement, workload.dtype)
        got.output = out if keep_output else None
        del out
    if profile is not None:
        from attnprof.profiling.capture import capture
        from attnprof.profiling.summary import summarize
        from attnprof.profiling.trace import load_trace

        capture(call, profile, device=device, steps=steps, warmup=2)
        got.trace = Path(profile)
        got.summary = summarize(load_trace(profile))
    if memory and not cuda:
        got.peak_mib, got.peak_note = (cpu_peak_or_reason(got.summary.peak_alloc_mib) if got.summary is not None
                                       else peak_mib(call, device))
    if reps:
        got.timing = time_call(call, device, warmup=warmup, reps=reps, l2_flush=l2_flush, cuda_graph=cuda_graph)


def _nonfinite(out: torch.Tensor, inputs: Inputs) -> int:
    """NaN/Inf elements of `out` `[B, Hq, Sq, D]` in the rows that see at least one key."""
    from attnprof.oracle.agreement import valid_rows_of

    bad = ~torch.isfinite(out)
    rows = valid_rows_of(inputs.valid, out.shape)  # bool [B, 1, Sq] or None (every row)
    if rows is not None:
        bad = bad & rows.unsqueeze(-1).to(bad.device)
    return int(bad.sum())


def _judge(got: _Measured) -> tuple[Status, str | None]:
    """A run that completed: error when its output or timing is not finite, lossy when the gate says so."""
    if got.nonfinite:
        return Status.ERROR, (f"non-finite output: {got.nonfinite} NaN/Inf elements in rows that see at least one key "
                              "(no reference was asked for; the first call's output was checked)")
    a = got.agreement
    if a is not None and not a.finite:
        return Status.ERROR, (f"non-finite output: {a.nan_out} NaN and {a.inf_out} Inf in rows that see at least "
                              f"one key (reference: {a.nan_ref} NaN, {a.inf_ref} Inf)")
    t = got.timing
    if t is not None and not all(math.isfinite(x) for x in (t.p20, t.p50, t.p80)):
        return Status.ERROR, f"non-finite timing: p50 {t.p50} ms"
    if got.verdict is not None and not got.verdict.ok:
        return Status.LOSSY, "; ".join(got.verdict.reasons)
    return Status.OK, None
