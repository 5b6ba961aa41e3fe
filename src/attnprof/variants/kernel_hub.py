"""Stage four: a fused kernel loaded through Hugging Face's `kernels` library.

Filled by the stage-four work (our Triton kernel repo in `kernels/flash-triton/` and Hub kernels). Until a kernel
module can be loaded, the variant is rejected with the reason: nothing else runs in its place.
"""

from __future__ import annotations

import torch

from attnprof.variants.base import Rejected, Support, Variant
from attnprof.workload import Inputs, Workload


def supports(workload: Workload) -> Support:
    return Rejected("kernel: no kernel repo is wired in yet (stage four is not built)")


def kernel_attention(inputs: Inputs) -> torch.Tensor:
    raise RuntimeError("kernel variant called although supports() rejected it")


KERNEL = Variant(name="kernel", fn=kernel_attention, supports=supports, family="kernel",
                 description="a fused kernel loaded through the `kernels` library")
