"""A measured audit (`attnprof audit --phase … --measure`) → markdown for a PR and the terminal table.

One row per call site and shape class: what ran, the measured fastest arm, the regret (ms per call, per generated
token, % of the fastest), the verdict against the tolerance and the fix; then, per site, every arm with its
first-call and repeat times so the verdict can be checked by eye.
"""

from __future__ import annotations

from attnprof.report.render import env_note, fmt, md_escape, md_table, out, say


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


def print_terminal(data: dict) -> None:
    from rich.table import Table

    if data.get("rejected"):
        say(f"No SDPA call ran: the model refused attn_implementation=\"sdpa\" ({data['rejected']})",
            style="yellow")
        return
    if data.get("sites") is None:
        table = Table(title=data["title"])
        for h in ("call site [class]", "calls", "ran", "envelope"):
            table.add_column(h, overflow="fold")
        for s in data["groups"]:
            table.add_row(s["key"], str(s["calls"]), ", ".join(f"{b} ×{n}" for b, n in s["ran"].items()),
                          s["envelope"])
        out.print(table)
        return
    table = Table(title=f"{data['title']} — regret {fmt(data['regret_ms_per_token'], '.3g')} ms/token")
    for h in ("call site [class]", "ran", "fastest", "ms/call", "ms/token", "%", "verdict / fix"):
        table.add_column(h, overflow="fold")
    for r in data["sites"]:
        style = {"over": "bold red", "unmeasured": "yellow"}.get(r["verdict"], "green")
        fix = "\n".join(r["fixes"]) or (r["unmeasured"] or "")
        table.add_row(r["site"]["key"], _ran(r), _best(r), fmt(r["regret_ms_per_call"], ".3g"),
                      fmt(r["regret_ms_per_token"], ".3g"), fmt(r["regret_pct"], ".1f"),
                      f"[{style}]{r['verdict']}[/{style}]" + (f"\n{fix}" if fix else ""))
    out.print(table)
