"""How a model's attention features read (`models.attention_features`): the layers grouped by what they ask for,
one row per implementation with its verdict per feature, and whether the sample crossed the window. Shared by
`audit --model` and `verify --model` (terminal and markdown), so both say it the same way."""

from __future__ import annotations

from attnprof.report.render import md_escape

_NAMES = {"softcap": "softcap", "sliding_window": "window", "sinks": "sinks"}


def _layers(indices: list[int]) -> str:
    """0, 2, 4, 6, 8 → "0, 2, …, 8" (a regular stride); else the list."""
    steps = {b - a for a, b in zip(indices, indices[1:])}
    if len(indices) > 3 and len(steps) == 1:
        return f"{indices[0]}, {indices[1]}, …, {indices[-1]}"
    return ", ".join(map(str, indices))


def layer_lines(block: dict) -> list[str]:
    """One line per distinct kind of layer: which layers, and what their attention asks for."""
    groups: dict[tuple, list[int]] = {}
    for x in block["layers"]:
        groups.setdefault((x["kind"], x["window"], x["softcap"], x["sinks"]), []).append(x["layer"])
    total = len(block["layers"])
    lines = []
    for (_kind, window, cap, sinks), idx in groups.items():
        parts = [f"sliding window {window} keys" if window else "full attention"]
        parts += [f"softcap {cap:g}"] if cap else []
        parts += ["sinks"] if sinks else []
        lines.append(f"layer{'s' if len(idx) > 1 else ''} {_layers(idx)} ({len(idx)} of {total}): {', '.join(parts)}")
    return lines


def verdict_rows(block: dict) -> tuple[list[str], list[list[str]], dict[str, int]]:
    """(headers, rows, notes): a verdict cell is "honours", "refuses [n]" …; `*` marks one not run (as sdpa, or
    what the adapter declares); each distinct reason is numbered once."""
    features = list(dict.fromkeys(v["feature"] for v in block["verdicts"] if v["verdict"] != "not applied"))
    impls = list(dict.fromkeys(v["impl"] for v in block["verdicts"] if v["verdict"] != "not applied"))
    notes: dict[str, int] = {}
    rows = []
    for impl in impls:
        row = [impl]
        for f in features:
            v = next(x for x in block["verdicts"] if x["impl"] == impl and x["feature"] == f)
            cell = v["verdict"] + ("*" if v["how"] != "measured" else "")
            if v["verdict"] not in ("honours",) and v["why"]:
                cell += f" [{_letter(notes.setdefault(v['why'], len(notes) + 1))}]"
            row.append(cell)
        rows.append(row)
    return ["impl", *(_NAMES[f] for f in features)], rows, notes


def _letter(n: int) -> str:
    """Notes are lettered: the tables above them (audit's dispatch, verify's gate) number theirs."""
    return chr(ord("a") + n - 1) if n <= 26 else str(n)


def inert_lines(block: dict) -> list[str]:
    return [f"{_NAMES[v['feature']]}: {v['why']}" for v in block["verdicts"] if v["verdict"] == "not applied"]


def window_line(block: dict) -> str | None:
    w = block.get("window")
    if not w:
        return None
    if w["exercised"]:
        return f"window: the sample's {w['seq']} tokens cross the smallest window ({w['window']} keys)."
    how = (f"`{w['flag']} {w['cross_seq']}` crosses it" if w["cross_seq"] else
           f"no sample crosses it within max_position_embeddings {w['max_positions']}")
    return (f"window NOT exercised: the sample has {w['seq']} tokens, no more than the smallest window "
            f"({w['window']} keys), so every query saw every key (the probe above crossed it on a shrunk copy); "
            f"{how}.")


def probe_line(block: dict) -> str:
    p = block["probe"]
    return (f"Verdicts measured on a shrunk copy of the model ({p['device']}, {p['dtype']}, window {p['window']}, "
            f"softcap {p['softcap']:g}, {p['seq']} tokens) against eager with and without each feature; "
            "* = not run there (as sdpa, or the adapter's own list).")


def markdown(block: dict | None) -> list[str]:
    """The "Attention features" section of audit.md / verify.md."""
    if not block:
        return []
    lines = ["## Attention features", ""]
    if not block["asks"]:
        return lines + ["No layer asks for a softcap, a sliding window or sinks: plain causal attention.", ""]
    lines += [f"- {x}" for x in layer_lines(block)] + [""]
    lines += [f"- {x}" for x in inert_lines(block)] + ([""] if inert_lines(block) else [])
    headers, rows, notes = verdict_rows(block)
    if rows:
        lines += ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
        lines += ["| " + " | ".join(md_escape(c) for c in row) + " |" for row in rows]
        lines += ["", probe_line(block), ""] + [f"- [{_letter(n)}] {md_escape(why)}" for why, n in notes.items()] + [""]
    w = window_line(block)
    return lines + ([w, ""] if w else [])


def print_features(block: dict | None, *, wide: bool = False) -> None:
    """The same for the terminal: 80 columns, the reasons numbered below the table."""
    from rich.markup import escape

    from attnprof.report.render import compact_table, out, say

    if not block:
        return
    if not block["asks"]:
        say("attention features: none (no softcap, sliding window or sinks in any layer)", style="dim")
        return
    say("attention features asked for, per layer (from the config):", style="bold")
    for line in [*layer_lines(block), *inert_lines(block)]:
        say(line, wide=wide, indent="  ")
    headers, rows, notes = verdict_rows(block)
    if rows:
        say(probe_line(block), wide=wide, style="dim")
        out.print(compact_table("", headers, [[escape(c) for c in row] for row in rows]))
        for why, n in notes.items():
            say(f"[{_letter(n)}] {why}", wide=wide)
    w = window_line(block)
    if w:
        say(w.replace("`", ""), wide=wide, style=None if block["window"]["exercised"] else "yellow")
