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


def print_terminal(report, *, wide: bool = False) -> None:
    """One row per step; by default 80 columns (the by-role breakdown of each step below the table), `wide`: all."""
    from rich.table import Table

    from attnprof.report.render import compact_table, err, fit_columns, out, say

    for note in report.notes:
        err.print(f"[yellow]note:[/yellow] {note}")
    title = f"{report.path} — {'GPU kernels' if report.on_gpu else 'CPU aten ops'} per step"
    rows = _step_rows(report)
    if wide:
        table = Table(title=title)
        for h in _HEADERS:
            table.add_column(h, overflow="fold")
        for row in rows:
            if row[4] != "–":
                row[4] = f"[bold red]{row[4]}[/bold red]"
            table.add_row(*row)
        out.print(table)
    else:
        short = ["step", "kernels", "by role", "fused", "math fallback", "copies", "masks"]
        compact = [[r[0], r[1], r[2], r[3], r[4], r[5].split(" ")[0], r[6]] for r in rows]
        names, body, _ = fit_columns(short, compact, ["step", "kernels", "math fallback", "fused", "copies", "masks"],
                                     cuts={"step": 18, "fused": 20, "math fallback": 22})
        out.print(compact_table(title, names, body, right=("kernels", "copies", "masks"),
                                styles=["red" if r[4] != "–" else None for r in rows]))
        for s, row in zip(report.steps, rows):
            say(f"{s.name}: {row[2]}" + (f"; copies {row[5]}" if s.out_of_place_ops else ""), indent="  ")
    verdict = [f"backends found: {', '.join(report.backends) or 'none'}"]
    if report.mask_rebuilt_every_step:
        verdict.append("the mask is rebuilt in every step: build it once, or pass is_causal=True")
    say("; ".join(verdict), wide=wide)
    for cause in _causes(report):
        say(f"! {cause}", wide=wide, style="yellow")


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
