"""Where a slower implementation loses its time, from the profiled steps: one sentence per implementation.

A row slower than eager at the same (batch, context) is explained with the profiles taken at that point: more host
time inside its attention calls, more GPU work, or neither (then the time is spent on the host outside the attention
calls, or waiting). The sentence carries the numbers it was decided from, so a reader can check the decision.
"""

from __future__ import annotations


def where_time_was_lost(rows: list[dict]) -> str:
    """For each implementation slower than eager at some point (batch, context), where the lost time per step
    went, from the profiled steps: more host time inside its attention calls, more GPU work, or neither (then it
    is host time outside the attention calls). One sentence per implementation, or ""."""
    eager = {(r["batch"], r["context"]): r for r in rows if r["impl"] == "eager" and r["status"] == "ok"}
    found: dict[str, dict[str, list]] = {}
    for r in rows:
        base, share = eager.get((r["batch"], r["context"])), r.get("share") or {}
        if r["impl"] == "eager" or r["status"] != "ok" or base is None or share.get("basis") != "gpu-kernels":
            continue
        bshare = base.get("share") or {}
        lost = r["step_ms"] - base["step_ms"]
        keys = ("attention_ms", "attention_host_ms", "busy_ms")
        if lost <= 0.1 * base["step_ms"] or any(share.get(k) is None or bshare.get(k) is None for k in keys):
            continue
        more_host = share["attention_host_ms"] - bshare["attention_host_ms"]
        more_gpu = share["busy_ms"] - bshare["busy_ms"]
        where = ("host inside attention" if more_host >= 0.5 * lost else
                 "GPU" if more_gpu >= 0.5 * lost else "host outside attention")
        found.setdefault(r["impl"], {}).setdefault(where, []).append((lost, share, bshare))
    out = []
    for impl, by_where in found.items():
        for where, cases in by_where.items():
            lost = [c[0] for c in cases]
            span = f"{min(lost):.3g}–{max(lost):.3g}" if max(lost) - min(lost) >= 0.05 else f"{lost[0]:.3g}"
            mine_gpu = [c[1]["busy_ms"] for c in cases]
            base_gpu = [c[2]["busy_ms"] for c in cases]
            mine_host = [c[1]["attention_host_ms"] for c in cases]
            base_host = [c[2]["attention_host_ms"] for c in cases]

            def rng(v: list[float]) -> str:
                return f"{min(v):.3g}" if max(v) - min(v) < 0.05 else f"{min(v):.3g}–{max(v):.3g}"

            walls = [c[1].get("step_wall_ms") for c in cases]
            base_walls = [c[2].get("step_wall_ms") for c in cases]
            text = f"{impl} loses {span} ms per step to eager"
            if None not in walls + base_walls:  # was the slowness there in the profiled steps too?
                text += f" (its profiled steps took {rng(walls)} ms, eager's {rng(base_walls)})"
            text += "; "
            if where == "host inside attention":
                text += (f"its attention calls take {rng(mine_host)} ms of host time per step against eager's "
                         f"{rng(base_host)}: the cost is on the CPU, inside attention.")
            elif where == "GPU":
                text += f"the GPU is busy {rng(mine_gpu)} ms per step against eager's {rng(base_gpu)}."
            else:
                text += (f"neither its GPU work ({rng(mine_gpu)} ms busy per step, eager {rng(base_gpu)}) nor the "
                         f"host time inside its attention calls ({rng(mine_host)} ms, eager {rng(base_host)}) "
                         "explains it: the time goes to the host outside the attention calls, or to waiting.")
            out.append(text)
    return " ".join(out)
