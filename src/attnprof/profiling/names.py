"""Kernel names as people read them: `direct_copy_kernel_cuda`, `cuDNN SDPA flash fprop (sm90, 64×128×128 tile)`.

GPU kernel names are C++ template instantiations hundreds of characters long. `short_name` strips return types,
template and argument lists and namespaces, picks the meaningful inner functor of PyTorch's elementwise wrappers,
and decodes the names whose parts carry meaning (cuDNN's generated SDPA kernels, nvjet and cuBLAS GEMMs, FlashAttention,
the memory-efficient CUTLASS kernel, Triton/inductor kernels). Every table prints the short name; results.json and
traces keep the full one. CPU op names (`aten::bmm`) and names that are already short pass through unchanged.
"""

from __future__ import annotations

import re

_TILE = re.compile(r"(\d+)x(\d+)(?:x(\d+))?")
_SM = re.compile(r"sm_?(\d{2,3})")
# PyTorch's elementwise wrappers: the meaning is the functor or the kernel lambda inside the template arguments
_WRAPPERS = ("elementwise_kernel", "vectorized_elementwise_kernel", "unrolled_elementwise_kernel",
             "gpu_kernel_impl_nocast", "gpu_kernel_impl", "launch_legacy_kernel", "reduce_kernel")
_INNER = re.compile(r"(\w+_kernel(?:_cuda|_impl)?)\(|(\w+Functor)(?:_(\w+))?(?:<(\w+)>)?")
_FUNCTOR_MEANING = {"MulFunctor": "mul", "DivFunctor": "div", "AddFunctor": "add", "FillFunctor": "fill",
                    "CompareLTFunctor": "lt", "CompareGEFunctor": "ge", "CompareEqFunctor": "eq"}


def short_name(name: str, width: int = 60) -> str:
    """A readable name of at most about `width` characters (see the module docstring)."""
    for decode in (_cudnn, _nvjet, _cublas, _flash, _cutlass_fmha, _triton):
        short = decode(name)
        if short is not None:
            return _cut(short, width)
    if name.startswith("## Call CompiledFxGraph"):  # inductor's compiled graph on the CPU: its C++ kernels
        return "inductor graph (C++ kernels)"
    if name.startswith(("Memcpy", "Memset")) or ("<" not in name and "(" not in name):
        return _cut(name, width)
    return _cut(_cpp(name), width)


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _tile(text: str) -> str | None:
    m = _TILE.search(text)
    return "×".join(g for g in m.groups() if g) if m else None


def _sm(text: str) -> str | None:
    m = _SM.search(text)
    return f"sm{m.group(1)}" if m else None


def _detail(*parts: str | None) -> str:
    kept = [p for p in parts if p]
    return f" ({', '.join(kept)})" if kept else ""


def _cudnn(name: str) -> str | None:
    if not name.startswith("cudnn_generated") and "cudnn" not in name.split("(")[0].lower():
        return None
    low = name.lower()
    what = "SDPA" if "sdpa" in low else "kernel"
    kind = "flash " if "flash" in low else ""
    direction = "fprop" if "fprop" in low else "bprop" if ("bprop" in low or "dgrad" in low) else ""
    tile = _tile(name.split("knob", 1)[-1]) if "knob" in name else _tile(name)
    return f"cuDNN {what} {kind}{direction}".rstrip() + _detail(_sm(name), tile and f"{tile} tile")


def _nvjet(name: str) -> str | None:
    if not name.startswith("nvjet"):
        return None
    parts = name.split("_")
    layout = parts[-1] if re.fullmatch(r"[NT]{2,3}", parts[-1]) else None
    return "nvjet GEMM" + _detail(_sm(name), (t := _tile(name)) and f"{t} tile", layout)


def _cublas(name: str) -> str | None:
    base = name.split("(")[0]
    if not re.search(r"(xmma_gemm|s\d+gemm|_gemm_|gemm_kernel|cublas|sgemm|hgemm)", base) or "cutlass" in base:
        return None
    arch = _sm(base) or next((a for a in ("hopper", "ampere", "volta", "turing") if a in base), None)
    tile = re.search(r"tilesize(\d+x\d+(?:x\d+)?)", base)
    t = tile.group(1).replace("x", "×") if tile else _tile(base)
    return "cuBLAS GEMM" + _detail(arch, t and f"{t} tile")


def _flash(name: str) -> str | None:
    m = re.search(r"(flash_(?:fwd|bwd)\w*?)(?:_kernel)?<", name)
    if not m:
        return None
    traits = re.search(r"kernel_traits<(\d+), (\d+), (\d+), (\d+)", name)
    detail = _detail(f"d{traits.group(1)}", f"{traits.group(2)}×{traits.group(3)} tile") if traits else ""
    return f"FlashAttention {m.group(1).replace('_kernel', '')}" + detail


def _cutlass_fmha(name: str) -> str | None:
    m = re.match(r"fmha_cutlass([FB])_(\w+?)_(?:aligned_|notaligned_)?(\d+x\d+)", name)
    if not m:
        return None
    direction = "fwd" if m.group(1) == "F" else "bwd"
    return f"mem-efficient {direction} {m.group(2)}" + _detail(_sm(name), f"{m.group(3).replace('x', '×')} tile")


def _triton(name: str) -> str | None:
    m = re.match(r"triton_(tem|poi|red|per|mm|bmm)_(?:fused_)?(\w+?)(?:_\d+)?$", name)
    if not m:
        return None
    kind = {"tem": "template", "poi": "pointwise", "red": "reduction", "per": "persistent reduction",
            "mm": "mm", "bmm": "bmm"}[m.group(1)]
    return f"Triton {m.group(2)} ({kind})"


def _cpp(name: str) -> str:
    """Strip return type, namespaces, templates and arguments; for elementwise wrappers, the inner functor/kernel."""
    head = name[5:] if name.startswith("void ") else name
    head = head.replace("(anonymous namespace)::", "")
    outer = _func_name(head)
    if outer in _WRAPPERS:
        m = _INNER.search(head[len(head.split("<", 1)[0]):])
        if m:
            if m.group(1):
                return m.group(1)
            if m.group(3):  # CUDAFunctor_add<float>
                return f"{m.group(3)} ({m.group(2)}_{m.group(3)}{f'<{m.group(4)}>' if m.group(4) else ''})"
            functor, arg = m.group(2), m.group(4)
            # AUnaryFunctor<…, MulFunctor<float>>: the binary functor inside is the meaning
            inner = re.findall(r"(\w+Functor)(?:<(\w+)>)?", head)
            named = [(f, a) for f, a in inner if f in _FUNCTOR_MEANING]
            if named:
                functor, arg = named[0]
            meaning = _FUNCTOR_MEANING.get(functor, functor)
            return f"{meaning} ({functor}{f'<{arg}>' if arg else ''})" if meaning != functor else functor
    return outer


def _func_name(text: str) -> str:
    """The function's name: the text before its first template or argument list, without namespaces."""
    depth = 0
    end = len(text)
    for i, ch in enumerate(text):
        if ch in "<(" and depth == 0:
            end = i
            break
    base = text[:end]
    return base.rsplit("::", 1)[-1].strip() or text[:60]
