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

from attnprof.workload import Inputs

_CHUNK_BYTES = 256 * 2**20


def scale_direction(inputs: Inputs) -> torch.Tensor:
    """J = ∂ attention / ∂ log(scale) in fp64, chunked over batch × heads like the reference."""
    q, k, v = (t.detach().to(torch.float64) for t in (inputs.q, inputs.k, inputs.v))
    b, hq, sq, d = q.shape
    hkv, sk = k.shape[1], k.shape[2]
    groups = hq // hkv
    keep = inputs.valid
    if keep is None and inputs.attn_mask is not None and inputs.attn_mask.dtype == torch.bool:
        keep = inputs.attn_mask
    additive = inputs.attn_mask if inputs.attn_mask is not None and inputs.attn_mask.is_floating_point() else None
    out = torch.zeros(b, hq, sq, d, dtype=torch.float64, device=q.device)
    per = max(1, min(hq, _CHUNK_BYTES // (sq * sk * 8 * 3)))
    for bi in range(b):
        for h0 in range(0, hq, per):
            h1 = min(hq, h0 + per)
            idx = torch.arange(h0, h1, device=q.device) // groups  # query head h reads kv head h // G
            kc, vc = k[bi, idx], v[bi, idx]  # (h, Sk, D)
            s = torch.matmul(q[bi, h0:h1], kc.transpose(-2, -1)) * inputs.scale  # (h, Sq, Sk)
            logits = s if additive is None else s + additive[bi].to(torch.float64)
            if keep is not None:
                logits = logits.masked_fill(~keep[bi], float("-inf"))
            p = torch.nan_to_num(torch.softmax(logits, dim=-1), nan=0.0)  # (h, Sq, Sk)
            ps = p * s.masked_fill(p == 0, 0.0)  # p·s, without 0·inf
            o = torch.matmul(p, vc)  # (h, Sq, D)
            out[bi, h0:h1] = torch.matmul(ps, vc) - ps.sum(-1, keepdim=True) * o
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
