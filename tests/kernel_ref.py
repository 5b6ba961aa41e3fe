"""The fp64 oracle for packed and cached attention: one sequence at a time through `reference_attention`.

The serving entry points take flash-attn's layouts (`[total, H, D]` packed, `[B, S, H, D]` caches); the oracle and
plain eager attention take the registry's `[B, H, S, D]`. `Check` feeds each sequence's rows to both and adds up the
squared errors, so a packed batch gets one norm-relative error for the kernel and one for eager attention in the
same dtype (the baseline of the usual rule: kernel error <= 2 x eager's). Rows that see no key are 0 in the
oracle; eager gives NaN there, which is set to 0 before it counts.
"""

from __future__ import annotations

import math

import torch

from attnprof.variants.naive import naive_attention
from attnprof.variants.reference import reference_attention
from attnprof.workload import Inputs


def sequence_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float) -> Inputs:
    """q `[Sq, Hq, D]`, k/v `[Sk, Hkv, D]` -> Inputs `[1, H, S, D]`, causal bottom-right as a `valid` mask."""
    sq, sk = q.shape[0], k.shape[0]
    qb, kb, vb = (t.transpose(0, 1).unsqueeze(0) for t in (q, k, v))  # [S, H, D] -> [1, H, S, D]
    valid = None
    if causal:
        i = torch.arange(sq, device=q.device)[:, None]
        j = torch.arange(sk, device=q.device)[None, :]
        valid = (j <= i + sk - sq)[None, None]  # [1, 1, Sq, Sk]
    return Inputs(qb, kb, vb, causal=causal, scale=scale, valid=valid)


def lse_reference(q: torch.Tensor, k: torch.Tensor, causal: bool, scale: float) -> torch.Tensor:
    """fp64 log-sum-exp of the scores, `[Hq, Sq]`; +inf where a row sees no key (flash-attn's convention)."""
    g = q.shape[1] // k.shape[1]
    s = torch.einsum("qhd,khd->hqk", q.double(), k.double().repeat_interleave(g, 1)) * scale
    if causal:
        sq, sk = q.shape[0], k.shape[0]
        hidden = torch.arange(sk, device=q.device)[None, :] > torch.arange(sq, device=q.device)[:, None] + sk - sq
        s = s.masked_fill(hidden, float("-inf"))
    lse = torch.logsumexp(s, -1)
    return torch.where(torch.isneginf(lse), torch.full_like(lse, math.inf), lse)


class Check:
    """Accumulates ||kernel - oracle||², ||eager - oracle||² and ||oracle||² over the sequences of one case."""

    def __init__(self) -> None:
        self.err = self.eager = self.norm = 0.0
        self.finite = True

    def add(self, out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
            scale: float, exact_kv: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
        """`out` `[Sq, Hq, D]`: the kernel's rows for one sequence with q `[Sq, Hq, D]`, k/v `[Sk, Hkv, D]`.
        `exact_kv`: the keys/values the oracle takes instead (fp64: an FP8 cache dequantised), k/v then being their
        rounding to q's dtype, what eager attention gets."""
        if q.shape[0] == 0:
            return
        inputs = sequence_inputs(q, k, v, causal, scale)
        if k.shape[0] == 0:
            ref = torch.zeros(inputs.q.shape, dtype=torch.float64, device=q.device)
            eager = ref
        else:
            ref = reference_attention(inputs if exact_kv is None
                                      else sequence_inputs(q.double(), *exact_kv, causal, scale))
            eager = naive_attention(inputs).double()
            if inputs.valid is not None:
                eager = eager.masked_fill(~inputs.valid.any(-1, keepdim=True), 0.0)
        got = out.transpose(0, 1).unsqueeze(0).double()  # [Sq, H, D] -> [1, H, Sq, D]
        self.finite &= bool(got.isfinite().all())
        self.err += (got.nan_to_num(nan=math.inf) - ref).norm().item() ** 2
        self.eager += (eager - ref).norm().item() ** 2
        self.norm += ref.norm().item() ** 2

    def result(self) -> dict:
        scale = max(self.norm, 1e-60) ** 0.5
        return {"err": self.err ** 0.5 / scale, "eager": self.eager ** 0.5 / scale, "finite": self.finite}


def within_rule(r: dict) -> None:
    """The usual rule on a `Check.result()`: finite, and error <= 2 x eager attention's in the same dtype."""
    assert r["finite"] and r["err"] <= 2 * r["eager"], f"kernel {r['err']:.3g} > 2 x eager {r['eager']:.3g}"


def fp8_cache(x: torch.Tensor, descale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x `[B, S, Hkv, D]` stored as an FP8 cache in flash-attn's convention: x / descale (`[B, Hkv]`, or one element)
    saturated at the format's largest value, rounded to nearest even by torch's cast."""
    d = descale.reshape(-1)[0] if descale.numel() == 1 else descale[:, None, :, None]
    top = torch.finfo(dtype).max
    return (x.double() / d.double()).clamp(-top, top).to(dtype)


def dequantized(x8: torch.Tensor, descale: torch.Tensor) -> torch.Tensor:
    """The fp64 values an FP8 cache `[B, S, Hkv, D]` (or a paged `[blocks, page, Hkv, D]` one with a per-tensor
    descale) holds: x8 · descale."""
    d = descale.reshape(-1)[0] if descale.numel() == 1 else descale[:, None, :, None]
    return x8.double() * d.double()


def packed(lengths: list[int], heads: int, d: int, dtype: torch.dtype, device: str = "cpu",
           generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Random `[sum(lengths), heads, d]` rows and the int32 `[B + 1]` cumulative lengths."""
    x = torch.randn(sum(lengths), heads, d, generator=generator, device="cpu").to(dtype=dtype, device=device)
    cu = torch.tensor([0, *torch.tensor(lengths, dtype=torch.int64).cumsum(0).tolist()], dtype=torch.int32,
                      device=device)
    return x, cu
