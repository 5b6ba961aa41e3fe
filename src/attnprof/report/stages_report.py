"""How `attnprof stages` reads to a person: a summary table, each stage's kernels with roles, the deltas in words.

The same content renders as a rich table for the terminal and as `report.md` for the report folder.
"""

from __future__ import annotations

from rich.table import Table

from attnprof.report.records import env_note
from attnprof.report.render import fmt, md_escape, md_table, out
from attnprof.stages import StageResult, deltas, dispatch_lines

HEADERS = ["stage", "status", "kernels/step", "GPU ms/step", "latency ms p50 (p20–p80)", "CPU ms/step", "TFLOP/s",
           "peak MiB", "rel err vs fp64", "backend"]


def _row(r: StageResult) -> list[str]:
    if r.status != "ok":
        return [r.variant, r.status, "", "", "", "", "", "", "", r.reason or ""]
    s, t = r.summary, r.timing
    return [r.variant, "ok", fmt(s.kernels_per_step, "g"), fmt(s.gpu_ms_per_step, ".4f"),
            f"{t.p50:.4g} ({t.p20:.4g}–{t.p80:.4g})", fmt(s.cpu_ms_per_step, ".3f"), fmt(r.tflops, ".3g"),
            fmt(r.peak_mib, ".1f"), fmt(r.max_rel_err, ".2e"), r.backend or "–"]


def kernel_lines(r: StageResult, width: int = 110) -> list[tuple[str, str, str, str]]:
    rows = []
    for k in r.summary.kernels if r.summary else []:
        name = k.name if len(k.name) <= width else k.name[: width - 1] + "…"
        rows.append((f"{k.per_step:g}", k.role + (f"[{k.backend}]" if k.backend else ""), f"{k.time_us:.1f}", name))
    return rows


def print_terminal(results: list[StageResult], workload_label: str, note: str, on_gpu: bool) -> None:
    table = Table(title=f"attnprof stages — {workload_label}", caption=note, caption_justify="left")
    for h in HEADERS:
        table.add_column(h, overflow="fold")
    for r in results:
        table.add_row(*_row(r), style=None if r.status == "ok" else "yellow")
    out.print(table)
    unit = "kernel" if on_gpu else "aten op"
    for r in results:
        if r.status != "ok":
            continue
        out.print(f"\n[bold]{r.variant}[/bold]: {fmt(r.summary.kernels_per_step, 'g')} {unit}s per step")
        for per, role, us, name in kernel_lines(r):
            out.print(f"  {per:>4} × {role:<26} {us:>9} µs  {name}", markup=False, highlight=False)
        for note_line in r.unexpected:
            out.print(f"  [yellow]! {note_line}[/yellow]")
        for line in dispatch_lines(r):
            out.print(f"  [red]! {line}[/red]" if not line.startswith("  ") else f"    {line.strip()}", markup=True,
                      highlight=False)
    lines = deltas(results)
    if lines:
        out.print("\n[bold]Stage to stage[/bold]")
        for line in lines:
            out.print(f"  {line}", markup=False)


def markdown(results: list[StageResult], workload_label: str, note: str, command: str, provenance: dict) -> str:
    parts = [f"# attnprof stages — {workload_label}", "",
             f"Made by `{command}` on {provenance['device']} (torch {provenance['torch']}, CUDA {provenance['cuda']}, "
             f"cuDNN {provenance['cudnn']}, Triton {provenance['triton']}, git {provenance['git_sha']}, "
             f"seed {provenance['seed']}).", "", note, ""]
    if env_note(provenance):
        parts += [env_note(provenance), ""]
    parts += [md_table(HEADERS, [_row(r) for r in results]), ""]
    for r in results:
        if r.status != "ok":
            continue
        parts += [f"## {r.variant}", "", md_table(["per step", "role", "µs/step", "name"],
                                                  [list(x) for x in kernel_lines(r, width=200)]), ""]
        parts += [f"- ⚠ {md_escape(line)}" for line in r.unexpected]
        parts += [f"- ⚠ {md_escape(line.strip())}" for line in dispatch_lines(r)]
        parts += [f"- trace: `{r.trace}` (open in https://ui.perfetto.dev or chrome://tracing)", ""]
    parts += ["## Stage to stage", ""] + [f"- {md_escape(line)}" for line in deltas(results)] + [""]
    return "\n".join(parts)
