"""How `attnprof stages` reads: a summary table, each stage's kernels with roles, the deltas and the SDPA fallbacks
in words, for a person (the terminal, `report.md`) and for machines (`results.json`, attnprof.stages/1).

The job (`attnprof.stages`) returns results; every sentence about them is made here.
"""

from __future__ import annotations

from attnprof.profiling.names import short_name
from attnprof.report.render import env_note, fmt, md_escape, md_table
from attnprof.stages import StageResult

SCHEMA = "attnprof.stages/1"

HEADERS = ["stage", "status", "kernels/step", "GPU ms/step", "latency ms p50 (p20–p80)", "CPU ms/step", "TFLOP/s",
           "peak MiB", "rel err vs fp64", "backend"]


def ran(r: StageResult) -> bool:
    """It ran and was measured (ok or lossy): its numbers are printed."""
    return r.status.ran and r.summary is not None and r.timing is not None


def status_text(r: StageResult) -> str:
    """`ok`, `ok, lossy ×45` (error vs fp64 45× plain PyTorch's in the same dtype), or the status itself."""
    if r.lossy_factor is not None:
        return f"ok, lossy ×{r.lossy_factor:.0f}" if r.lossy_factor >= 10 else f"ok, lossy ×{r.lossy_factor:.1f}"
    return "ok" if ran(r) else str(r.status.value)


def lossy_line(r: StageResult) -> str | None:
    if r.lossy_factor is None:
        return None
    return (f"lossy: error vs fp64 {r.max_rel_err:.2e} is {r.lossy_factor:.1f}× plain PyTorch's "
            f"{r.baseline_rel:.2e} in the same dtype (the verify rule allows 2×): "
            f"see `attnprof verify --variants {r.variant}`")


def wide_row(r: StageResult) -> list[str]:
    if not ran(r):
        return [r.variant, str(r.status.value), "", "", "", "", "", "", "", r.reason or ""]
    s, t = r.summary, r.timing
    return [r.variant, status_text(r), fmt(s.kernels_per_step, "g"), fmt(s.gpu_ms_per_step, ".4f"),
            f"{t.p50:.4g} ({t.p20:.4g}–{t.p80:.4g})", fmt(s.cpu_ms_per_step, ".3f"), fmt(r.tflops, ".3g"),
            fmt(r.peak_mib, ".1f"), fmt(r.max_rel_err, ".2e"), r.backend or "–"]


def kernel_lines(r: StageResult, width: int = 60) -> list[tuple[str, str, str, str, str]]:
    """(per step, role[backend], µs/step, short name, launching op) per kernel; full names are in results.json."""
    rows = []
    for k in r.summary.kernels if r.summary else []:
        op = " → ".join(k.origin.chain[:2]) if k.origin and k.origin.chain else "–"
        rows.append((f"{k.per_step:g}", k.role + (f"[{k.backend}]" if k.backend else ""), f"{k.time_us:.1f}",
                     short_name(k.name, width), op))
    return rows


def markdown(results: list[StageResult], workload_label: str, note: str, command: str, provenance: dict,
             unreliable: str | None = None) -> str:
    parts = [f"# attnprof stages — {workload_label}", "",
             f"Made by `{command}` on {provenance['device']} (torch {provenance['torch']}, CUDA {provenance['cuda']}, "
             f"cuDNN {provenance['cudnn']}, Triton {provenance['triton']}, git {provenance['git_sha']}, "
             f"seed {provenance['seed']}).", "", note, ""]
    if unreliable:  # `bench.stability`: the machine was too busy to time on
        parts += [f"**{unreliable}**", ""]
    if env_note(provenance):
        parts += [env_note(provenance), ""]
    parts += [md_table(HEADERS, [wide_row(r) for r in results]), ""]
    for r in results:
        if not ran(r):
            continue
        parts += [f"## {r.variant}", "", md_table(["per step", "role", "µs/step", "kernel", "launched by"],
                                                  [list(x) for x in kernel_lines(r, width=80)]), ""]
        parts += [f"- ⚠ {md_escape(line)}" for line in [lossy_line(r), *r.unexpected] if line]
        parts += [f"- ⚠ {md_escape(line.strip())}" for line in dispatch_lines(r)]
        parts += [f"- trace: `{r.trace}` (open in https://ui.perfetto.dev or chrome://tracing)", ""]
    parts += ["## Stage to stage", ""] + [f"- {md_escape(line)}" for line in deltas(results)] + [""]
    return "\n".join(parts)


def dispatch_lines(result: StageResult) -> list[str]:
    """`SDPA ran efficient, not cudnn — cudnn: head_dim should be no more than 256; …` for each fallback."""
    lines = []
    for d in result.dispatch:
        why = "; ".join(f"{b}: {r}" for b, r in d["refusals"].items()) or "no reason given"
        lines.append(f"SDPA ran {d['ran']}, not {d['preferred']} — {why}")
        lines += [f"  fix: {a}" for a in d["advice"]]
    return lines


def deltas(results: list[StageResult]) -> list[str]:
    """Stage-to-stage changes in words, each ok stage against the previous ok one."""
    ok = [r for r in results if ran(r)]
    lines = []
    base = ok[0] if ok else None
    for prev, cur in zip(ok, ok[1:], strict=False):
        before = {k.name: k for k in prev.summary.kernels}
        after = {k.name: k for k in cur.summary.kernels}
        gone = [before[n] for n in before if n not in after]
        new = [after[n] for n in after if n not in before]
        dk = prev.summary.kernels_per_step - cur.summary.kernels_per_step
        dt = prev.timing.p50 - cur.timing.p50
        verb = "removed" if dk >= 0 else "added"
        text = f"{cur.variant} vs {prev.variant}: {verb} {abs(dk):g} kernel(s) per step"
        if gone:
            text += " (gone: " + ", ".join(_kernel_phrase(k, base) for k in gone[:4]) + ")"
        if new:
            text += " (new: " + ", ".join(_short(k.name) for k in new[:3]) + ")"
        text += f" and {'saved' if dt >= 0 else 'lost'} {abs(dt):.3g} ms per call"
        text += f" ({prev.timing.p50 / cur.timing.p50:.2f}x)" if cur.timing.p50 > 0 else ""
        lines.append(text + ".")
    return lines


def _kernel_phrase(k, base: StageResult | None) -> str:
    phrase = f"{_short(k.name)} [{k.role}]"
    if base is not None and base.summary and base.summary.gpu_ms_per_step:
        share = k.time_us / 1e3 / base.summary.gpu_ms_per_step
        phrase += f", {share:.0%} of {base.variant}'s GPU time"
    return phrase


def _short(name: str, width: int = 60) -> str:
    return short_name(name, width)


def results_json(workload, results: list[StageResult], provenance: dict, note: str) -> dict:
    """results.json: the workload, its provenance and every stage (the schema in docs/ARCHITECTURE.md)."""
    return {"schema": SCHEMA, "provenance": provenance, "workload": workload.to_json(), "workload_note": note,
            "stages": [r.to_json() for r in results], "deltas": deltas(results)}
