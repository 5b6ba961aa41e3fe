"""Why an unexpected kernel runs, from the op that launched it (`attribution.Origin`), not from its role.

A device copy is a different problem when `masked_fill` (out of place) makes it than when `.contiguous()` after a
transpose does, or `repeat_interleave` for grouped-query heads, or a quantize step before an INT8/FP8 kernel. The
first rule, in the chain's order (outermost op first), whose op pattern matches wins; then the kernel name's
quantize pattern; then the role's generic sentence, naming the launching op.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from attnprof.profiling.attribution import Origin


@dataclass(frozen=True)
class Cause:
    op: str | None  # the aten op named as the cause (None: no aten op launched it)
    what: str
    fix: str | None = None

    def text(self) -> str:
        head = f"{qualified(self.op)}: {self.what}" if self.op else self.what
        return head + (f" — fix: {self.fix}" if self.fix else "")

    def to_json(self) -> dict:
        return {"op": self.op, "what": self.what, "fix": self.fix}


@dataclass(frozen=True)
class _Rule:
    ops: str  # regex on the aten op name (full match)
    what: str
    fix: str | None


# Checked against every op of the chain, outermost first.
OP_RULES: tuple[_Rule, ...] = (
    _Rule(r"masked_fill", "out-of-place masked_fill copies the whole score matrix before writing the mask",
          "use masked_fill_ (in place), or a fused kernel that applies the mask itself (is_causal=True)"),
    _Rule(r"repeat_interleave|repeat",
          "key/value heads repeated in memory for grouped-query attention",
          "pass enable_gqa=True to scaled_dot_product_attention, or a kernel that takes fewer key/value heads"),
    _Rule(r"contiguous",
          "a layout copy: .contiguous() materialises a transposed/permuted tensor in a new layout",
          "give the kernel the layout it takes ([B,S,H,D] for the flash-attn convention, [B,H,S,D] for SDPA) "
          "instead of transposing, or use its layout argument"),
    _Rule(r"reshape|flatten|view_as_real|_reshape_alias",
          "a layout copy: reshape of a non-contiguous tensor (after a transpose) copies it",
          "reshape before transposing, or keep the layout the next op takes"),
    _Rule(r"_to_copy|to|type_as|_autocast_to_reduced_precision|float|half|bfloat16",
          "a dtype conversion copies the tensor", "keep the inputs in the dtype the kernel computes in"),
    _Rule(r"cat|stack|_cat", "a concatenation copies its inputs", "write into one preallocated buffer"),
    _Rule(r"ones|ones_like|full|triu|tril|arange",
          "the causal mask is rebuilt every step",
          "build it once outside the step, or let a fused kernel apply causality (is_causal=True)"),
    _Rule(r"clone", "an explicit clone copies the tensor", "drop the clone if nothing writes the tensor later"),
)
_OP_COMPILED = [(re.compile(rf"(?:{r.ops})"), r) for r in OP_RULES]

QUANTIZE = re.compile(r"quant|(?:to|cast)_?(?:int8|fp8|e4m3)|TransposePadPermute|MeanScaleKernel|SubMeanKernel",
                      re.IGNORECASE)

_BY_ROLE: dict[str, tuple[str, str | None]] = {
    "copy": ("a device copy", None),
    "mask_build": ("the causal mask is rebuilt every step",
                   "build it once outside the step, or let a fused kernel apply causality (is_causal=True)"),
    "memset": ("a memset or fill (on the GPU: cuBLAS workspace or output zeroing)", None),
    "quantize": ("quantization of the inputs before a low-precision kernel: part of that kernel's price",
                 "none: count it with the kernel (compare its error with `attnprof verify`)"),
}

# Roles whose kernels are worth a line when a stage is not one fused kernel.
UNEXPECTED_ROLES = frozenset(_BY_ROLE)


def explain(name: str, role: str, origin: Origin | None) -> Cause:
    """The cause of kernel `name` (role `role`) launched from `origin`."""
    chain = origin.chain if origin else ()
    if role == "quantize" or QUANTIZE.search(name):
        what, fix = _BY_ROLE["quantize"]
        return Cause(_first(chain), what, fix)
    if role == "memset" and chain and chain[0] in ("bmm", "mm", "matmul", "baddbmm", "addmm", "linear"):
        return Cause(chain[0], "cuBLAS zeroes its workspace inside the GEMM", None)
    for op in chain:
        for regex, rule in _OP_COMPILED:
            if regex.fullmatch(op):
                return Cause(op, rule.what, rule.fix)
    what, fix = _BY_ROLE.get(role, ("", None))
    what = what or f"a {role} kernel"
    if chain:
        return Cause(chain[0], f"{what}, launched inside {qualified(' → '.join(chain))}", fix)
    return Cause(None, f"{what}, launched outside any aten op (a custom or Triton launch)", fix)


def qualified(op: str) -> str:
    """An op chain as the profiler names it: aten ops with their `aten::` prefix, others (`attnprof::…`) as they are."""
    return op if "::" in op.split(" → ")[0] else f"aten::{op}"


def _first(chain: tuple[str, ...]) -> str | None:
    return chain[0] if chain else None
