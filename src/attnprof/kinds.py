"""Closed sets the CLI needs before anything heavy is imported (argparse choices): no torch here."""

from __future__ import annotations

from typing import Literal

MaskKind = Literal["none", "bool", "additive", "pad-right", "pad-left"]
MASK_KINDS: tuple[str, ...] = ("none", "bool", "additive", "pad-right", "pad-left")
