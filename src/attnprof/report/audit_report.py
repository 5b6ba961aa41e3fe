"""Rows of an audit (grid cells or a model's calls) → the terminal table, the markdown for a PR, the JSON rows.

Math fallbacks are highlighted (bold **MATH** in markdown, red in the terminal); a call that missed the device's
fastest backend but still ran fused is marked, with the reason of every faster backend and the fix.
"""

from __future__ import annotations

from attnprof.report.render import EDGES, GAP, WIDTH, compact_table, cut, md_escape, out, say, table_width


def _row(where: str, axis: str, envelope: str, rec, *, refusals=None, advice=None, error=None, prof=None,
         prof_kernels=None, rejected=None) -> dict:
    from attnprof.audit.reasons import advise

    return {
        "where": where, "axis": axis, "envelope": envelope,
        "backend": rec.backend if rec else None, "fused_op": rec.fused_op if rec else None,
        "fused": bool(rec and rec.fused), "preferred": rec.preferred if rec else None,
        "fell_back": bool(rec and rec.fell_back) or error is not None,
        "refusals": dict(rec.refusals) if rec and refusals is None else (refusals or {}),
        "advice": (advise(rec) if rec else []) if advice is None else advice,
        "error": error, "rejected": rejected, "profiler_backend": prof,
        "profiler_agrees": None if prof is None or rec is None else prof == rec.backend,
        "profiler_kernels": prof_kernels or [],
        "call": rec.to_json() if rec else None,
    }


def rows_from_records(records) -> list[dict]:
    return [_row(r.where, r.module_class or r.kind, r.envelope(), r) for r in records]


def rejected_row(where: str, what: str, reason: str) -> dict:
    """The one row of a model whose class refused `what` (attn_implementation="sdpa"): nothing ran, `reason` says why
    in transformers' words."""
    return _row(where, "model", what, None, rejected=reason)


def rows_from_cells(results) -> list[dict]:
    return [_row(r.cell.label, r.cell.axis, r.cell.label, r.record, refusals=r.refusals, advice=r.advice,
                 error=r.error, prof=r.profiler_backend, prof_kernels=r.profiler_kernels) for r in results]


def _why(row: dict) -> str:
    if row.get("rejected"):
        return row["rejected"]
    if row["error"]:
        return f"SDPA could not run it: {row['error']}"
    return "; ".join(f"{b}: {why}" for b, why in row["refusals"].items())


def _backend_md(row: dict) -> str:
    if row.get("rejected"):
        return "rejected"
    b = row["backend"] or "none"
    if b == "math":
        return "**MATH**"
    return f"{b} (not {row['preferred']})" if row["fell_back"] else b


def markdown(data: dict) -> str:
    rows = data["rows"]
    checked = [r for r in rows if r["profiler_backend"] is not None]
    lines = [f"# SDPA dispatch: {data['title']}", "",
             f"Command: `{data['command']}`  ",
             f"Device: {data['provenance']['device']}; torch {data['provenance']['torch']}, "
             f"CUDA {data['provenance']['cuda']}, cuDNN {data['provenance']['cudnn']}; git {data['provenance']['git_sha']}  ",
             f"Fastest backend here (what SDPA picks for friendly inputs): **{data['preferred']}**. "
             "The backend column is the aten operator each call executed (`attnprof.dispatch.watch`), never a guess; "
             "the reasons are PyTorch's own (`can_use_*(debug=True)` on CUDA, `_fused_sdp_choice` counterfactuals "
             "on the CPU).", ""]
    summary = (f"{len(rows)} calls: {sum(r['backend'] == data['preferred'] for r in rows)} on {data['preferred']}, "
               f"{sum(r['fell_back'] and r['fused'] for r in rows)} on a slower fused kernel, "
               f"{sum(r['backend'] == 'math' for r in rows)} on **math**, {sum(bool(r['error']) for r in rows)} failed.")
    if any(r.get("rejected") for r in rows):
        summary = "No SDPA call ran: the model refused `attn_implementation=\"sdpa\"` (the row says why)."
    lines += [summary, ""]
    if checked:
        agree = sum(bool(r["profiler_agrees"]) for r in checked)
        lines += [f"Profiler cross-check: {agree} of {len(checked)} profiled cells show the same backend in the "
                  "kernel names torch.profiler recorded.", ""]
    if data.get("require"):
        lines += [f"Rule `--require {data['require']}`: {data['violations']} violation(s).", ""]
    headers = ["where", "inputs", "backend", "fused op", "why not faster", "fix"] + (["profiler"] if checked else [])
    lines.append("| " + " | ".join(headers) + " |")
    lines.append("|" + "---|" * len(headers))
    for r in rows:
        cells = [r["where"] if r["where"] != r["envelope"] else r["axis"], r["envelope"], _backend_md(r),
                 r["fused_op"] or "–", _why(r) or "–", "; ".join(r["advice"]) or "–"]
        if checked:
            p = r["profiler_backend"]
            cells.append("–" if p is None else f"{p} {'✓' if r['profiler_agrees'] else '✗ DISAGREES'}")
        lines.append("| " + " | ".join(md_escape(c) for c in cells) + " |")
    from attnprof.report.features_report import markdown as features_markdown

    lines += [""] + features_markdown((data.get("model") or {}).get("attention_features"))
    return "\n".join(lines) + "\n"


def _style(row: dict) -> str | None:
    b = row["backend"]
    if row.get("rejected"):
        return "yellow"
    if row["error"] or b == "math":
        return "bold red"
    return "yellow" if row["fell_back"] else None


def _profiler(row: dict) -> str:
    p = row["profiler_backend"]
    return "" if p is None else f"{p} {'✓' if row['profiler_agrees'] else '✗'}"


def print_terminal(data: dict, *, wide: bool = False) -> None:
    """The audit for a person. By default it fits 80 columns: where, inputs and backend (and the profiler's verdict
    with --crosscheck) in the table; each distinct "why not faster" and fix below it, numbered [n] beside the backend
    of the rows it explains. `wide`: the reasons and fixes in a column of their own, as audit.md has them."""
    from rich.markup import escape

    rows = data["rows"]
    profiled = any(r["profiler_backend"] for r in rows)
    title = f"{data['title']} — fastest here: {data['preferred']}"
    from attnprof.report.features_report import print_features

    if wide:
        _print_wide(title, rows, profiled)
        print_features((data.get("model") or {}).get("attention_features"), wide=True)
        return
    notes: dict[str, int] = {}
    body = []
    for r in rows:
        fix = "; ".join(r["advice"])
        text = _why(r) + (f" → {fix}" if fix else "")
        mark = f" [{notes.setdefault(text, len(notes) + 1)}]" if text else ""
        backend = ("rejected" if r.get("rejected") else r["backend"] or "error") + mark
        body.append([r["where"] if r["where"] != r["envelope"] else r["axis"], r["envelope"], backend]
                    + ([_profiler(r)] if profiled else []))
    headers = ["where", "inputs", "backend"] + (["profiler"] if profiled else [])
    body = [[escape(c) for c in (cut(row[0], 30), *row[1:])] for row in body]  # cells are markup: "mask=bool[bool]"
    room = WIDTH - table_width([h for h in headers if h != "inputs"], [[c[0], *c[2:]] for c in body]) - GAP - EDGES
    body = [[c[0], escape(cut(rows[i]["envelope"], max(24, room))), *c[2:]] for i, c in enumerate(body)]
    say(title, style="bold")
    out.print(compact_table("", headers, body, styles=[_style(r) for r in rows]))
    for text, n in notes.items():
        say(f"[{n}] {text}", indent="")
    print_features((data.get("model") or {}).get("attention_features"))


def _print_wide(title: str, rows: list[dict], profiled: bool) -> None:
    from rich.table import Table

    table = Table(title=title, show_lines=False)
    for h in ("where", "inputs", "backend", "why not faster / fix") + (("profiler",) if profiled else ()):
        table.add_column(h, overflow="fold")
    for r in rows:
        style = _style(r) or "green"
        b = "rejected" if r.get("rejected") else r["backend"] or "error"
        fix = "; ".join(r["advice"])
        cells = [r["where"] if r["where"] != r["envelope"] else r["axis"], r["envelope"], f"[{style}]{b}[/{style}]",
                 _why(r) + (f"\n→ {fix}" if fix else "")]
        table.add_row(*cells, *([_profiler(r)] if profiled else []))
    out.print(table)
