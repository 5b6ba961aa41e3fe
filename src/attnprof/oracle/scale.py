"""The effective softmax scale of an output: the one systematic error rounding cannot imitate.

A softmax scale 1 % off moves a bf16 output about as far as bf16 rounding does, so an error budget alone barely
separates the two. But rounding is noise and a wrong scale is a direction: to first order,

    out(scale · (1 + ε)) ≈ ref + ε · J,      J = ∂out/∂ log(scale) = Σ_j p_j s_j (v_j − ref)      (s = scale · q·k)

so projecting the error `out − ref` on J estimates ε (least squares over valid rows). Correct kernels give
|ε| ~ 1e-4 in bf16; a kernel with its scale off by 1 % gives 1e-2, whatever the rounding. The gate holds ε to
k × plain PyTorch's ε, with a per-dtype floor (gate.py).

Layout: q `[B, Hq, Sq, D]`, k/v `[B, Hkv, Sk, D]`; J is fp64 `[B, Hq, Sq, D]`, zeros on rows with no visible key.
"""

from __future__ import annotations

import torch

from attnprof.variants.reference import fp64_chunks
from attnprof.workload import Inputs

_CHUNK_BYTES = 256 * 2**20


def scale_direction(inputs: Inputs) -> torch.Tensor:
    """J = ∂ attention / ∂ log(scale) in fp64, over the oracle's own chunks (`reference.fp64_chunks`)."""
    b, hq, sq, d = inputs.q.shape
    out = torch.zeros(b, hq, sq, d, dtype=torch.float64, device=inputs.q.device)
    for c in fp64_chunks(inputs, _CHUNK_BYTES):
        ps = c.probs * c.scores.masked_fill(c.probs == 0, 0.0)  # p·s, without 0·inf
        o = torch.matmul(c.probs, c.v)  # (h, r, D)
        out[c.b, c.heads, c.rows] = torch.matmul(ps, c.v) - ps.sum(-1, keepdim=True) * o
    return out


def scale_error(out: torch.Tensor, ref: torch.Tensor, direction: torch.Tensor,
                valid_rows: torch.Tensor | None = None) -> float:
    """Least-squares ε in out − ref ≈ ε · J over valid rows: the relative error of the effective scale."""
    diff = out.detach().to(torch.float64) - ref
    j = direction
    if valid_rows is not None:
        keep = valid_rows.to(diff.device).expand(diff.shape[:-1])[..., None]  # (B, Hq, Sq, 1)
        diff, j = diff.masked_fill(~keep, 0.0), j.masked_fill(~keep, 0.0)
    if not bool(diff.isfinite().all()):
        return float("nan")
    jj = float((j * j).sum())
    return float((diff * j).sum()) / jj if jj > 0 else 0.0
