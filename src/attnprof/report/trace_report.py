"""How `attnprof trace` reads: one row per profiled step (kernels by role, fused backends, math fallbacks,
out-of-place copies, mask builds), for the terminal and for trace.md."""

from __future__ import annotations


def _step_rows(report) -> list[list[str]]:
    rows = []
    for s in report.steps:
        roles = ", ".join(f"{r} {n}" for r, n in s.roles.items()) or "–"
        copies = f"{len(s.copies)}" + (f" ({', '.join(f'{k}×{v}' for k, v in s.out_of_place_ops.items())})"
                                       if s.out_of_place_ops else "")
        rows.append([s.name, str(s.kernels), roles, ", ".join(s.backends) or "none", s.math_fallback or "–",
                     copies, str(len(s.mask_builds))])
    return rows


_HEADERS = ["step", "kernels", "by role", "fused backends", "math fallback", "copies (out-of-place ops)",
            "mask builds"]


def print_terminal(report) -> None:
    from rich.table import Table

    from attnprof.report.render import err, out

    for note in report.notes:
        err.print(f"[yellow]note:[/yellow] {note}")
    table = Table(title=f"{report.path} — {'GPU kernels' if report.on_gpu else 'CPU aten ops'} per step")
    for h in _HEADERS:
        table.add_column(h, overflow="fold")
    for row in _step_rows(report):
        if row[4] != "–":
            row[4] = f"[bold red]{row[4]}[/bold red]"
        table.add_row(*row)
    out.print(table)
    verdict = [f"backends found: {', '.join(report.backends) or 'none'}"]
    if report.mask_rebuilt_every_step:
        verdict.append("the mask is rebuilt in every step: build it once, or pass is_causal=True")
    out.print("; ".join(verdict))
    for cause in _causes(report):
        out.print(f"[yellow]! {cause}[/yellow]", highlight=False)


def _causes(report) -> list[str]:
    """Unexpected kernels with the cause read from the op that launched them, once each over all steps."""
    return list(dict.fromkeys(c for s in report.steps for c in s.causes))


def markdown(report) -> str:
    from attnprof.report.render import md_table

    lines = [f"# Trace: {report.path}", "", *[f"> {n}" for n in report.notes], "",
             md_table(_HEADERS, _step_rows(report)), "",
             f"Backends found: {', '.join(report.backends) or 'none'}. Mask rebuilt every step: "
             f"{'yes' if report.mask_rebuilt_every_step else 'no'}.", ""]
    lines += [f"- ⚠ {c}" for c in _causes(report)]
    return "\n".join(lines) + "\n"
