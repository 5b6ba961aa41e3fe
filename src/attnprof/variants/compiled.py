"""`naive-compiled`: the tutorial's naive attention under `torch.compile` (inductor), as a stage.

Does the compiler rescue hand-written attention? The stage's kernels say what inductor made of it: generated
Triton kernels (GPU) or C++ kernels (CPU) fusing the scale, mask and softmax around the GEMMs, or — when its
pattern matcher recognises the attention — a fused SDPA kernel (the row's backend then names it). The first
calls compile (seconds), which `run()`'s warm-up keeps out of the profiled and timed calls.
"""

from __future__ import annotations

import functools

import torch

from attnprof.variants.base import Accepted, Rejected, Support, Variant
from attnprof.variants.naive import eager_attention
from attnprof.workload import Inputs, Workload


@functools.cache
def _compiled():
    return torch.compile(functools.partial(eager_attention, inplace=False), dynamic=False)


def compiled_naive(inputs: Inputs) -> torch.Tensor:
    return _compiled()(inputs)


def supports(workload: Workload) -> Support:
    if workload.device.startswith("cuda"):
        try:
            import triton  # noqa: F401 — inductor's GPU code generator
        except ImportError:
            return Rejected("naive-compiled: torch.compile on CUDA needs triton (pip install triton)")
    return Accepted()


NAIVE_COMPILED = Variant(name="naive-compiled", fn=compiled_naive, supports=supports, family="extra",
                         backend="inductor", description="naive attention under torch.compile (inductor)")
