"""FP8 attention's quantize step (`Workload.dtype == "fp8"`), as a variant with an FP8 path runs it in its call.

A model's projections hand attention bf16 activations; an FP8 kernel needs e4m3 bytes and descales. So the step is
part of the FP8 kernel's price, and each of q, k, v is quantized inside the variant's call by one op,
`attnprof::quantize_fp8` (x / descale written straight into an e4m3 tensor, one elementwise kernel; a division then a
cast where a device cannot store FP8 from a division): the profile
names its kernels role `quantize` through that op (`profiling.summary`), whatever the elementwise kernel is called.
With the workload's power-of-two descales this gives exactly the bytes `Workload.make_inputs` dequantised.
"""

from __future__ import annotations

import torch

from attnprof.workload import Inputs

QUANTIZE_OP = "attnprof::quantize_fp8"  # the op name the profile's roles look for


@torch.library.custom_op(QUANTIZE_OP, mutates_args=())
def quantize_fp8(x: torch.Tensor, descale: torch.Tensor, fmt: torch.dtype) -> torch.Tensor:
    """x `[B, H, S, D]` / descale `[B, Hd]` (Hd divides H: a descale per group of H // Hd consecutive heads), in
    `fmt`, `[B, H, S, D]` contiguous; values past the format's largest saturate (torch's float8 cast)."""
    hd = descale.shape[1]
    grouped = x.unflatten(1, (hd, x.shape[1] // hd))
    d = descale[:, :, None, None, None].to(x.device)
    if _ONE_KERNEL.get(x.device.type, True):
        out = torch.empty(x.shape, dtype=fmt, device=x.device)
        try:
            torch.div(grouped, d, out=out.unflatten(1, grouped.shape[1:3]))
            return out
        except RuntimeError:  # a device whose elementwise kernels cannot store FP8: divide, then cast (same bytes)
            _ONE_KERNEL[x.device.type] = False
    return (grouped / d).to(fmt).flatten(1, 2)


_ONE_KERNEL: dict[str, bool] = {}  # device type -> whether a division can write FP8 directly (one kernel)


@quantize_fp8.register_fake
def _(x, descale, fmt):
    return torch.empty(x.shape, dtype=fmt, device=x.device)


def quantized_qkv(inputs: Inputs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v of FP8 attention's `inputs` as e4m3 `[B, H, S, D]`, each by one `attnprof::quantize_fp8`."""
    c = inputs.fp8_qkv
    if c is None:
        raise ValueError("these inputs are not FP8 attention's (Workload.dtype is not 'fp8')")
    return (quantize_fp8(inputs.q, c.q_descale, c.fmt), quantize_fp8(inputs.k, c.k_descale, c.fmt),
            quantize_fp8(inputs.v, c.v_descale, c.fmt))
