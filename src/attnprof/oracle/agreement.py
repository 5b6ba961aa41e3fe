"""How far one attention output is from the fp64 oracle, in the numbers a reviewer needs to judge it.

An `Agreement` holds the maximum absolute error (and where it is), the norm-relative error
`‖out − ref‖ / ‖ref‖`, how many elements miss a per-dtype `atol + rtol·|ref|` band (Liger-Kernel's style of
assert message), NaN/Inf counts in the output and in the reference, and what happened in the rows that see no
key at all, and the effective softmax scale (scale.py). Those "fully masked" rows are compared separately: the reference makes them zeros (FlashAttention's
convention), and a NaN there is the classic bug that spreads through the next layer's V into valid rows.

Errors are measured on the valid rows only (rows with at least one visible key), in float64.
Layout: out and ref are `[B, Hq, Sq, D]`; `valid_rows` is bool `[B, 1 or Hq, Sq]`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from attnprof.oracle.scale import scale_direction, scale_error
from attnprof.variants.reference import reference_attention
from attnprof.workload import Inputs

# Informational band for the mismatch count (the pass rule is baseline-relative, see gate.py):
# (atol, rtol) per dtype, about the rounding unit of each format for O(1) attention outputs.
TOLERANCES: dict[str, tuple[float, float]] = {
    "fp64": (1e-10, 1e-10),
    "fp32": (1e-5, 1e-5),
    "fp16": (2e-3, 2e-3),
    "bf16": (1.6e-2, 1.6e-2),
    "fp8": (6.25e-2, 6.25e-2),  # e4m3's rounding unit (the probabilities are rounded to it)
}


@dataclass(frozen=True)
class Agreement:
    """One output against the reference. Errors over valid rows; `masked_*` over rows that see no key."""

    max_abs: float
    norm_rel: float
    mismatches: int
    numel: int
    atol: float
    rtol: float
    nan_out: int
    inf_out: int
    nan_ref: int
    inf_ref: int
    worst_index: tuple[int, ...] | None
    worst_out: float | None
    worst_ref: float | None
    masked_rows: int = 0  # (b, h, q) rows with no visible key
    masked_nonzero: int = 0  # elements of those rows that are not exactly 0 (NaN included)
    masked_nan: int = 0  # NaN/Inf elements of those rows
    scale_err: float | None = None  # least-squares relative error of the effective softmax scale (scale.py)

    @property
    def finite(self) -> bool:
        """No NaN/Inf in valid rows beyond what the reference itself has."""
        return self.nan_out <= self.nan_ref and self.inf_out <= self.inf_ref

    @property
    def masked_rows_zero(self) -> bool:
        return self.masked_nonzero == 0

    def to_json(self) -> dict:
        d = asdict(self)
        d["worst_index"] = list(self.worst_index) if self.worst_index is not None else None
        return d

    def describe(self) -> str:
        """A verbose one-paragraph account, like Liger-Kernel's assert message."""
        parts = [f"max abs {self.max_abs:.3e}"]
        if self.worst_index is not None:
            parts[0] += (f" at [b,h,q,d]={list(self.worst_index)} (out {self.worst_out:+.6g} vs ref "
                         f"{self.worst_ref:+.6g})")
        parts.append(f"norm-rel {self.norm_rel:.3e}")
        pct = 100.0 * self.mismatches / self.numel if self.numel else 0.0
        parts.append(f"{self.mismatches}/{self.numel} elements ({pct:.2f}%) outside atol {self.atol:g} + "
                     f"rtol {self.rtol:g}·|ref|")
        if self.scale_err is not None:
            parts.append(f"effective softmax scale ×{1 + self.scale_err:.5f}")
        parts.append(f"NaN out/ref {self.nan_out}/{self.nan_ref}, Inf out/ref {self.inf_out}/{self.inf_ref}")
        if self.masked_rows:
            if self.masked_rows_zero:
                parts.append(f"{self.masked_rows} fully-masked rows are zeros")
            else:
                parts.append(f"{self.masked_rows} fully-masked rows: {self.masked_nonzero} elements non-zero "
                             f"({self.masked_nan} NaN/Inf), reference is zeros")
        return "; ".join(parts)


def valid_rows_of(valid: torch.Tensor | None, shape: torch.Size) -> torch.Tensor | None:
    """bool `[B, 1, Sq, Sk]` visibility → bool `[B, 1, Sq]` rows with at least one visible key (None: all rows)."""
    if valid is None:
        return None
    rows = valid.any(dim=-1)  # (B, 1, Sq)
    return None if bool(rows.all()) else rows


def compare(out: torch.Tensor, ref: torch.Tensor, *, dtype: str, valid_rows: torch.Tensor | None = None,
            tolerances: tuple[float, float] | None = None, direction: torch.Tensor | None = None) -> Agreement:
    """`out` (any float dtype) against `ref` (fp64), both `[B, Hq, Sq, D]`; see the module docstring.

    `direction` is `scale.scale_direction(inputs)`; with it the agreement also holds the effective-scale error.
    """
    if tuple(out.shape) != tuple(ref.shape):
        raise ValueError(f"output shape {tuple(out.shape)} != reference shape {tuple(ref.shape)}")
    atol, rtol = tolerances or TOLERANCES.get(dtype, TOLERANCES["fp32"])
    o = out.detach().to(device=ref.device, dtype=torch.float64)
    r = ref.detach().to(torch.float64)
    if valid_rows is None:
        keep = torch.ones(o.shape[:-1], dtype=torch.bool, device=o.device)
    else:
        keep = valid_rows.to(o.device).expand(o.shape[:-1])  # (B, Hq, Sq)
    keep = keep[..., None].expand(o.shape)  # (B, Hq, Sq, D)

    ov, rv = o[keep], r[keep]
    nan_out, inf_out = int(ov.isnan().sum()), int(ov.isinf().sum())
    nan_ref, inf_ref = int(rv.isnan().sum()), int(rv.isinf().sum())
    diff = (o - r).abs().masked_fill(~keep, 0.0)
    # A NaN or Inf in the output is the worst error there is: count it as infinitely far.
    diff = torch.where(o.isfinite() | ~keep, diff, torch.full_like(diff, float("inf")))
    numel = int(keep.sum())
    if numel:
        flat = int(torch.argmax(diff.nan_to_num(nan=float("inf"))).item())
        worst = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), o.shape))
        max_abs = float(diff.reshape(-1)[flat])
        ref_norm = float(torch.linalg.vector_norm(rv))
        err_norm = float(torch.linalg.vector_norm(ov - rv))
        norm_rel = err_norm / ref_norm if ref_norm > 0 else (0.0 if err_norm == 0 else float("inf"))
        if ov.isnan().any():
            norm_rel = float("inf")
        mismatches = int((~((ov - rv).abs() <= atol + rtol * rv.abs())).sum())  # NaN counts as a mismatch
        worst_out, worst_ref = float(o[worst]), float(r[worst])
    else:
        worst, max_abs, norm_rel, mismatches, worst_out, worst_ref = None, 0.0, 0.0, 0, None, None

    scale_err = scale_error(o, r, direction, valid_rows) if direction is not None else None
    masked = ~keep[..., 0]  # (B, Hq, Sq)
    masked_out = o[masked]  # (rows, D)
    return Agreement(
        max_abs=max_abs, norm_rel=norm_rel, mismatches=mismatches, numel=numel, atol=atol, rtol=rtol,
        nan_out=nan_out, inf_out=inf_out, nan_ref=nan_ref, inf_ref=inf_ref,
        worst_index=worst, worst_out=worst_out, worst_ref=worst_ref,
        masked_rows=int(masked.sum()),
        masked_nonzero=int((masked_out != 0).sum()),  # NaN != 0 is True
        masked_nan=int((~masked_out.isfinite()).sum()), scale_err=scale_err,
    )


@dataclass(frozen=True)
class Reference:
    """The fp64 oracle's answer for one set of inputs, with what every comparison against it needs: the valid rows
    (rows that see at least one key; the others are compared as "fully masked", one way everywhere) and, for the
    numerics gate, the effective-scale direction. out and direction are fp64 `[B, Hq, Sq, D]`."""

    out: torch.Tensor
    rows: torch.Tensor | None
    direction: torch.Tensor | None = None

    @classmethod
    def of(cls, inputs: Inputs, *, scale: bool = False) -> Reference:
        """The oracle on `inputs`; `scale` also computes ∂out/∂log(scale) (a few more fp64 passes)."""
        out = reference_attention(inputs)
        return cls(out=out, rows=valid_rows_of(inputs.valid, out.shape),
                   direction=scale_direction(inputs) if scale else None)

    def compare(self, out: torch.Tensor, dtype: str) -> Agreement:
        return compare(out, self.out, dtype=dtype, valid_rows=self.rows, direction=self.direction)
