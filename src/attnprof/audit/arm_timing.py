"""Time one call site's recorded call on every allowed arm: the first call at a new KV length, and the repeat call.

An arm is a way to run the call: SDPA's own choice (`sdpa`), SDPA pinned to one backend (`sdpa-flash`,
`sdpa-efficient`, `sdpa-cudnn`, `sdpa-math`), and whatever `--variants` adds (`flex`, `kernel`, a user's
`package.module:function`). Every measurement goes through `attnprof.run.run` (the one measurement path: refusals
before anything runs, failures with their reason, `measure.timing` for the clock):

- **repeat**: the representative call replayed, one warm call, then `reps` timed calls: the cost of a call whose
  shape the backend has seen (cuDNN's plan cached);
- **first**: `samples` calls, each at a KV length no call of this process has used (fresh for every arm and sample),
  each timed alone with no warm-up: what a plan-building backend pays on every new length, which in decode is
  every step. The median of the samples is the first-call cost.

A compiled arm (`flex`, `torch.compile(dynamic=False)`) recompiles for every new length: its first call is a
compile of seconds, not a serving cost worth sampling here; it is not sampled and says so (its estimate then uses
the repeat time, a lower bound).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from attnprof.audit.replay import replay
from attnprof.dispatch.watch import DispatchRecord
from attnprof.run import Status, run
from attnprof.variants.base import Variant
from attnprof.variants.sdpa import PINNED, SDPA

# SDPA's own choice and each backend pinned: always measured. A plain dict, so a test can plant a slow arm.
SDPA_ARMS: dict[str, Variant] = {"sdpa": SDPA, **PINNED}
# the arm that reproduces a backend the watcher saw run
ARM_OF_BACKEND = {"cudnn": "sdpa-cudnn", "flash": "sdpa-flash", "efficient": "sdpa-efficient", "math": "sdpa-math",
                  "cpu_flash": "sdpa-flash"}

_FRESH = itertools.count(1)  # process-wide: every first-call sample gets a KV length nobody used before


@dataclass
class ArmResult:
    """One arm on one site: its status, the backend it reached, and its first-call and repeat times (ms)."""

    arm: str
    status: str  # ok | rejected | oom | error (attnprof.run.Status)
    reason: str | None = None
    backend: str | None = None  # what the arm ran (SDPA arms: read by the watcher)
    first_ms: list[float] = field(default_factory=list)  # one per fresh length
    first_note: str | None = None  # why there are no first-call samples
    repeat_p20: float | None = None
    repeat_p50: float | None = None
    repeat_p80: float | None = None
    method: str | None = None
    cached: bool = False

    @property
    def ok(self) -> bool:
        return self.status == "ok" and self.repeat_p50 is not None

    @property
    def first_p50(self) -> float | None:
        if not self.first_ms:
            return None
        xs = sorted(self.first_ms)
        return xs[len(xs) // 2] if len(xs) % 2 else 0.5 * (xs[len(xs) // 2 - 1] + xs[len(xs) // 2])

    def estimate(self, n_first: int, n_repeat: int) -> float | None:
        """ms for `n_first` first calls and `n_repeat` repeats (a missing first-call time counts as a repeat)."""
        if not self.ok:
            return None
        first = self.first_p50 if self.first_p50 is not None else self.repeat_p50
        return n_first * first + n_repeat * self.repeat_p50

    def to_json(self) -> dict:
        return {"arm": self.arm, "status": self.status, "reason": self.reason, "backend": self.backend,
                "first_ms": self.first_ms, "first_p50": self.first_p50, "first_note": self.first_note,
                "repeat_p20": self.repeat_p20, "repeat_p50": self.repeat_p50, "repeat_p80": self.repeat_p80,
                "method": self.method, "cached": self.cached}

    @classmethod
    def from_json(cls, d: dict) -> ArmResult:
        return cls(arm=d["arm"], status=d["status"], reason=d.get("reason"), backend=d.get("backend"),
                   first_ms=list(d.get("first_ms") or []), first_note=d.get("first_note"),
                   repeat_p20=d.get("repeat_p20"), repeat_p50=d.get("repeat_p50"), repeat_p80=d.get("repeat_p80"),
                   method=d.get("method"), cached=True)


def arms(extra: list[Variant] | None = None) -> dict[str, Variant]:
    """The SDPA arms, then the extra variants (a name already present is not added twice)."""
    out = dict(SDPA_ARMS)
    for v in extra or []:
        out.setdefault(v.name, v)
    return out


def _one_call_backend(calls) -> str | None:
    sdpa = [c for c in calls if c.kind == "sdpa"]
    return sdpa[0].backend if sdpa else (calls[0].backend if calls else None)


def time_arm(variant: Variant, rec: DispatchRecord, *, kv_lengths: list[int], reps: int, warmup: int,
             device: str | None = None, seed: int = 0) -> ArmResult:
    """The repeat time of `rec` replayed, then one first call at each of `kv_lengths` (see the module docstring)."""
    workload, inputs = replay(rec, device=device, seed=seed)
    got = run(variant, workload, inputs, watch=True, reps=reps, warmup=warmup)
    if got.status is not Status.OK:
        return ArmResult(variant.name, str(got.status), reason=got.reason)
    # an SDPA arm is the backend it reached; any other arm (a user function, even one calling SDPA inside) is itself
    sdpa_arm = variant.name == "sdpa" or variant.name.startswith("sdpa-")
    backend = variant.backend or (_one_call_backend(got.calls) if sdpa_arm else variant.name)
    result = ArmResult(variant.name, "ok", backend=backend, repeat_p20=got.timing.p20, repeat_p50=got.timing.p50,
                       repeat_p80=got.timing.p80, method=got.timing.method)
    if variant.backend == "flex":
        result.first_note = "compiled per shape (dynamic=False): a new length recompiles; not sampled"
        return result
    for n, kv_len in enumerate(kv_lengths):
        w, x = replay(rec, kv_len=kv_len, device=device, seed=seed + 1 + n)
        first = run(variant, w, x, warm=False, reps=1, warmup=0)
        if first.status is not Status.OK:
            result.first_note = f"first call at Sk={kv_len}: {first.status}: {first.reason}"
            break
        result.first_ms.append(first.timing.p50)
    return result


def fresh_lengths(base: int, samples: int) -> list[int]:
    """`samples` KV lengths above `base` that no earlier call of this process was given."""
    return [base + next(_FRESH) for _ in range(samples)]
