"""Deliberately broken attention functions, for mutation tests of `attnprof verify`.

Every function has the user-variant signature `(q, k, v, *, causal, scale, attn_mask=None)` with q `[B, Hq, Sq, D]`,
k/v `[B, Hkv, Sk, D]`, causal bottom-right aligned, `attn_mask` bool (True = attend) or additive float, and is
wrong in exactly one way that real kernels have been. `correct` is the control: the same code with no bug, which
the gate must pass. Use them as `tests.broken:<name>` (or `tests.broken.mutants:<name>`).
"""

from tests.broken.mutants import *  # noqa: F401,F403
from tests.broken.mutants import MUTANTS, SHAPE_ERRORS  # noqa: F401
