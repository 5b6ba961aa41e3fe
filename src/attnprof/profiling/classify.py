"""Kernel and operator names → the role they play in attention. One table, tested on real H200 and CPU names.

Roles: gemm, scale, mask_build, copy, mask_apply, softmax, fused_attention (with its backend), memset, other.
On the GPU every kernel, memcpy and memset counts. On the CPU the "kernels" are the aten ops that do work: a fused
attention op counts once with its children hidden; any other op counts when none of its descendants does work;
views and allocations (`METADATA_OPS`) are not work. Which names are fused attention, and of which backend, is
`attnprof.backends`' table, the one the dispatch watcher reads too; asked first, so fused kernels whose names
contain "cutlass" or "gemm" are not taken for GEMMs. After it, the first rule whose pattern matches wins.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from attnprof.backends import fused_op_backend, kernel_backend

Role = Literal["gemm", "scale", "mask_build", "copy", "mask_apply", "softmax", "fused_attention", "memset",
               "quantize", "other"]
ROLES: tuple[str, ...] = ("gemm", "scale", "mask_build", "copy", "mask_apply", "softmax", "fused_attention",
                          "memset", "quantize", "other")


@dataclass(frozen=True)
class Rule:
    pattern: str
    role: Role
    backend: str | None = None


# GPU kernel names (CUDA activity) that are not fused attention (`backends.kernel_backend` is asked first).
GPU_RULES: tuple[Rule, ...] = (
    Rule(r"^Memset", "memset"),
    Rule(r"^Memcpy", "copy"),
    # INT8/FP8 quantize and dequantize steps around a low-precision kernel (SageAttention's quant_per_block_int8)
    # (and its V preparation for FP8: TransposePadPermuteKernel, MeanScaleKernel, SubMeanKernel)
    Rule(r"(?i)quant|(?:to|cast)_?(?:int8|fp8|e4m3)|TransposePadPermute|MeanScaleKernel|SubMeanKernel", "quantize"),
    Rule(r"nvjet|gemm|xmma|cutlass|cublas|sm\d+_.*(?:s|h|bf16)\d*gemm|magma", "gemm"),
    Rule(r"triu_tril|FillFunctor<bool>|arange|CompareLTFunctor|CompareGEFunctor", "mask_build"),
    Rule(r"masked_fill|where_kernel", "mask_apply"),
    Rule(r"softmax|SoftMax", "softmax"),
    Rule(r"MulFunctor|DivFunctor|div_true|mul_kernel|AUnaryFunctor.*Mul|BUnaryFunctor.*Mul", "scale"),
    Rule(r"copy_kernel|direct_copy|CatArrayBatchedCopy|(?i:transpose)", "copy"),  # a transpose: a layout copy
    Rule(r"FillFunctor|fill_kernel|zero_", "memset"),
)

# CPU aten op names (exact op after the `aten::` prefix) that are not fused attention (`backends.fused_op_backend`).
CPU_RULES: tuple[Rule, ...] = (
    Rule(r"^(bmm|mm|addmm|baddbmm|addbmm|_addmm_activation|linear)$", "gemm"),
    Rule(r"^(mul|mul_|div|div_)$", "scale"),
    Rule(r"^(triu|tril|ones|ones_like|full|arange)$", "mask_build"),
    Rule(r"^(masked_fill_|masked_fill|where|add_)$", "mask_apply"),
    Rule(r"^(_softmax|softmax|_safe_softmax|log_softmax)$", "softmax"),
    Rule(r"^(copy_|clone|contiguous)$", "copy"),
    Rule(r"^(zero_|fill_|zeros|zeros_like)$", "memset"),
    Rule(r"quantize|dequantize", "quantize"),
)

# CPU ops that move no data and launch no work: never counted as kernels.
METADATA_OPS = frozenset({
    "empty", "empty_like", "empty_strided", "view", "_unsafe_view", "reshape", "_reshape_alias", "expand",
    "expand_as", "as_strided", "transpose", "t", "permute", "unsqueeze", "squeeze", "select", "slice", "narrow",
    "unflatten", "flatten",
    "detach", "detach_", "alias", "resolve_conj", "resolve_neg", "lift_fresh", "split", "chunk", "unbind",
    "view_as", "_nested_tensor_from_mask", "scalar_tensor", "result_type", "size", "stride", "is_nonzero",
    "item", "_local_scalar_dense", "to", "_to_copy", "set_", "record_stream",
    # torch.compile's bookkeeping ranges around a compiled graph (the graph call itself is counted)
    "TorchDynamo Cache Lookup", "AOTDispatcher Runtime Wrapper Prologue", "Pregraph bytecode",
    "Torch-Compiled Region", "CompiledFunction",
})

# Parents that change what a CPU leaf means: a fill_ inside ones()/full() builds a mask; a copy_ inside to() is a
# dtype conversion (usually of a Python scalar), not the out-of-place copy the tutorial talks about.
_CPU_PARENT_ROLE: dict[str, Role] = {"ones": "mask_build", "full": "mask_build", "triu": "mask_build",
                                     "tril": "mask_build", "_to_copy": "other", "to": "other"}

_GPU_COMPILED = [(re.compile(r.pattern), r) for r in GPU_RULES]
_CPU_COMPILED = [(re.compile(r.pattern), r) for r in CPU_RULES]


@dataclass(frozen=True)
class Classified:
    role: Role
    backend: str | None = None


def aten_name(name: str) -> str:
    return name.split("::", 1)[1] if name.startswith("aten::") else name


def classify_gpu(name: str) -> Classified:
    """Role of a GPU kernel / memcpy / memset name."""
    backend = kernel_backend(name) if not name.startswith(("Memset", "Memcpy")) else None
    if backend is not None:
        return Classified("fused_attention", backend)
    for regex, rule in _GPU_COMPILED:
        if regex.search(name):
            return Classified(rule.role, rule.backend)
    return Classified("other")


_QUANTIZE_OP = re.compile(r"(?:^|::)(?:de)?quantize")


def is_quantize_op(name: str) -> bool:
    """An op that quantizes for a low-precision kernel (`attnprof::quantize_fp8`, `quantize_per_tensor`, …): every
    kernel or leaf op inside it is a `quantize` step, whatever its own name says."""
    return bool(_QUANTIZE_OP.search(aten_name(name)))


def classify_cpu(name: str, parents: tuple[str, ...] = ()) -> Classified:
    """Role of a CPU aten op; `parents` (innermost last) disambiguate leaves like fill_ and copy_, and make every
    leaf inside a quantize op a `quantize` step."""
    if any(is_quantize_op(p) for p in parents):
        return Classified("quantize")
    op = aten_name(name)
    for parent in reversed(parents):
        role = _CPU_PARENT_ROLE.get(aten_name(parent))
        if role is not None and op in ("fill_", "copy_", "triu", "tril"):
            return Classified(role)
    backend = fused_op_backend(op)
    if backend is not None:
        return Classified("fused_attention", backend)
    for regex, rule in _CPU_COMPILED:
        if regex.search(op):
            return Classified(rule.role, rule.backend)
    return Classified("other")


def is_metadata(name: str) -> bool:
    op = aten_name(name)
    return op in METADATA_OPS or op.startswith("Torch-Compiled Region") or op.startswith("Pregraph")

