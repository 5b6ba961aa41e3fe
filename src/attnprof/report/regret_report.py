"""A measured audit (`attnprof audit --phase … --measure`) → markdown for a PR and the terminal table.

One row per call site and shape class: what ran, the measured fastest arm, the regret (ms per call, per generated
token, % of the fastest), the verdict against the tolerance and the fix; then, per site, every arm with its
first-call and repeat times so the verdict can be checked by eye.
"""

from __future__ import annotations

from attnprof.report.render import (
    compact_table,
    cut,
    env_note,
    fit_columns,
    fmt,
    left_out,
    md_escape,
    md_table,
    out,
    say,
)


def _ran(site: dict) -> str:
    return ", ".join(f"{b} ×{n}" for b, n in site["ran"].items())


def _best(r: dict) -> str:
    if not r["best_arm"]:
        return "–"
    b = r["best_backend"]
    return r["best_arm"] + (f" (→{b})" if b and not r["best_arm"].endswith(b) else "")


def _verdict(r: dict) -> str:
    v = r["verdict"]
    return {"over": "**OVER**", "unmeasured": "**UNMEASURED**"}.get(v, "ok")


def site_rows(data: dict) -> list[list]:
    rows = []
    for r in data["sites"]:
        s = r["site"]
        rows.append([s["key"], f"{s['calls']} ({s['first_calls']} first)", _ran(r), _best(r),
                     fmt(r["ran_ms"], ".4g"), fmt(r["best_ms"], ".4g"), fmt(r["regret_ms_per_call"], ".3g"),
                     fmt(r["regret_ms_per_token"], ".3g"), fmt(r["regret_pct"], ".1f"), _verdict(r),
                     "<br>".join(r["fixes"]) or (r["unmeasured"] or "–")])
    return rows


SITE_HEADERS = ["call site [class]", "calls", "ran", "fastest arm", "ran ms", "fastest ms", "regret ms/call",
                "regret ms/token", "regret %", "verdict", "fix"]


def arm_rows(r: dict) -> list[list]:
    rows = []
    for a in r["arms"]:
        first = fmt(a["first_p50"], ".4g") + (f" (n={len(a['first_ms'])})" if a["first_ms"] else "")
        if a["first_note"]:
            first += f" — {a['first_note']}"
        rows.append([a["arm"], a["backend"] or "–", a["status"] + (" (cached)" if a["cached"] else ""), first,
                     fmt(a["repeat_p50"], ".4g"), fmt(a["estimate_ms"], ".4g"), a["reason"] or "–"])
    return rows


ARM_HEADERS = ["arm", "backend", "status", "first call ms (p50)", "repeat ms (p50)", "site estimate ms", "reason"]


def markdown(data: dict) -> str:
    prov = data["provenance"]
    run = data["model"]
    lines = [f"# Measured dispatch regret: {data['title']}", "", f"Command: `{data['command']}`  ",
             f"Device: {prov['device']}; torch {prov['torch']}, CUDA {prov['cuda']}, cuDNN {prov['cudnn']}, "
             f"Triton {prov.get('triton')}, transformers {prov.get('transformers')}; git {prov['git_sha']}  ", ""]
    note = env_note(prov)
    if note:
        lines += [note, ""]
    lines += [f"Run: batch {run['batch']}, prompt {run['prompt']}, {run['new_tokens']} generated tokens, "
              f"{run['attention_calls']} SDPA calls, phases {', '.join(run['phases'])}"
              + (f", pinned {run['pins']}" if run["pins"] else "") + ".", ""]
    if data.get("rejected"):
        lines += [f"No SDPA call ran: the model refused `attn_implementation=\"sdpa\"` ({data['rejected']}).", ""]
    if data.get("sites") is None:
        lines += ["Not measured (no `--measure`): what ran per site.", "",
                  md_table(["call site [class]", "calls", "ran", "envelope"],
                           [[s["key"], s["calls"], ", ".join(f"{b} ×{n}" for b, n in s["ran"].items()),
                             s["envelope"]] for s in data["groups"]]), ""]
        return "\n".join(lines)
    plan = data["plan"]
    lines += [f"Each arm replays the site's recorded call (shapes, dtypes, strides, mask, scale, GQA): the **first "
              f"call** at a KV length never used before ({plan['samples']} fresh lengths, median) and the "
              f"**repeat** call (median of {plan['reps']} after a warm call), through `attnprof.run`. A site's "
              "estimate is first calls × first-call time + repeat calls × repeat time, with the counts of this run. "
              f"Regret = what ran − the fastest arm; **OVER** when it exceeds {100 * data['tolerance']:.0f} % of "
              "the fastest.", "",
              f"Total regret: **{fmt(data['regret_ms_per_token'], '.3g')} ms per generated token** "
              f"({fmt(data['regret_ms'], '.4g')} ms over the run); {data['violations']} site(s) over the tolerance."
              + (f" Apply the measured fix with `{data['fix_flag']}`." if data.get("fix_flag") else ""), "",
              md_table(SITE_HEADERS, site_rows(data)).replace("&lt;br&gt;", "<br>"), ""]
    for r in data["sites"]:
        lines += [f"### {md_escape(r['site']['key'])}", "",
                  f"{r['site']['calls']} calls over {r['site']['layers']} layer(s), {r['site']['first_calls']} "
                  f"at a new shape; replayed: `{r['site']['envelope']}`.", "",
                  md_table(ARM_HEADERS, arm_rows(r)), ""]
    return "\n".join(lines)


def _site(site: dict, wide: bool) -> str:
    """A call site for the terminal: the folded module path and the shape class (the file:line of the SDPA call is
    in --wide and audit.md)."""
    return site["key"] if wide or not site.get("module") else f"{site['module']} [{site['shape_class']}]"


def print_terminal(data: dict, *, wide: bool = False) -> None:
    """What ran per call site (and, measured, the regret of each) for a person: by default in 80 columns (short cells,
    the fixes below the table; `wide`: every column, the fixes in it)."""
    from rich.markup import escape
    from rich.table import Table

    if data.get("rejected"):
        say(f"No SDPA call ran: the model refused attn_implementation=\"sdpa\" ({data['rejected']})",
            style="yellow")
        return
    measured = data.get("sites") is not None
    title = data["title"] + (f" — regret {fmt(data['regret_ms_per_token'], '.3g')} ms/token" if measured else "")
    if not measured:
        headers = ["call site [class]", "calls", "ran", "envelope"]
        body = [[_site(s, wide), str(s["calls"]), ", ".join(f"{b} ×{n}" for b, n in s["ran"].items()), s["envelope"]]
                for s in data["groups"]]
        styles = [None] * len(body)
    else:
        headers = ["call site [class]", "ran", "fastest", "ms/call", "ms/tok", "%", "verdict"]
        body = [[_site(r["site"], wide), _ran(r), _best(r) if wide else r["best_arm"] or "–",
                 fmt(r["regret_ms_per_call"], ".3g"),
                 fmt(r["regret_ms_per_token"], ".3g"), fmt(r["regret_pct"], ".1f"), r["verdict"]]
                for r in data["sites"]]
        styles = [{"over": "bold red", "unmeasured": "yellow"}.get(r["verdict"]) for r in data["sites"]]
    if wide:
        table = Table(title=title)
        for h in headers + (["fix"] if measured else []):
            table.add_column(h, overflow="fold")
        for i, row in enumerate(body):
            fix = ("\n".join(data["sites"][i]["fixes"]) or data["sites"][i]["unmeasured"] or "") if measured else None
            table.add_row(*[escape(c) for c in row], *([escape(fix)] if measured else []), style=styles[i])
        out.print(table)
        return
    keep = ["call site [class]", "verdict", "ms/tok", "ran", "fastest", "%", "ms/call"] if measured else headers
    cuts = {"call site [class]": 36, "envelope": 44, "ran": 14, "fastest": 12}
    body = [[escape(cut(c, cuts.get(h, len(c)))) for h, c in zip(headers, row)] for row in body]  # cells are markup
    names, body, hidden = fit_columns(headers, body, keep)
    say(title, style="bold")
    out.print(compact_table("", names, body, styles=styles, right=("calls", "ms/call", "ms/tok", "%")))
    for r in data["sites"] or []:
        for fix in r["fixes"] or ([r["unmeasured"]] if r["unmeasured"] else []):
            say(f"{_site(r['site'], False)}: {r['verdict']}: {fix}", style={"over": "red"}.get(r["verdict"]))
    left_out(hidden, "--wide, audit.md")
