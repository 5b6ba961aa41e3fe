"""Who runs the jobs of a sweep: this process, or a Ray cluster. The sweep decides the jobs; an executor only runs them.

`bench` (one job per cell) and `verify` (one job per case) hand an executor a module-level, picklable function and
a list of `Job`s; the executor yields one `Outcome` per job as it finishes: in order here, in completion order on
Ray. The caller stays the one writer (for `bench`: the JSONL file, one atomic append per outcome), so an executor
never touches a results file and two executors give files of the same shape.

An outcome carries either the function's value or a `failure`: the reason the job produced nothing (its worker died
on every attempt, its node was lost). A failure is the executor's word, never the job's own: a cell that raises or
runs out of GPU memory records that in its row, as it always did. Every outcome names where it ran (`node`: host,
process, and on Ray the node, its IP and the GPU ids Ray gave the task).
"""

from __future__ import annotations

import os
import platform
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class Job:
    """One unit of work. `device` is what it needs from a node ("cpu" or "cuda"); `accelerator_type` (a Ray
    accelerator type such as "H100") pins it to nodes of that GPU kind."""

    index: int
    payload: Any
    device: str
    label: str
    accelerator_type: str | None = None


@dataclass(frozen=True)
class Outcome:
    job: Job
    value: Any = None
    failure: str | None = None  # set when the job produced no value (see the module docstring)
    node: dict[str, Any] = field(default_factory=dict)


class Executor(Protocol):
    name: str

    def run(self, fn: Callable[[Any], Any], jobs: Sequence[Job],
            on_start: Callable[[Job], None] | None = None) -> Iterator[Outcome]:
        """`fn(job.payload)` for every job, one outcome each as it finishes; closing the iterator early (an
        exception in the caller, Ctrl-C) cancels the jobs not yet finished. `on_start(job)` is called where an
        executor knows when a job starts (in-process), for progress only."""
        ...

    def describe(self) -> str: ...

    def close(self) -> None: ...


def node_info(executor: str) -> dict[str, Any]:
    """Where this process runs: enough to find the machine again from a results row."""
    return {"executor": executor, "host": platform.node(), "pid": os.getpid()}


class InProcess:
    """The cells one after another in this process, on this machine's device (what `attnprof bench` always did)."""

    name = "in-process"

    def run(self, fn: Callable[[Any], Any], jobs: Sequence[Job],
            on_start: Callable[[Job], None] | None = None) -> Iterator[Outcome]:
        node = node_info(self.name)
        for job in jobs:
            if on_start:
                on_start(job)
            yield Outcome(job, value=fn(job.payload), node=node)

    def describe(self) -> str:
        return "in this process"

    def close(self) -> None:
        pass

