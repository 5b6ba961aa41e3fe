"""Kineto traces (what `torch.profiler` exports, `.json` or `.json.gz`) → events grouped by forward step.

One reader for our own traces and for the ones users record in their programs. Steps are, in order of
preference: our `attnprof.step.N` ranges, the profiler schedule's `ProfilerStep#N` ranges, or the whole trace as one
step. A GPU kernel belongs to the step whose CPU range contains the runtime call that launched it (matched by the
`correlation` id), which is right even when the GPU runs far behind the CPU.
"""

from __future__ import annotations

import gzip
import json
import zlib
from bisect import bisect_right
from dataclasses import dataclass, field
from pathlib import Path

from attnprof.errors import UsageError
from attnprof.validate import event_times

STEP_PREFIX = "attnprof.step."
DEFAULT_MAX_BYTES = 2 * 2**30  # a bigger trace is refused before reading: say so, don't swap
GPU_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
LAUNCH_CATEGORIES = frozenset({"cuda_runtime", "cuda_driver", "hip_runtime"})


@dataclass(frozen=True)
class Event:
    name: str
    cat: str
    ts: float  # microseconds
    dur: float
    args: dict
    tid: object = None  # (pid, tid): ranges nest per thread (attribution)

    @property
    def end(self) -> float:
        return self.ts + self.dur


@dataclass
class Step:
    """One forward step: its CPU range, the CPU ops inside it and the GPU work it launched."""

    name: str
    ts: float
    dur: float
    cpu_ops: list[Event] = field(default_factory=list)
    gpu: list[Event] = field(default_factory=list)
    memory: list[Event] = field(default_factory=list)


@dataclass
class Trace:
    path: Path
    events: list[Event]

    @property
    def has_gpu(self) -> bool:
        return any(e.cat in GPU_CATEGORIES for e in self.events)

    def steps(self, prefix: str = STEP_PREFIX) -> list[Step]:
        return split_steps(self, prefix)


def load_trace(path: str | Path, *, max_bytes: int = DEFAULT_MAX_BYTES) -> Trace:
    """Read a Kineto trace; anything else (missing, empty, truncated, corrupt, foreign, too big) is a UsageError."""
    path = Path(path)
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise UsageError(f"{path}: no such trace file") from None
    except OSError as exc:
        raise UsageError(f"{path}: cannot read ({exc.strerror or exc})") from None
    if path.is_dir():
        raise UsageError(f"{path}: is a folder, not a trace file")
    if size == 0:
        raise UsageError(f"{path}: empty file, not a trace")
    if size > max_bytes:
        raise UsageError(f"{path}: {size / 2**30:.1f} GiB is larger than the {max_bytes / 2**30:.1f} GiB limit "
                         "(record fewer steps, or raise --max-bytes)")
    try:
        raw = path.read_bytes()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
            if len(raw) > max_bytes:
                raise UsageError(f"{path}: decompresses to more than the {max_bytes / 2**30:.1f} GiB limit")
        data = json.loads(raw)
    except (EOFError, OSError, zlib.error) as exc:
        raise UsageError(f"{path}: corrupt or truncated gzip ({exc})") from None
    except UnicodeDecodeError:
        raise UsageError(f"{path}: not a text JSON trace") from None
    except json.JSONDecodeError as exc:
        raise UsageError(f"{path}: not valid JSON, truncated or corrupt (line {exc.lineno}: {exc.msg})") from None
    if isinstance(data, list):  # the bare-array form of the Chrome trace format
        data = {"traceEvents": data}
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise UsageError(f"{path}: JSON without a traceEvents list: not a Chrome/Kineto trace")
    events = [_event(e, i, path) for i, e in enumerate(data["traceEvents"])
              if isinstance(e, dict) and e.get("ph") in ("X", "i", "I")]
    if not any(e.cat in ("cpu_op", "kernel", "user_annotation") for e in events):
        raise UsageError(f"{path}: a Chrome trace, but not one from torch.profiler (no cpu_op or kernel events)")
    return Trace(path=path, events=events)


def _event(raw: dict, index: int = 0, path: Path | str = "trace") -> Event:
    args = raw.get("args") if isinstance(raw.get("args"), dict) else {}
    ts, dur = event_times(raw, index, path)  # a NaN or string duration is a corrupt trace (exit 2), not a 0
    return Event(name=str(raw.get("name", "")), cat=str(raw.get("cat", "")), ts=ts, dur=dur, args=args,
                 tid=(_key(raw.get("pid")), _key(raw.get("tid"))))


def _key(value: object) -> object:
    """A pid/tid as a dict key: ints and strings as they are, anything else (a corrupt trace) by its repr."""
    return value if isinstance(value, (int, str, float, type(None))) else repr(value)


def split_steps(trace: Trace, prefix: str = STEP_PREFIX) -> list[Step]:
    """Group CPU ops, GPU work and memory events by step (see the module docstring for what a step is)."""
    ranges = [e for e in trace.events if e.cat == "user_annotation" and e.name.startswith(prefix)]
    if not ranges:  # the CPU-side ranges only: Kineto mirrors each on the GPU timeline as gpu_user_annotation
        ranges = [e for e in trace.events if e.name.startswith("ProfilerStep#") and e.cat == "user_annotation"]
    if ranges:
        steps = [Step(e.name, e.ts, e.dur) for e in sorted(ranges, key=lambda e: e.ts)]
    else:
        timed = [e for e in trace.events if e.cat in ("cpu_op", "user_annotation") or e.cat in LAUNCH_CATEGORIES]
        lo = min((e.ts for e in timed), default=0.0)
        hi = max((e.end for e in timed), default=0.0)
        steps = [Step("whole trace", lo, hi - lo)]
    starts = [s.ts for s in steps]

    def owner(ts: float) -> Step | None:
        i = bisect_right(starts, ts) - 1
        return steps[i] if i >= 0 and ts <= steps[i].ts + steps[i].dur else None

    launch_ts = {e.args.get("correlation"): e.ts for e in trace.events
                 if e.cat in LAUNCH_CATEGORIES and e.args.get("correlation") is not None}
    for e in trace.events:
        if e.cat == "cpu_op":
            step = owner(e.ts)
        elif e.cat in GPU_CATEGORIES:
            corr = e.args.get("correlation")
            step = owner(launch_ts[corr]) if corr in launch_ts else None
        elif e.name == "[memory]":
            step = owner(e.ts)
            if step is not None:
                step.memory.append(e)
            continue
        else:
            continue
        if step is not None:
            (step.cpu_ops if e.cat == "cpu_op" else step.gpu).append(e)
    return steps


def cpu_ranges(trace: Trace, name: str, *, within: str | None = None) -> list[Event]:
    """The CPU-side ranges called `name` (record_function), in time order; with `within`, only those that lie
    inside a range of that name (e.g. the attention calls of the timed steps, not of a warm-up)."""
    ranges = sorted((e for e in trace.events if e.name == name and e.cat == "user_annotation"), key=lambda e: e.ts)
    if within is None:
        return ranges
    outer = [e for e in trace.events if e.name == within and e.cat == "user_annotation"]
    return [r for r in ranges if any(o.ts <= r.ts and r.end <= o.end for o in outer)]


def gpu_work_in_ranges(trace: Trace, name: str, *, within: str | None = None) -> list[list[Event]]:
    """For each CPU range called `name` (a record_function), the GPU work launched inside it, by launch time.

    The same attribution as `split_steps`, for any range: kernels launched through the runtime or the driver API
    (Triton launches with cuLaunchKernel) alike. Ranges are returned in time order; `within` as in `cpu_ranges`.
    """
    ranges = cpu_ranges(trace, name, within=within)
    launch_ts = {e.args.get("correlation"): e.ts for e in trace.events
                 if e.cat in LAUNCH_CATEGORIES and e.args.get("correlation") is not None}
    starts = [r.ts for r in ranges]
    out: list[list[Event]] = [[] for _ in ranges]
    for e in trace.events:
        if e.cat not in GPU_CATEGORIES or e.args.get("correlation") not in launch_ts:
            continue
        ts = launch_ts[e.args["correlation"]]
        i = bisect_right(starts, ts) - 1  # ranges of one name do not overlap in our use (a step, a call)
        if i >= 0 and ts <= ranges[i].end:
            out[i].append(e)
    return out
