"""Closed sets the CLI needs before anything heavy is imported (argparse choices): no torch here."""

from __future__ import annotations

from typing import Literal

MaskKind = Literal["none", "bool", "additive", "pad-right", "pad-left"]
MASK_KINDS: tuple[str, ...] = ("none", "bool", "additive", "pad-right", "pad-left")

# What `attnprof verify` checks by default: every backend one could roll out (naive/inplace are plain PyTorch, the
# gate's own baseline; the oracle is the oracle).
VERIFY_VARIANTS: tuple[str, ...] = ("sdpa", "sdpa-flash", "sdpa-efficient", "sdpa-cudnn", "sdpa-math", "flex",
                                    "kernel")
