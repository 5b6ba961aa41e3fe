"""Every kernel → the aten op that launched it, and the Python call site where the trace has one.

Worked out from the trace JSON's events alone, so a saved trace (ours, a user's, one recorded on the H200 and kept
in tests/data) is attributed exactly like a live one:

- a GPU kernel, memcpy or memset carries a `correlation` id; the runtime or driver call with the same id
  (`cudaLaunchKernel`, `cudaMemcpyAsync`, `cuLaunchKernel`, …) ran on a CPU thread inside the `cpu_op` ranges
  of the aten ops that launched it. The chain of those ops, outermost first, is the kernel's origin
  (`masked_fill → clone → copy_` for the copy of an out-of-place masked_fill);
- on the CPU the "kernels" are aten ops themselves: their origin is the chain of enclosing ops, the op included;
- `python_function` ranges (present when the trace was recorded `with_stack=True`) give the innermost Python
  frame outside torch itself: the user's call site.

Ranges nest per thread; a launch without an enclosing aten op (a Triton kernel launched from Python) has an empty
chain. `causes.explain` turns an origin into a sentence.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from attnprof.profiling.classify import aten_name, is_metadata
from attnprof.profiling.trace import GPU_CATEGORIES, LAUNCH_CATEGORIES, Event, Trace

# Frames inside these paths are library internals, not the user's call site.
_INTERNAL_FRAMES = ("torch/", "torch\\", "<built-in", "contextlib.py", "attnprof/run.py", "attnprof/profiling/",
                    "attnprof/bench/", "threading.py", "runpy.py")


@dataclass(frozen=True)
class Origin:
    """Where one kernel (or CPU work op) came from: aten ops outermost first, and the Python call site."""

    chain: tuple[str, ...] = ()  # aten op names without the `aten::` prefix; views and allocations left out
    site: str | None = None  # `file.py(12): fn` from the profiler's Python stack, when recorded

    @property
    def op(self) -> str | None:
        """The outermost aten op: what the user's code called."""
        return self.chain[0] if self.chain else None

    def to_json(self) -> dict:
        return {"ops": list(self.chain), "site": self.site}


def attribute(trace: Trace) -> dict[int, Origin]:
    """`id(event)` → Origin, for every GPU event (through its launch) and every cpu_op of the trace."""
    launches = {e.args.get("correlation"): e for e in trace.events
                if e.cat in LAUNCH_CATEGORIES and isinstance(e.args.get("correlation"), (int, str))}
    at = _enclosing(trace)
    out: dict[int, Origin] = {}
    for e in trace.events:
        if e.cat in GPU_CATEGORIES:
            corr = e.args.get("correlation")
            launch = launches.get(corr) if isinstance(corr, (int, str)) else None
            if launch is not None and id(launch) in at:
                out[id(e)] = at[id(launch)]
        elif e.cat == "cpu_op" and id(e) in at:
            out[id(e)] = at[id(e)]
    return out


def _enclosing(trace: Trace) -> dict[int, Origin]:
    """For each cpu_op and launch event: the enclosing aten ops (itself included for a cpu_op) and Python frame."""
    by_thread: dict[object, list[Event]] = defaultdict(list)
    for e in trace.events:
        if e.cat in ("cpu_op", "python_function") or e.cat in LAUNCH_CATEGORIES:
            by_thread[e.tid].append(e)
    out: dict[int, Origin] = {}
    for events in by_thread.values():
        # a parent starts no later and lasts no shorter; launches (zero-depth leaves) sort after ops at the same ts
        events.sort(key=lambda e: (e.ts, -e.dur, e.cat in LAUNCH_CATEGORIES))
        stack: list[Event] = []
        for e in events:
            while stack and stack[-1].end < e.ts:
                stack.pop()
            if e.cat in LAUNCH_CATEGORIES:
                out[id(e)] = _origin(stack)
                continue
            stack.append(e)
            if e.cat == "cpu_op":
                out[id(e)] = _origin(stack)
    return out


def _origin(stack: list[Event]) -> Origin:
    # `## Call CompiledFxGraph … ##` (inductor's graph range) encloses ops but is not one the user called
    chain = tuple(aten_name(e.name) for e in stack
                  if e.cat == "cpu_op" and not is_metadata(e.name) and not e.name.startswith("## "))
    site = None
    for e in reversed(stack):
        if e.cat == "python_function" and not any(p in e.name for p in _INTERNAL_FRAMES) and ".py(" in e.name:
            site = e.name
            break
    return Origin(chain, site)
