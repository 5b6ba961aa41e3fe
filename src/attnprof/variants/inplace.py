"""Stage two of the tutorial: the same eager attention with `masked_fill_`, so the score copy disappears."""

from __future__ import annotations

import torch

from attnprof.variants.base import Variant
from attnprof.variants.naive import eager_attention
from attnprof.workload import Inputs


def inplace_attention(inputs: Inputs) -> torch.Tensor:
    return eager_attention(inputs, inplace=True)


INPLACE = Variant(
    name="inplace",
    fn=inplace_attention,
    description="as naive, with in-place masked_fill_: no copy of the scores",
    family="inplace",
)
