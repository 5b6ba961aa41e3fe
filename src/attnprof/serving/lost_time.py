"""Where a slower implementation loses its time, from the profiled steps: one sentence per implementation.

A row slower than eager at the same (batch, context) is explained with the profiles taken at that point: more host
time inside its attention calls, more GPU work, or neither (then the time is spent on the host outside the attention
calls, or waiting). Decode rows carry two more measurements: the repeat pass (the identical `generate` over KV lengths
already met) and a cold profile (steps over KV lengths the point never used). When most of the lost time is gone on
the repeat pass and the cold step's attention calls take that much more host time than warm ones, the cost is paid
once per new shape inside attention (cuDNN, for one, builds an execution plan per sequence length); the sentence says
so only then. It carries the numbers it was decided from, so a reader can check the decision.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

NEW_SHAPE = "per new shape inside attention"


@dataclass(frozen=True)
class _Case:
    """One slower point against eager's at the same (batch, context); shares are the rows' JSON dicts."""

    lost: float  # ms per step, first pass (what tokens/s is computed from)
    repeat: float | None  # ms per step lost on the repeat pass; None without one
    share: dict  # warm profile
    base: dict  # eager's warm profile
    cold: dict | None  # cold profile, when both a cold profile and its host time were recorded
    base_cold: dict | None  # eager's


def where_time_was_lost(rows: list[dict]) -> str:
    """For each implementation slower than eager at some point (batch, context), where the lost time per step
    went, from the profiled steps: per new shape inside attention (decode, when its repeat pass and cold profile
    show it), more host time inside its attention calls, more GPU work, or neither (then it is host time outside
    the attention calls). One sentence per implementation and explanation, or ""."""
    eager = {(r["batch"], r["context"]): r for r in rows if r["impl"] == "eager" and r["status"] == "ok"}
    found: dict[str, dict[str, list[_Case]]] = {}
    for r in rows:
        base, share = eager.get((r["batch"], r["context"])), r.get("share") or {}
        if r["impl"] == "eager" or r["status"] != "ok" or base is None or share.get("basis") != "gpu-kernels":
            continue
        bshare = base.get("share") or {}
        lost = r["step_ms"] - base["step_ms"]
        keys = ("attention_ms", "attention_host_ms", "busy_ms")
        if lost <= 0.1 * base["step_ms"] or any(share.get(k) is None or bshare.get(k) is None for k in keys):
            continue
        case = _Case(lost, _repeat_lost(r, base), share, bshare, _cold(r), _cold(base))
        found.setdefault(r["impl"], {}).setdefault(_explain(case), []).append(case)
    return " ".join(_sentence(impl, where, cases) for impl, by_where in found.items()
                    for where, cases in by_where.items())


def _repeat_lost(r: dict, base: dict) -> float | None:
    mine, theirs = (r.get("itl_repeat_ms") or {}).get("p50"), (base.get("itl_repeat_ms") or {}).get("p50")
    if mine is None or theirs is None or not math.isfinite(mine - theirs):
        return None
    return mine - theirs


def _cold(r: dict) -> dict | None:
    cold = r.get("cold_share") or {}
    return cold if cold.get("attention_host_ms") is not None else None


def _explain(c: _Case) -> str:
    """Which explanation the numbers support. Per new shape needs both measurements: at least half the lost time
    gone on the repeat pass, and a cold step whose attention calls take at least half the lost time more host time
    than warm ones."""
    if c.repeat is not None and c.cold is not None:
        gone = c.lost - c.repeat
        cold_extra = c.cold["attention_host_ms"] - c.share["attention_host_ms"]
        if gone >= 0.5 * c.lost and cold_extra >= 0.5 * c.lost:
            return NEW_SHAPE
    more_host = c.share["attention_host_ms"] - c.base["attention_host_ms"]
    more_gpu = c.share["busy_ms"] - c.base["busy_ms"]
    return ("host inside attention" if more_host >= 0.5 * c.lost else
            "GPU" if more_gpu >= 0.5 * c.lost else "host outside attention")


def _rng(v: list[float]) -> str:
    return f"{min(v):.3g}" if max(v) - min(v) < 0.05 else f"{min(v):.3g}–{max(v):.3g}"


def _repeat_phrase(repeats: list[float]) -> str:
    if min(repeats) >= 0:
        return f"and {_rng(repeats)} ms on a repeat pass over the same lengths"
    if max(repeats) < 0:
        return f"but gains {_rng([-x for x in repeats])} ms on a repeat pass over the same lengths"
    return (f"and {min(repeats):+.3g} to {max(repeats):+.3g} ms on a repeat pass over the same lengths "
            "(negative: faster than eager)")


def _sentence(impl: str, where: str, cases: list[_Case]) -> str:
    lost = [c.lost for c in cases]
    mine_gpu, base_gpu = [c.share["busy_ms"] for c in cases], [c.base["busy_ms"] for c in cases]
    mine_host, base_host = [c.share["attention_host_ms"] for c in cases], [c.base["attention_host_ms"] for c in cases]
    colds = [c.cold for c in cases] if all(c.cold for c in cases) else None
    base_colds = [c.base_cold for c in cases] if all(c.base_cold for c in cases) else None

    text = f"{impl} loses {_rng(lost)} ms per step to eager"
    if all(c.repeat is not None for c in cases):
        text += f" on the first pass over new KV lengths {_repeat_phrase([c.repeat for c in cases])}"
    walls = [c.share.get("step_wall_ms") for c in cases]
    base_walls = [c.base.get("step_wall_ms") for c in cases]
    if None not in walls + base_walls:  # was the slowness there in the profiled steps too?
        cold_walls = [c.get("step_wall_ms") for c in colds] if colds else [None]
        base_cold_walls = [c.get("step_wall_ms") for c in base_colds] if base_colds else [None]
        if None not in cold_walls + base_cold_walls:
            text += (f" (its profiled steps took {_rng(walls)} ms warm and {_rng(cold_walls)} cold, eager's "
                     f"{_rng(base_walls)} and {_rng(base_cold_walls)})")
        else:
            text += f" (its profiled steps took {_rng(walls)} ms, eager's {_rng(base_walls)})"
    text += "; "
    cold_host = [c["attention_host_ms"] for c in colds] if colds else None
    if where == NEW_SHAPE:
        text += f"in a cold step its attention calls take {_rng(cold_host)} ms of host time ({_rng(mine_host)} warm"
        if base_colds:
            text += f"; eager's {_rng([c['attention_host_ms'] for c in base_colds])} cold"
        text += "): the cost is paid once per new KV length, inside the attention calls"
        backends = [set(c.share.get("backends") or ()) | set(c.cold.get("backends") or ()) for c in cases]
        if all("cudnn" in b for b in backends):  # the dispatch recorded for these rows
            text += " (its SDPA calls ran cuDNN, which builds an execution plan for every new sequence length)"
        return text + "."
    if where == "host inside attention":
        text += (f"its attention calls take {_rng(mine_host)} ms of host time per step against eager's "
                 f"{_rng(base_host)}: the cost is on the CPU, inside attention.")
    elif where == "GPU":
        text += f"the GPU is busy {_rng(mine_gpu)} ms per step against eager's {_rng(base_gpu)}."
    else:
        text += (f"neither its GPU work ({_rng(mine_gpu)} ms busy per step, eager {_rng(base_gpu)}) nor the "
                 f"host time inside its attention calls ({_rng(mine_host)} ms, eager {_rng(base_host)}) "
                 "explains it: the time goes to the host outside the attention calls, or to waiting.")
    if cold_host:
        text += f" In a cold step its attention calls take {_rng(cold_host)} ms of host time ({_rng(mine_host)} warm)."
    return text
