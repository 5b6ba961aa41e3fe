"""Which attention backend a name belongs to: the one table the dispatch watcher and the profiler's classifier share.

Three kinds of names, one lookup each:
- `fused_op_backend`: aten operators of SDPA's fused backends (`_scaled_dot_product_cudnn_attention` …). The watcher
  reads them from the dispatcher, the classifier from CPU profiles (`aten::` names).
- `kernel_backend`: GPU kernel names. First the exact names of kernel-repo kernels, read from the kernel module
  when `variants.kernel_hub` loads it (`KERNEL_NAMES` when the module exports it, else its public Triton and Gluon
  programs, found in its source); then PyTorch's, cuDNN's and Inductor's kernels, whose names carry tile shapes and
  versions and are matched by pattern; last, any other kernel whose name says attention (a user's Triton kernel).
  The watcher uses the same lookup to decide which Triton launches are attention calls.

Most specific first everywhere: `_scaled_dot_product_flash_attention_for_cpu` before `…_flash_attention`.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from types import ModuleType
from typing import Literal

Backend = Literal["cudnn", "flash", "efficient", "cpu_flash", "overrideable", "math", "flex", "kernel"]
SDPA_FUSED: tuple[Backend, ...] = ("cudnn", "flash", "efficient", "cpu_flash", "overrideable")

# aten operator name fragment → backend, most specific first.
FUSED_OPS: tuple[tuple[str, Backend], ...] = (
    ("_scaled_dot_product_cudnn_attention", "cudnn"),
    ("_cudnn_attention_forward", "cudnn"),
    ("_scaled_dot_product_flash_attention_for_cpu", "cpu_flash"),
    ("_scaled_dot_product_fused_attention_overrideable", "overrideable"),
    ("_scaled_dot_product_efficient_attention", "efficient"),
    ("_efficient_attention_forward", "efficient"),
    ("_scaled_dot_product_flash_attention", "flash"),
    ("_flash_attention_forward", "flash"),
)

# GPU kernels of PyTorch, cuDNN and Inductor (names measured on the H200: docs/results, tests/test_classify.py).
VENDOR_KERNELS: tuple[tuple[str, Backend], ...] = (
    (r"cudnn.*sdpa|sdpa.*cudnn|fort_native_sdpa|cudnn.*fprop.*attention", "cudnn"),
    (r"pytorch_flash::|flash_fwd|flash::|flash_attn", "flash"),
    (r"fmha_cutlass|attention_kernel_batched|mem_eff|efficient_attention|fmha_", "efficient"),
    (r"flex_attention|flex_decoding|triton_tem_fused_flex", "flex"),
)
# Any other kernel named for attention (Triton's tutorial `_attn_fwd`, a user's own): a kernel of its own. Inductor's
# pointwise and reduction kernels (`triton_poi_…`, `triton_per_…`, `triton_red_…`) are named after the aten ops they
# fuse, attention ops included, and are never the attention kernel itself.
_ATTENTION_WORDS = re.compile(r"attn|attention|fmha|sdpa", re.IGNORECASE)
_INDUCTOR_POINTWISE = re.compile(r"^triton_(poi|per|red)_")

_VENDOR = [(re.compile(pattern), backend) for pattern, backend in VENDOR_KERNELS]
_KERNEL_NAMES: dict[str, Backend] = {}  # exact names of the loaded kernel repos' programs


def fused_op_backend(op_name: str) -> Backend | None:
    """The fused SDPA backend an aten operator belongs to (`aten::` prefix or not), or None."""
    for fragment, backend in FUSED_OPS:
        if fragment in op_name:
            return backend
    return None


def kernel_backend(name: str) -> Backend | None:
    """The backend of a GPU kernel or Triton program named `name`, or None when it is not attention."""
    if name in _KERNEL_NAMES:
        return _KERNEL_NAMES[name]
    for regex, backend in _VENDOR:
        if regex.search(name):
            return backend
    return "kernel" if _ATTENTION_WORDS.search(name) and not _INDUCTOR_POINTWISE.match(name) else None


def register_kernel_module(module: ModuleType) -> tuple[str, ...]:
    """Learn the kernel names of a loaded kernel repo module (see `kernel_names_of`); returns them."""
    names = kernel_names_of(module)
    for name in names:
        _KERNEL_NAMES[name] = "kernel"
    return names


def kernel_names_of(module: ModuleType) -> tuple[str, ...]:
    """`module.KERNEL_NAMES` when it has one, else the public (not `_`-prefixed) functions decorated with a `.jit`
    (`@triton.jit`, `@gluon.jit`) in the `.py` files of its package: the programs it launches, whose names the
    profiler prints. Lazily imported programs count too, since the source is read, not the module's namespace."""
    exported = getattr(module, "KERNEL_NAMES", None)
    if exported is not None:
        return tuple(str(n) for n in exported)
    folder = Path(getattr(module, "__file__", "") or "").parent
    names: list[str] = []
    for path in sorted(folder.glob("*.py")) if str(folder) not in ("", ".") else []:
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (OSError, SyntaxError, UnicodeDecodeError):
            continue  # not ours to judge: a file we cannot read adds no names
        names += [node.name for node in tree.body
                  if isinstance(node, ast.FunctionDef) and not node.name.startswith("_") and _is_jit(node)]
    return tuple(names)


def _is_jit(node: ast.FunctionDef) -> bool:
    for dec in node.decorator_list:
        target = dec.func if isinstance(dec, ast.Call) else dec
        if isinstance(target, ast.Attribute) and target.attr == "jit":
            return True
    return False
