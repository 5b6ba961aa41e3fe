"""How `attnprof verify` reads: the terminal tables and failure lines, and the markdown summary for a pull request
(verify.json, schema attnprof.verify/1, is `numerics.verify`'s dict).

Cells show the worst of the three ratios error / limit (max abs, norm-relative, effective scale): below 1
passes, and the distance from 1 is the margin. Every failure is listed with its reasons and, where the error
pattern matches a known bug class, a hint; every rejection with its reason.
"""

from __future__ import annotations

import math

from rich.table import Table

from attnprof.numerics.kernel_level import CaseResult, CaseRun
from attnprof.report.render import column_blocks, compact_table, out, say


def ratio(r: CaseResult) -> float | None:
    """Worst error / limit over the gate's metrics (None when the variant did not run)."""
    a, v = r.agreement, r.verdict
    if a is None or v is None:
        return None
    if not a.finite:
        return math.inf
    parts = [a.max_abs / v.limit_max_abs if v.limit_max_abs else 0.0,
             a.norm_rel / v.limit_norm_rel if v.limit_norm_rel else 0.0]
    if a.scale_err is not None and v.limit_scale:
        parts.append(abs(a.scale_err) / v.limit_scale)
    return max(parts)


def cell(r: CaseResult, *, rich: bool) -> str:
    if r.status == "rejected":
        return "[dim]rejected[/dim]" if rich else "rejected"
    if r.status == "error":
        return "[red]error[/red]" if rich else "**error**"
    x = ratio(r)
    text = "NaN" if x is None or not math.isfinite(x) else f"{x:.2f}"
    if r.status == "fail" and x is not None and x <= 1:
        text = "masked rows"  # the valid rows pass; the rows that see no key are not zeros
    if r.status == "pass":
        return f"[green]✓ {text}[/green]" if rich else f"✓ {text}"
    return f"[red]✗ {text}[/red]" if rich else f"**✗ {text}**"


def kernel_table(runs: list[CaseRun], dtype: str) -> Table:
    mine = [r for r in runs if r.case.workload.dtype == dtype]
    table = Table(title=f"kernel level, {dtype}: worst error/limit vs the fp64 oracle (limit = k × plain PyTorch "
                        f"{dtype}, floored)", title_justify="left")
    table.add_column("variant")
    for run in mine:
        table.add_column(run.case.name, justify="right")
    names = list(dict.fromkeys(r.variant for run in mine for r in run.results))
    for name in names:
        table.add_row(name, *[next((cell(r, rich=True) for r in run.results if r.variant == name), "")
                              for run in mine])
    return table


def compact_kernel_tables(runs: list[CaseRun], dtype: str) -> None:
    """`kernel_table` in 80 columns: the cases in blocks, each repeating the variant column; nothing wraps."""
    mine = [r for r in runs if r.case.workload.dtype == dtype]
    names = list(dict.fromkeys(r.variant for run in mine for r in run.results))
    headers = ["variant", *(run.case.name for run in mine)]
    rows = [[name, *[next((cell(r, rich=True) for r in run.results if r.variant == name), "") for run in mine]]
            for name in names]
    say(f"kernel level, {dtype}: worst error/limit vs the fp64 oracle (limit = k × plain PyTorch {dtype}, floored)",
        style="bold")
    for block_headers, block_rows in column_blocks(headers, rows):
        out.print(compact_table("", block_headers, block_rows, right=tuple(block_headers[1:])))


def lossy_rows(runs: list[CaseRun], dtype: str) -> tuple[list[str], list[list[str]]] | None:
    """FP8's cost per variant and case: error against the fp64 oracle of the unquantized inputs, as a multiple of
    plain PyTorch's error on them in 16 bits (`dtype`'s for an FP8 KV cache, bf16's for FP8 attention); None
    without FP8."""
    mine = [r for r in runs if r.case.workload.dtype == dtype
            and (r.case.workload.kv_dtype or r.case.workload.fp8_attention)]
    if not mine:
        return None
    names = list(dict.fromkeys(r.variant for run in mine for r in run.results if r.lossy_factor is not None))
    if not names:
        return None
    rows = [[name, *[next((f"{r.lossy_factor:.1f}×" for r in run.results
                           if r.variant == name and r.lossy_factor is not None), "") for run in mine]]
            for name in names]
    return ["variant", *(run.case.name for run in mine)], rows


def kv_reads(runs: list[CaseRun]) -> dict[str, str]:
    """With an FP8 KV cache: what each variant read (the FP8 bytes through its path, or the cache dequantised)."""
    return {r.variant: r.kv_read for run in runs for r in run.results if r.kv_read}


def print_lossy(runs: list[CaseRun], dtype: str) -> None:
    table = lossy_rows(runs, dtype)
    if table is None:
        return
    if dtype == "fp8":
        say("FP8 attention (e4m3 q, k, v): error vs the fp64 oracle of the unquantized bf16 inputs, × plain PyTorch "
            "bf16's on them (what FP8 costs; the gate above judges each against its dequantised inputs)", style="bold")
    else:
        fmt = next(r.case.workload.kv_dtype for r in runs if r.case.workload.kv_dtype)
        say(f"{fmt} KV cache, {dtype}: error vs the fp64 oracle of the unquantized keys/values, × plain PyTorch "
            f"{dtype}'s on them (what the cache costs; the gate above judges each against its dequantised cache)",
            style="bold")
    headers, rows = table
    for block_headers, block_rows in column_blocks(headers, rows):
        out.print(compact_table("", block_headers, block_rows, right=tuple(block_headers[1:])))
    for name, read in kv_reads([r for r in runs if r.case.workload.dtype == dtype]).items():
        say(f"  {name} read {read}", style="dim")


def print_model_level(model: dict, *, wide: bool = False) -> None:
    """The model level's table (its title a sentence above it by default) and, below it, each reason of a row that
    did not pass, once per implementation and reason (a refusal in transformers' words included)."""
    if not wide:
        say(f"model level: {model['preset']}, left-padded batch {model['batch']}×{model['seq']}, vs eager fp32 on "
            f"{model['valid_positions']} valid positions", style="bold")
    out.print(model_table(model, wide=wide))
    said: dict[tuple[str, str], list[str]] = {}  # (impl status, reason) → the dtypes it holds for
    for r in model["results"]:
        if r["status"] in ("fail", "error", "rejected") and r["reason"]:
            said.setdefault((f"{r['impl']} {r['status']}", r["reason"]), []).append(r["dtype"])
    for (what, why), dtypes in said.items():
        say(f"{what} ({', '.join(dtypes)}): {why}", wide=wide, style="dim" if "rejected" in what else "red")
    for line in fp8_cost_lines(model):
        say(line, wide=wide, style="bold")
    say(DECISIVE_NOTE, wide=wide, style="dim")


def fp8_cost_lines(model: dict) -> list[str]:
    """What an FP8 KV cache costs the model, one line per dtype (eager over it against eager over the 16-bit cache);
    none without one."""
    kv = model.get("kv_dtype")
    return [f"{kv} KV cache costs {model['preset']} in {dtype} (eager, against its unquantized cache): max |Δ logits| "
            f"{c['max_abs']:.2e}, mean KL {c['kl_mean']:.2e} (max {c['kl_max']:.2e}), top-1 {100 * c['top1']:.1f}% "
            f"of {c['positions']} positions ({_top1(c)} decisive), greedy prefix {c['prefix_min']}/{c['tokens']} "
            f"(mean {c['prefix_mean']:.1f})" for dtype, c in (model.get("fp8_cost") or {}).items()]


DECISIVE_NOTE = ("top-1: agreement at the N decisive positions, where eager fp32's top-2 logit margin exceeds twice "
                 "the max |Δ logits| the gate allows in that dtype; nearer ties flip on rounding alone (eager's own "
                 "half-precision run included) and are not counted")


def _top1(a: dict, sep: str = " of ") -> str:
    """Top-1 agreement at the decisive positions and how many there are ("99.0% of 71"; compact: "99.0%/71"). No
    decisive position (every top-2 margin a near-tie) is "none decisive", not a 100 % that judged nothing."""
    if not a["decisive"]:
        return "none decisive"
    return f"{100 * a['top1_decisive']:.1f}%{sep}{a['decisive']}"


def model_table(model: dict, *, wide: bool = False) -> Table:
    """The model level's table; by default in 80 columns (short headers, no box), `wide`: the full one."""
    title = (f"model level: {model['preset']}, left-padded batch {model['batch']}×{model['seq']}, "
             f"vs eager fp32 on {model['valid_positions']} valid positions")
    cols = ("impl", "dtype", "status", "max |Δ logits|", "mean KL", "top-1 (decisive)", "greedy prefix")
    rows = []
    for r in model["results"]:
        a = r["agreement"]
        colour = {"pass": "green", "fail": "red", "error": "red", "rejected": "dim", "baseline": "cyan"}[r["status"]]
        nums = (["–"] * 4 if a is None else
                [f"{a['max_abs']:.2e}", f"{a['kl_mean']:.2e}", _top1(a, " of " if wide else "/"),
                 f"{a['prefix_min']}/{a['tokens']}"])
        rows.append([r["impl"], r["dtype"], f"[{colour}]{r['status']}[/{colour}]", *nums])
    if not wide:
        short = ["impl", "dtype", "status", "max |Δ|", "mean KL", "top-1/N", "prefix"]
        return compact_table("", short, rows, right=tuple(short[3:]))
    table = Table(title=title, title_justify="left")
    for col in cols:
        table.add_column(col, justify="left" if col in ("impl", "dtype", "status") else "right")
    for row in rows:
        table.add_row(*row)
    return table


def markdown(data: dict, command: str) -> str:
    prov = data["provenance"]
    lines = [f"# attnprof verify: {'PASS' if data['ok'] else 'FAIL'}", "",
             f"`{command}`", "",
             f"{prov['device']} · torch {prov['torch']} · CUDA {prov.get('cuda')} · cuDNN {prov.get('cudnn')} · "
             f"triton {prov.get('triton')} · transformers {prov.get('transformers')} · git {prov.get('git_sha')} · "
             f"seed {prov['seed']}", ""]
    rule = data["rule"]
    lines += [f"Rule: error ≤ max({rule['k']:g} × error of plain PyTorch in the same dtype, per-dtype floor) for "
              "max abs and norm-relative error against the fp64 oracle, the effective softmax scale within "
              f"max({rule['k']:g} × plain PyTorch's, floor), no NaN/Inf in valid rows, rows that see no key "
              f"{'must be zeros' if rule['masked_rows'] == 'zeros' else 'reported when not zeros'}. "
              "Cells: worst error/limit (< 1 passes).", ""]
    kernel = data.get("kernel")
    if kernel:
        for dtype in kernel["dtypes"]:
            cases = [c for c in kernel["cases"] if c["workload"]["dtype"] == dtype]
            lines += [f"## Kernel level, {dtype}", "",
                      "| variant | " + " | ".join(c["name"] for c in cases) + " |",
                      "| --- |" + " ---: |" * len(cases)]
            names = list(dict.fromkeys(r["variant"] for c in cases for r in c["results"]))
            for name in names:
                cells = []
                for c in cases:
                    r = next((x for x in c["results"] if x["variant"] == name), None)
                    cells.append(_md_cell(r))
                lines.append(f"| `{name}` | " + " | ".join(cells) + " |")
            lines += ["", "Plain PyTorch baseline (max abs / norm-rel): " + ", ".join(
                f"{c['name']} {c['baseline']['max_abs']:.1e}/{c['baseline']['norm_rel']:.1e}" for c in cases
                if c["baseline"]), ""]
            lines += _lossy_md(cases, dtype)
        lines += ["Cases: " + "; ".join(f"**{c['name']}** {c['why']}" for c in kernel["cases"]
                                        if c["workload"]["dtype"] == kernel["dtypes"][0]), ""]
        lines += _issues_md(kernel["summary"])
    model = data.get("model")
    if model:
        lines += [f"## Model level: {model['preset']}", "",
                  f"Left-padded batch {model['batch']}×{model['seq']} ({model['valid_positions']} valid positions), "
                  f"greedy {model['decode_tokens']} tokens; compared with eager fp32. {DECISIVE_NOTE}.", "",
                  "| impl | dtype | status | max abs Δ logits | mean KL | top-1 (decisive) | greedy prefix | reason |",
                  "| --- | --- | --- | ---: | ---: | ---: | ---: | --- |"]
        for r in model["results"]:
            a = r["agreement"]
            nums = ("– | – | – | –" if a is None else
                    f"{a['max_abs']:.2e} | {a['kl_mean']:.2e} | {_top1(a)} | {a['prefix_min']}/{a['tokens']}")
            reason = (r["reason"] or "").replace("|", "\\|")
            lines.append(f"| `{r['impl']}` | {r['dtype']} | {r['status']} | {nums} | {reason} |")
        lines.append("")
        lines += [f"Left out of the defaults: `{d['impl']}`: {d['reason']} (name it in `--impls` to run it).\n"
                  for d in model.get("left_out", [])]
        if model.get("kv_dtype"):
            lines += [f"Rows `… (kv {model['kv_dtype']})` ran over an FP8 KV cache (`models.fp8_cache`: stored in "
                      f"{model['kv_dtype']}, power-of-two descales per sequence and kv head fixed by the prompt with "
                      "one binade of headroom, read dequantised), judged against eager fp32 over the same cache.", ""]
            lines += [f"- {line}" for line in fp8_cost_lines(model)] + [""]
        from attnprof.report.features_report import markdown as features_markdown

        lines += features_markdown(model.get("attention_features"))
    return "\n".join(lines) + "\n"


def _lossy_md(cases: list[dict], dtype: str) -> list[str]:
    """FP8's cost table (see `lossy_rows`), when the cases had an FP8 KV cache or were FP8 attention."""
    fmt = next((c["workload"].get("kv_dtype") for c in cases if c["workload"].get("kv_dtype")), None)
    if fmt is None and dtype != "fp8":
        return []
    names = list(dict.fromkeys(r["variant"] for c in cases for r in c["results"] if r.get("lossy_factor") is not None))
    if fmt is None:
        what = ("FP8 attention: q, k and v were quantized to e4m3 (power-of-two descales per (batch, kv head), the "
                "query's per kv-head group) and the output is bf16; variants without an FP8 attention path were "
                "rejected, and the gate above judges each against the fp64 oracle of the dequantised inputs and "
                "`plain_fp8_attention` (P rounded to e4m3). What FP8 costs: the error against the oracle of the "
                "unquantized bf16 inputs, × plain PyTorch bf16's error on them.")
    else:
        what = (f"{fmt} KV cache: the keys and values were an FP8 cache (x / descale, power-of-two descales per "
                "(batch, kv head)); variants without an FP8 path were given it dequantised, and the gate above judges "
                "each against the fp64 oracle of that dequantised cache. What the cache costs: the error against the "
                f"oracle of the unquantized keys/values, × plain PyTorch {dtype}'s error on them (a 16-bit cache's).")
    lines = [what, "", "| variant | " + " | ".join(c["name"] for c in cases) + " |", "| --- |" + " ---: |" * len(cases)]
    for name in names:
        cells = [next((f"{r['lossy_factor']:.1f}×" for r in c["results"]
                       if r["variant"] == name and r.get("lossy_factor") is not None), "") for c in cases]
        lines.append(f"| `{name}` | " + " | ".join(cells) + " |")
    reads = {r["variant"]: r["kv_read"] for c in cases for r in c["results"] if r.get("kv_read")}
    if not reads:
        return [*lines, ""]
    return [*lines, "", "What each read: " + "; ".join(f"`{n}` {how}" for n, how in reads.items()) + ".", ""]


def _md_cell(r: dict | None) -> str:
    if r is None:
        return ""
    if r["status"] in ("rejected", "error"):
        return r["status"]
    v, a = r["verdict"], r["agreement"]
    if not (a["nan_out"] <= a["nan_ref"] and a["inf_out"] <= a["inf_ref"]):
        x = "NaN"
    else:
        parts = [a["max_abs"] / v["limit_max_abs"], a["norm_rel"] / v["limit_norm_rel"]]
        if a.get("scale_err") is not None and v.get("limit_scale"):
            parts.append(abs(a["scale_err"]) / v["limit_scale"])
        x = f"{max(parts):.2f}" if r["status"] == "pass" or max(parts) > 1 else "masked rows"
    return f"✓ {x}" if r["status"] == "pass" else f"**✗ {x}**"


def _issues_md(summary: dict) -> list[str]:
    lines = []
    failed = {n: s for n, s in summary.items() if s["status"] == "fail"}
    if failed:
        lines += ["### Failures", ""]
        for name, s in failed.items():
            lines.append(f"- `{name}`: {s['fail'] + s['error']} case(s) failed")
            for f in s["failures"][:4]:
                hint = f" — *{f['hint']}*" if f["hint"] else ""
                lines.append(f"  - {f['case']} {f['dtype']}: {f['reason']}{hint}")
        lines.append("")
    rejected = {n: s for n, s in summary.items() if s["rejections"]}
    if rejected:
        lines += ["### Rejected (did not run; the reason is the implementation's own)", ""]
        for name, s in rejected.items():
            reasons = list(dict.fromkeys(r["reason"] for r in s["rejections"]))
            cases = ", ".join(f"{r['case']} {r['dtype']}" for r in s["rejections"])
            lines.append(f"- `{name}` ({cases}): " + " / ".join(reasons[:3]))
        lines.append("")
    return lines


def print_kernel_level(level: dict, runs: list[CaseRun], *, wide: bool = False) -> None:
    """The per-dtype tables (by default in blocks of cases that fit 80 columns), then one line per failing variant
    (its first failure and hint) or rejected one."""
    from rich.console import Group

    if wide:
        out.print(Group(*(kernel_table(runs, d) for d in level["dtypes"])))
    else:
        for d in level["dtypes"]:
            compact_kernel_tables(runs, d)
    for d in level["dtypes"]:
        print_lossy(runs, d)
    for name, s in level["summary"].items():
        if s["status"] == "fail":
            f = s["failures"][0]
            say(f"✗ {name} ({s['fail'] + s['error']} case(s)); first: {f['case']} {f['dtype']}: {f['reason'] or ''}",
                wide=wide, style="red")
            if f["hint"]:
                say(f["hint"], wide=wide, indent="    ", style="yellow")
        elif s["rejections"] and not s["pass"]:
            say(f"– {name} rejected: {s['rejections'][0]['reason'] or ''}", wide=wide, style="dim")
