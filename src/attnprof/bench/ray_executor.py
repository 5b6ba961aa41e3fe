"""Jobs as Ray tasks: each asks for one GPU (one CPU on a CPU-only sweep), runs in its own worker process on whichever
node Ray picks, and hands its value back to the one writer in this process.

Connecting. `address=None` starts a local runtime on this machine (every local GPU; CPU workers on a box without
one) and shuts it down at the end; `"auto"` or `host:port` joins a running cluster (`ray start --head` on one node,
`ray start --address=…` on the others) and leaves it running. A runtime this process already initialised (a
notebook, the tests) is used as it is and left running. The workers get this process's attention knobs
(`TORCH_CUDNN_*`, `TRITON_*`, …, see `provenance.attention_env`) and `ATTNPROF_*` variables; a local runtime
also gets this process's `sys.path`, so a checkout run with `PYTHONPATH=src` and users' `package.module:function`
variants import in the workers. On a cluster, attnprof (and any user variant) must be installed on every node.

Faults. A task whose worker process dies (killed, OOM-killed, a CUDA error that ends the process, its node lost) is
retried by Ray up to `max_retries` times; after that its outcome is a failure with the reason. An exception inside
the function is not retried: the function records its own failures (a cell that raises is an `error` row), and a
`UsageError` (bad input) ends the run as it would in one process. A job that needs what the cluster does not have
(a GPU, a GPU kind) is refused before anything is submitted, so nothing waits forever for a node that never comes.

Ctrl-C. Tasks that already finished are still handed back (their rows are written), every outstanding task is
cancelled (its worker killed), and KeyboardInterrupt goes on to the caller: the results file is complete up to the
interruption and `--resume` continues it.
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from attnprof.bench.executor import Job, Outcome, node_info
from attnprof.errors import UsageError

INSTALL = "pip install 'attnprof[cluster]' (or pip install 'ray>=2.40')"
LOCAL_OBJECT_STORE = 256 * 2**20  # rows are a few KB: a small store keeps a local runtime light on /dev/shm


def import_ray():
    """The `ray` module, or one UsageError line naming the install command."""
    try:
        import ray
    except ImportError as exc:
        raise UsageError(f"--ray needs Ray, which is not installed here ({exc}); {INSTALL}") from None
    return ray


def worker_env(local: bool) -> dict[str, str]:
    """Environment every worker gets: the attention knobs and ATTNPROF_* (and, locally, this sys.path)."""
    from attnprof.provenance import attention_env

    env = attention_env()
    env.update({k: v for k, v in os.environ.items() if k.startswith("ATTNPROF_")})
    if local:
        paths = [p for p in sys.path if p and os.path.isdir(p)]
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    return env


def _check_reachable(address: str) -> None:
    """A `host:port` with nothing listening makes `ray.init` retry for minutes: refuse it in seconds instead."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or "://" in address:
        return  # "auto", "ray://…", or something Ray parses itself
    try:
        with socket.create_connection((host, int(port)), timeout=5):
            pass
    except OSError as exc:
        raise UsageError(f"--ray {address}: no Ray head answers there ({exc.strerror or exc}); start one with "
                         "`ray start --head` or pass --ray auto on a node of the cluster") from None


def cluster_device(name: str | None, executor: RayExecutor) -> str:
    """`--device` for a Ray run: where the jobs run, not this machine; `auto` → cuda when the cluster has a GPU."""
    if name in (None, "", "auto"):
        return "cuda" if executor.has_gpu() else "cpu"
    if name in ("cpu", "cuda"):
        return name
    if name.startswith("cuda:"):
        raise UsageError(f"--device {name}: with --ray each job is given one GPU by Ray; use --device cuda")
    raise UsageError(f"unknown device {name!r}; use cpu or cuda")


def _on_node(fn: Callable[[Any], Any], payload: Any) -> tuple[Any, dict[str, Any]]:
    """What a task runs in its worker: the job, then where it ran (node, IP, the GPU ids Ray gave this task and the
    name of the one CUDA device this worker sees)."""
    import ray
    import torch

    value = fn(payload)
    ctx = ray.get_runtime_context()
    node = node_info("ray")
    gpu_ids = [str(g) for g in ctx.get_accelerator_ids().get("GPU", [])]
    node.update(ray_node_id=ctx.get_node_id(), node_ip=ray.util.get_node_ip_address(), gpu_ids=gpu_ids,
                gpu=torch.cuda.get_device_name(0) if gpu_ids and torch.cuda.is_available() else None,
                accelerator_type=(ctx.get_node_labels() or {}).get("ray.io/accelerator-type"))
    return value, node


def _first_line(exc: BaseException) -> str:
    lines = [s for s in str(exc).strip().splitlines() if s.strip()]
    return lines[0].strip() if lines else type(exc).__name__


class RayExecutor:
    """One task per job on a Ray runtime (see the module docstring)."""

    name = "ray"

    def __init__(self, ray, *, owned: bool, max_retries: int, address: str | None):
        self.ray = ray
        self.owned = owned  # started or joined here: shut down / disconnect in close()
        self.max_retries = max_retries
        self.address = address

    @classmethod
    def connect(cls, address: str | None, *, max_retries: int = 2, num_cpus: int | None = None) -> RayExecutor:
        if max_retries < 0:
            raise UsageError(f"--max-retries must be >= 0, got {max_retries}")
        ray = import_ray()
        if ray.is_initialized():
            return cls(ray, owned=False, max_retries=max_retries, address=address)
        if address is not None:
            _check_reachable(address)
        runtime_env = {"env_vars": worker_env(local=address is None)}
        if address is None:
            os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # a runtime started here reports nothing out
        try:
            if address is None:
                ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False, runtime_env=runtime_env,
                         object_store_memory=LOCAL_OBJECT_STORE)
            else:
                ray.init(address=address, log_to_driver=False, runtime_env=runtime_env)
        except (ConnectionError, ValueError, RuntimeError) as exc:
            where = f"the Ray cluster at {address}" if address else "a local Ray runtime"
            raise UsageError(f"--ray: cannot use {where}: {_first_line(exc)}") from None
        return cls(ray, owned=True, max_retries=max_retries, address=address)

    def resources(self) -> dict[str, float]:
        return dict(self.ray.cluster_resources())

    def has_gpu(self) -> bool:
        return self.resources().get("GPU", 0) >= 1

    def check(self, device: str, accelerator_types: Sequence[str] = ()) -> None:
        """Refuse (UsageError) jobs the cluster cannot place, before any is submitted."""
        have = self.resources()
        kinds = sorted(k.split(":", 1)[1] for k in have if k.startswith("accelerator_type:"))
        summary = ", ".join(f"{k} {v:g}" for k, v in sorted(have.items()) if k in ("CPU", "GPU")) or "nothing"
        if device.startswith("cuda") and have.get("GPU", 0) < 1:
            raise UsageError(f"the Ray cluster has no GPU ({summary}); join GPU nodes or use --device cpu")
        if not device.startswith("cuda") and have.get("CPU", 0) < 1:
            raise UsageError(f"the Ray cluster has no CPU to run CPU cells on ({summary})")
        for kind in accelerator_types:
            if have.get(f"accelerator_type:{kind}", 0) <= 0:
                raise UsageError(f"no node of the Ray cluster has accelerator type {kind!r}; its GPU kinds: "
                                 f"{', '.join(kinds) or 'none'} ({summary})")

    def describe(self) -> str:
        have = self.resources()
        where = "a local Ray runtime" if self.address is None else f"the Ray cluster at {self.address}"
        nodes = sum(1 for n in self.ray.nodes() if n.get("Alive"))
        return f"{where}: {nodes} node(s), {have.get('CPU', 0):g} CPU, {have.get('GPU', 0):g} GPU"

    def _options(self, job: Job) -> dict[str, Any]:
        opts: dict[str, Any] = {"max_retries": self.max_retries, "retry_exceptions": False,
                                "name": f"attnprof {job.label}"[:200]}
        if job.device.startswith("cuda"):
            opts["num_gpus"] = 1  # Ray sets CUDA_VISIBLE_DEVICES: "cuda" in the worker is the GPU it was given
        else:
            opts["num_cpus"] = 1
        if job.accelerator_type:
            opts["accelerator_type"] = job.accelerator_type
        return opts

    def run(self, fn: Callable[[Any], Any], jobs: Sequence[Job],
            on_start: Callable[[Job], None] | None = None) -> Iterator[Outcome]:
        """Every job submitted at once; Ray queues what the cluster cannot run yet. `on_start` is not called: when
        a task starts is Ray's business."""
        ray = self.ray
        task = ray.remote(_on_node)
        fn_ref = ray.put(fn)
        by_ref = {task.options(**self._options(job)).remote(fn_ref, job.payload): job for job in jobs}
        pending = list(by_ref)
        try:
            while pending:
                interrupted = None
                try:
                    ready, pending = ray.wait(pending, num_returns=1, timeout=1.0)
                except KeyboardInterrupt as stop:  # Ctrl-C, or SIGTERM (attnprof.interrupts.Terminated)
                    interrupted = stop  # hand back what already finished, then stop
                    ready, pending = ray.wait(pending, num_returns=len(pending), timeout=0)
                for ref in ready:
                    yield self._outcome(ref, by_ref[ref])
                if interrupted is not None:
                    raise interrupted
        finally:
            for ref in pending:
                ray.cancel(ref, force=True)

    def _outcome(self, ref, job: Job) -> Outcome:
        ex = self.ray.exceptions
        try:
            value, node = self.ray.get(ref)
        except ex.RayTaskError as exc:  # the function itself raised: not a worker death, not retried
            cause = exc.cause
            if isinstance(cause, UsageError):
                raise UsageError(str(cause)) from None
            if "failed to import on the worker" in str(cause):  # every job would fail alike: stop, say why
                raise UsageError("the Ray workers cannot import attnprof (or a variant's module): install them on "
                                 "every node (pip install 'attnprof[cluster]'), the same version as here") from None
            return Outcome(job, failure=f"raised {type(cause).__name__}: {_first_line(cause)}")
        except ex.RayError as exc:
            return Outcome(job, failure=self.death_reason(exc))
        return Outcome(job, value=value, node=node)

    def death_reason(self, exc: BaseException) -> str:
        ex = self.ray.exceptions
        if isinstance(exc, ex.OutOfMemoryError):
            what = "killed by Ray's memory monitor (its node ran low on host memory)"
        elif isinstance(exc, ex.NodeDiedError):
            what = "its node died"
        elif isinstance(exc, ex.WorkerCrashedError):
            what = "its worker process died (killed, crashed, or a CUDA error that ended the process)"
        elif isinstance(exc, ex.TaskCancelledError):
            what = "cancelled"
        else:
            what = type(exc).__name__
        return (f"{what}; {self.max_retries + 1} attempt(s) with --max-retries {self.max_retries}: "
                f"{_first_line(exc)}")

    def close(self) -> None:
        if self.owned and self.ray.is_initialized():
            self.ray.shutdown()
