"""When a variant fails, say what its output looks like: the bug classes that produce most attention errors.

"max abs 3e-2 > 2e-2" tells a reviewer that something is wrong; this file tells them what. Each hypothesis is
an alternative fp64 reference with one thing changed (the softmax scale, the causal diagonal, the causal
alignment, the padding, the GQA head map). When the variant's output is much closer to one of them than to the
true reference, that is the hint. If none matches and the error is noise-like, the hint is precision loss
(a half-precision accumulator or softmax). Hints are heuristics, reported beside the verdict, never instead.

Layout: q `[B, Hq, Sq, D]`, k/v `[B, Hkv, Sk, D]`, masks bool `[B, 1, Sq, Sk]` (True = attend).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from attnprof.oracle.agreement import Agreement, compare
from attnprof.variants import reference_attention
from attnprof.workload import Inputs, Workload

_MATCH = 0.35  # an alternative explains the output when its error is below this fraction of the real one


def _rel(out: torch.Tensor, ref: torch.Tensor, rows: torch.Tensor | None) -> float:
    """norm-relative error over valid rows (NaN → inf): `oracle.agreement`'s, the one there is."""
    return compare(out, ref, dtype="fp64", valid_rows=rows).norm_rel


def _visibility(w: Workload, *, offset: int | None = None, causal: bool | None = None, padding: str | None = None,
                device) -> torch.Tensor:
    """bool `[B, 1, Sq, Sk]` with one rule changed: the causal diagonal offset, causal on/off, padding side."""
    sq, sk = w.seq, w.kv_seq
    causal = w.causal if causal is None else causal
    padding = w.mask if padding is None else padding
    keep = torch.ones(w.batch, 1, sq, sk, dtype=torch.bool, device=device)
    if causal:
        keep &= torch.ones(sq, sk, dtype=torch.bool, device=device).tril(diagonal=sk - sq if offset is None else offset)
    if padding in ("pad-left", "pad-right"):
        lengths = torch.tensor(w.valid_lengths(), device=device)
        pos = torch.arange(sk, device=device)
        ok = pos[None, :] >= (sk - lengths)[:, None] if padding == "pad-left" else pos[None, :] < lengths[:, None]
        keep &= ok[:, None, None, :]
    return keep


def _hypotheses(w: Workload, inputs: Inputs) -> list[tuple[str, Callable[[], torch.Tensor]]]:
    dev = inputs.q.device

    def with_valid(valid: torch.Tensor) -> Callable[[], torch.Tensor]:
        return lambda: reference_attention(Inputs(inputs.q, inputs.k, inputs.v, causal=False, scale=inputs.scale,
                                                  attn_mask=None, valid=valid))

    hyps: list[tuple[str, Callable[[], torch.Tensor]]] = []
    if w.causal:
        diag = w.kv_seq - w.seq
        hyps.append(("causal mask off by one: each query also sees the next key (diagonal +1)",
                     with_valid(_visibility(w, offset=diag + 1, device=dev))))
        hyps.append(("causal mask off by one: each query misses its own key (diagonal −1)",
                     with_valid(_visibility(w, offset=diag - 1, device=dev))))
        if w.seq != w.kv_seq:
            hyps.append(("causal mask aligned top-left instead of bottom-right (Sq ≠ Sk)",
                         with_valid(_visibility(w, offset=0, device=dev))))
        hyps.append(("causal mask ignored", with_valid(_visibility(w, causal=False, device=dev))))
    elif w.seq > 1:
        hyps.append(("a causal mask applied where none was asked for",
                     with_valid(_visibility(w, causal=True, device=dev))))
    if w.mask in ("pad-left", "pad-right"):
        flipped = "pad-right" if w.mask == "pad-left" else "pad-left"
        hyps.append(("padding mask ignored (padded keys attended to)", with_valid(_visibility(w, padding="none", device=dev))))
        hyps.append((f"padding taken from the wrong side ({flipped} instead of {w.mask})",
                     with_valid(_visibility(w, padding=flipped, device=dev))))
    if w.kv_seq > 1:
        for where, idx in (("last", -1), ("first", 0)):
            drop = torch.ones(w.batch, 1, w.seq, w.kv_seq, dtype=torch.bool, device=dev)
            drop[..., idx] = False
            base = inputs.valid if inputs.valid is not None else torch.ones_like(drop)
            hyps.append((f"the {where} key is never read (a loop bound off by one)", with_valid(base & drop)))
    if inputs.attn_mask is not None and inputs.attn_mask.dtype == torch.bool:
        def as_bias() -> torch.Tensor:
            bias = inputs.attn_mask.to(torch.float64)  # 1 where True, 0 where False: added, not masked
            return reference_attention(Inputs(inputs.q, inputs.k, inputs.v, causal=False, scale=inputs.scale,
                                              attn_mask=bias, valid=None))
        hyps.append(("the boolean mask was added as a 0/1 bias instead of masking", as_bias))
    if w.gqa:
        groups = w.heads // w.kv_heads

        def interleaved() -> torch.Tensor:
            # query head h reads kv head h % Hkv (tile) instead of h // G (repeat_interleave)
            k, v = inputs.k.repeat(1, groups, 1, 1), inputs.v.repeat(1, groups, 1, 1)  # (B, Hq, Sk, D)
            return reference_attention(Inputs(inputs.q, k, v, causal=inputs.causal, scale=inputs.scale,
                                              attn_mask=inputs.attn_mask, valid=inputs.valid))
        hyps.append(("GQA heads mapped wrongly: query head h reads kv head h % Hkv instead of h // (Hq/Hkv)",
                     interleaved))
    return hyps


def _fit_scale(out: torch.Tensor, inputs: Inputs, rows: torch.Tensor | None) -> tuple[float, float]:
    """The factor f that makes reference(scale · f) closest to out (golden section on log f in [−1, 1]).

    Fitted on query head 0 and its kv head 0 only (the same pair under any GQA grouping), to stay cheap.
    """
    inputs = Inputs(inputs.q[:, :1], inputs.k[:, :1], inputs.v[:, :1], causal=inputs.causal, scale=inputs.scale,
                    attn_mask=inputs.attn_mask, valid=inputs.valid)  # q (B, 1, Sq, D), k/v (B, 1, Sk, D)
    out = out[:, :1]
    rows = rows[:, :1] if rows is not None else None

    def err(logf: float) -> float:
        alt = Inputs(inputs.q, inputs.k, inputs.v, causal=inputs.causal, scale=inputs.scale * math.exp(logf),
                     attn_mask=inputs.attn_mask, valid=inputs.valid)
        return _rel(out, reference_attention(alt), rows)

    lo, hi = -1.0, 1.0
    g = (math.sqrt(5) - 1) / 2
    a, b = hi - g * (hi - lo), lo + g * (hi - lo)
    fa, fb = err(a), err(b)
    for _ in range(22):  # bracket shrinks to ~5e-5 in log f
        if fa < fb:
            hi, b, fb = b, a, fa
            a = hi - g * (hi - lo)
            fa = err(a)
        else:
            lo, a, fa = a, b, fb
            b = lo + g * (hi - lo)
            fb = err(b)
    best = (a + b) / 2
    return math.exp(best), err(best)


def diagnose(out: torch.Tensor, workload: Workload, inputs: Inputs, ref: torch.Tensor, agreement: Agreement,
             rows: torch.Tensor | None, baseline_rel: float, direction: torch.Tensor | None = None) -> str | None:
    """A one-line hint about what kind of bug produced `out`, or None when nothing fits."""
    o = out.detach().to(torch.float64)
    finite = o.isfinite() if rows is None else o.isfinite() | ~rows.expand(o.shape[:-1])[..., None]
    if not bool(finite.all()):
        return "NaN/Inf in valid rows: an unguarded softmax over -inf, or an overflow in half precision"
    now = _rel(o, ref, rows)
    if now == 0:
        return None
    best_name, best_err = None, now
    for name, make in _hypotheses(workload, inputs):
        e = _rel(o, make(), rows)
        if e < best_err:
            best_name, best_err = name, e
    if best_name is not None and best_err < _MATCH * now:
        return f"looks like: {best_name} (error {now:.2e} → {best_err:.2e} against that hypothesis)"
    eps = agreement.scale_err
    if direction is not None and eps is not None and math.isfinite(eps):
        e = _rel(o - eps * direction, ref, rows)  # what is left once the scale component is removed
        if e < _MATCH * now:
            return (f"looks like: softmax scale off by {100 * eps:+.2f}% (scale ×{1 + eps:.4f}; error {now:.2e} → "
                    f"{e:.2e} once that is removed)")
    if eps is not None and abs(eps) > 0.05:  # far from 1: the linear estimate is poor, fit the scale itself
        factor, e = _fit_scale(o, inputs, rows)
        if e < _MATCH * now and abs(factor - 1) > 1e-4:
            return (f"looks like: softmax scale off by {100 * (factor - 1):+.2f}% (scale ×{factor:.4f}; error "
                    f"{now:.2e} → {e:.2e} with that scale)")
    if agreement.norm_rel < 0.05 and baseline_rel > 0 and now > 2 * baseline_rel:
        return (f"no structural bug matched (scale, causal diagonal/alignment, padding, GQA map); the error is "
                f"noise-like and {now / baseline_rel:.1f}× plain PyTorch's: precision loss, e.g. a half-precision "
                "accumulator or softmax")
    return None
