"""Stage four: a fused attention kernel loaded through Hugging Face's `kernels` library, and nothing else.

By default the `kernel` variant is our own Triton kernel repo, `kernels/flash-triton/` in this checkout, loaded
with `kernels.get_local_kernel`. `--kernel org/repo@version` loads a Hub kernel with `kernels.get_kernel`
instead (any kernel with flash-attn's `flash_attn_func(q, k, v, softmax_scale=…, causal=…)` in `[B, S, H, D]`),
but only when the user also passes `--trust-remote-kernel`: Hub kernels are code, and we never run them
silently. `--kernel PATH` loads another kernel repo on disk; `LOCAL_KERNELS=org/repo=PATH` works as the
`kernels` library defines it (it maps a Hub name to a folder). Whatever cannot be loaded (no build variant for
this system, a broken `metadata.json`, a Hub kernel not in the cache while offline) is a `Rejected` with the
reason and, where it helps, the command that would fix it.

Layout: the registry speaks `[B, H, S, D]`; flash-attn kernels take `[B, S, H, D]`, so this file transposes on
the way in and out (see `kernel_attention`). A padded workload (`pad-left`, `pad-right`, `bool`) goes through the
kernel's `flash_attn_varlen_func` (`kernel_padded.py`: unpad, run, scatter back) when the repo has one.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import torch

from attnprof.backends import register_kernel_module
from attnprof.errors import UsageError, first_line
from attnprof.variants.base import Accepted, Rejected, Support, Variant, takes_keywords
from attnprof.variants.fp8 import quantized_qkv
from attnprof.variants.kernel_padded import PADDED_MASKS, padded_attention
from attnprof.workload import Inputs, Workload

DEFAULT_REPO = Path(__file__).resolve().parents[3] / "kernels" / "flash-triton"
_HUB_SPEC = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+)(?:@(?P<ref>[\w./-]+))?$")


@dataclass(frozen=True)
class KernelSpec:
    """Where the `kernel` variant's module comes from: a kernel repo on disk, or a Hub repo at a version."""

    path: Path | None = None
    repo_id: str | None = None
    version: int | None = None
    revision: str | None = None
    trust_remote: bool = False

    def label(self) -> str:
        if self.path is not None:
            return str(self.path)
        ref = f"v{self.version}" if self.version is not None else self.revision
        return f"{self.repo_id}@{ref}"

    def fetch_command(self) -> str:
        ref = f"version={self.version}" if self.version is not None else f"revision={self.revision!r}"
        return (f"python -c \"import kernels; kernels.get_kernel({self.repo_id!r}, {ref}, "
                f"trust_remote_code=True)\" (with network, HF_HUB_OFFLINE unset)")


def parse_spec(spec: str | None, trust_remote: bool = False) -> KernelSpec:
    """`None` → our repo; an existing folder → that repo; `org/repo@1` or `org/repo@<revision>` → the Hub."""
    if spec is None or spec in ("", "default"):
        return KernelSpec(path=DEFAULT_REPO, trust_remote=trust_remote)
    if Path(spec).expanduser().exists():
        return KernelSpec(path=Path(spec).expanduser().resolve(), trust_remote=trust_remote)
    m = _HUB_SPEC.match(spec)
    if not m:
        raise UsageError(f"--kernel {spec!r}: neither an existing kernel repo folder nor org/repo@version")
    if m["ref"] is None:
        raise UsageError(f"--kernel {spec!r}: name a version or revision, e.g. {spec}@1 (kernels needs one)")
    ref = m["ref"]
    if ref.isdigit():
        return KernelSpec(repo_id=m["repo"], version=int(ref), trust_remote=trust_remote)
    return KernelSpec(repo_id=m["repo"], revision=ref, trust_remote=trust_remote)


DEFAULT = parse_spec(None)
_loaded: dict[KernelSpec, ModuleType | Rejected] = {}


def metadata_problem(repo: Path) -> str | None:
    """None when every build variant's metadata.json parses, else one line naming the file and the problem."""
    from kernels import Metadata

    if not repo.is_dir():
        return f"kernel repo {repo} does not exist"
    build = repo / "build"
    variants = sorted(p for p in build.iterdir() if p.is_dir()) if build.is_dir() else []
    if not variants and not (repo / "metadata.json").exists():
        return f"kernel repo {repo} has no build/<variant>/ folder (and no metadata.json of its own)"
    for folder in variants or [repo]:
        meta = folder / "metadata.json"
        if not meta.is_file():
            return f"{meta} is missing (every build variant needs one)"
        try:
            Metadata.read_from_file(meta)
        except ValueError as e:
            return f"{meta} is malformed: {first_line(e, typed=False)}"
    return None


def load(spec: KernelSpec = DEFAULT) -> ModuleType | Rejected:
    """The kernel module for `spec` (default: kernels/flash-triton), loaded once, or why it cannot be loaded."""
    if spec not in _loaded:
        _loaded[spec] = _load(spec)
    return _loaded[spec]


def _load(spec: KernelSpec) -> ModuleType | Rejected:
    try:
        import kernels
    except ImportError:
        return Rejected("kernel: the `kernels` library is not installed (pip install 'kernels>=0.17')")
    if spec.path is not None:
        problem = metadata_problem(spec.path)
        if problem:
            return Rejected(f"kernel: {problem}")
        try:
            module = kernels.get_local_kernel(spec.path)
        except (FileNotFoundError, ValueError, RuntimeError, ImportError) as e:
            return Rejected(f"kernel: {spec.label()}: {first_line(e, lines=4, typed=False)}")
    else:
        if not spec.trust_remote and spec.repo_id not in _local_overrides():
            return Rejected(f"kernel: {spec.label()} is code from the Hugging Face Hub; pass --trust-remote-kernel "
                            "to allow loading it")
        try:
            module = kernels.get_kernel(spec.repo_id, version=spec.version, revision=spec.revision,
                                        trust_remote_code=True)
        except Exception as e:  # network, cache and resolution errors come from several libraries; all refuse
            offline = os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false")
            where = "not in the local Hugging Face cache and the Hub is offline" if offline else "could not be loaded"
            return Rejected(f"kernel: {spec.label()} {where} ({type(e).__name__}: {first_line(e, lines=4, typed=False)}); "
                            f"fetch it with: {spec.fetch_command()}")
    if not callable(getattr(module, "flash_attn_func", None)):
        return Rejected(f"kernel: {spec.label()} has no flash_attn_func(q, k, v, softmax_scale=…, causal=…)")
    register_kernel_module(module)  # its program names: the watcher and the classifier know them as `kernel`
    return module


def _local_overrides() -> set[str]:
    """Repo ids that `LOCAL_KERNELS` (repo=path:repo=path) maps to folders: local code, no trust needed."""
    entries = os.environ.get("LOCAL_KERNELS", "")
    return {entry.split("=", 1)[0] for entry in entries.split(":") if "=" in entry}


def supports(workload: Workload, spec: KernelSpec = DEFAULT) -> Support:
    if workload.mask not in ("none", *PADDED_MASKS):
        return Rejected(f"kernel: flash-attn kernels take no {workload.mask} mask (padding goes through "
                        "flash_attn_varlen_func: pad-left, pad-right, bool); try sdpa or flex")
    if workload.dtype not in ("fp16", "bf16", "fp8"):
        return Rejected(f"kernel: flash-attn kernels take fp16 or bf16 (or FP8 with descales), not {workload.dtype}")
    on_cpu = not workload.device.startswith("cuda")
    if on_cpu and os.environ.get("TRITON_INTERPRET") != "1":
        return Rejected("kernel: no CUDA device here and Triton's interpreter is off; set TRITON_INTERPRET=1 "
                        "to run the Triton kernel on the CPU (slow; for tests)")
    module = load(spec)
    if isinstance(module, Rejected):
        return module
    head_dims = getattr(module, "SUPPORTED_HEAD_DIMS", None)
    if head_dims is not None and workload.head_dim not in head_dims:
        return Rejected(f"kernel: head dim {workload.head_dim} is not supported by {spec.label()} "
                        f"(supported: {', '.join(map(str, head_dims))})")
    if on_cpu and not getattr(module, "INTERPRETED", False):
        return Rejected("kernel: this kernel module was loaded without Triton's interpreter and cannot run on "
                        "the CPU (TRITON_INTERPRET=1 must be set before the kernel is loaded)")
    note = "" if head_dims is not None else "head-dim and dtype limits are the kernel's own"
    if workload.kv_dtype:
        return _fp8_support(workload, module, spec, on_cpu, note)
    if workload.fp8_attention:
        return _fp8_attention_support(workload, module, spec, note)
    if workload.mask != "none":
        if not callable(getattr(module, "flash_attn_varlen_func", None)):
            return Rejected(f"kernel: {spec.label()} has no flash_attn_varlen_func, and flash_attn_func takes no mask "
                            f"(mask={workload.mask}); try sdpa or flex")
        if on_cpu and workload.dtype == "bf16":
            return Rejected("kernel: flash_attn_varlen_func refuses bf16 under Triton's interpreter (it gets bf16 "
                            "tl.dot wrong); use fp16 on the CPU, or a GPU")
        note = "; ".join(filter(None, [note, f"mask={workload.mask} through flash_attn_varlen_func (unpadded)"]))
    return Accepted(note)


def _fp8_support(workload: Workload, module, spec: KernelSpec, on_cpu: bool, note: str) -> Support:
    """An FP8 KV cache reaches a kernel through `flash_attn_with_kvcache` with flash-attn's descales (the whole cache
    as each sequence's keys); without that entry point the kernel has no FP8 path, which is a rejection, never a
    silent bf16 run."""
    if not takes_keywords(getattr(module, "flash_attn_with_kvcache", None), "k_descale", "v_descale"):
        return Rejected(f"kernel: {spec.label()} has no flash_attn_with_kvcache taking k_descale/v_descale: no FP8 "
                        "KV-cache path")
    if workload.mask != "none":
        return Rejected(f"kernel: an FP8 KV cache goes through flash_attn_with_kvcache, which takes no "
                        f"mask={workload.mask} here (padding is each sequence's cache length)")
    if on_cpu and workload.dtype == "bf16":
        return Rejected("kernel: flash_attn_with_kvcache refuses bf16 under Triton's interpreter (it gets bf16 "
                        "tl.dot wrong); use fp16 on the CPU, or a GPU")
    if workload.dtype == "fp32":
        return Rejected("kernel: an FP8 KV cache with fp32 queries: flash_attn_with_kvcache takes fp16 or bf16")
    return Accepted("; ".join(filter(None, [note, f"reads the {workload.kv_dtype} cache through "
                                                  "flash_attn_with_kvcache (k_descale, v_descale)"])))


def _fp8_attention_support(workload: Workload, module, spec: KernelSpec, note: str) -> Support:
    """FP8 attention (e4m3 q, k, v) reaches a kernel through `flash_attn_func` with FlashAttention-3's descales;
    without them the kernel has no FP8 path, which is a rejection, never a bf16 run."""
    if not takes_keywords(getattr(module, "flash_attn_func", None), "q_descale", "k_descale", "v_descale"):
        return Rejected(f"kernel: {spec.label()}'s flash_attn_func takes no q_descale/k_descale/v_descale: no FP8 "
                        "attention path")
    if workload.mask != "none":
        return Rejected(f"kernel: FP8 attention goes through flash_attn_func, which takes no mask={workload.mask} "
                        "(no FP8 varlen form)")
    head_dims = getattr(module, "FP8_HEAD_DIMS", None)
    if head_dims is not None and workload.head_dim not in head_dims:
        return Rejected(f"kernel: head dim {workload.head_dim}: {spec.label()}'s FP8 attention is built for head "
                        f"dims {', '.join(map(str, head_dims))}")
    return Accepted("; ".join(filter(None, [note, FP8_ATTENTION_PATH])))


FP8_ATTENTION_PATH = ("q, k, v quantized to e4m3 in the call (attnprof::quantize_fp8), then flash_attn_func with "
                      "q_descale, k_descale, v_descale")


def kernel_attention(inputs: Inputs, spec: KernelSpec = DEFAULT) -> torch.Tensor:
    """`[B, H, S, D]` in and out; the kernel itself sees `[B, S, H, D]`. An FP8 KV cache (`inputs.fp8`) goes
    through `flash_attn_with_kvcache` over the whole cache with its descales."""
    module = load(spec)
    if isinstance(module, Rejected):
        raise RuntimeError(module.reason)
    if inputs.fp8 is not None:
        if inputs.attn_mask is not None:  # never a silent unmasked run (supports() refuses such workloads)
            raise ValueError("kernel: an FP8 KV cache with a mask: flash_attn_with_kvcache takes each sequence's "
                             "cache length, not a mask")
        c = inputs.fp8
        q, k8, v8 = (t.transpose(1, 2) for t in (inputs.q, c.k, c.v))  # [B, S, H, D] views
        out = module.flash_attn_with_kvcache(q, k8, v8, softmax_scale=inputs.scale, causal=inputs.causal,
                                             k_descale=c.k_descale, v_descale=c.v_descale)
        return _bhsd(out)
    if inputs.fp8_qkv is not None:  # FP8 attention: the quantize steps are part of the call (variants/fp8.py)
        c = inputs.fp8_qkv
        q8, k8, v8 = (t.transpose(1, 2) for t in quantized_qkv(inputs))  # [B, S, H, D] views
        out = module.flash_attn_func(q8, k8, v8, softmax_scale=inputs.scale, causal=inputs.causal,
                                     q_descale=c.q_descale, k_descale=c.k_descale, v_descale=c.v_descale)
        return _bhsd(out)
    if inputs.attn_mask is not None:  # padding: the varlen form over each sequence's key range
        return padded_attention(module, inputs.q, inputs.k, inputs.v, inputs.attn_mask, inputs.scale)
    # [B, H, S, D] -> [B, S, H, D], flash-attn's layout, as views. A kernel that declares `ACCEPTS_STRIDED`
    # (flash-triton: any batch/seq/head strides, last dim contiguous) gets the views, no copy; any other kernel
    # gets `.contiguous()` copies (free when the workload was made as [B, S, H, D]), which show up in the profile.
    q, k, v = (t.transpose(1, 2) for t in (inputs.q, inputs.k, inputs.v))
    if not (getattr(module, "ACCEPTS_STRIDED", False) and all(t.stride(-1) == 1 for t in (q, k, v))):
        q, k, v = (t.contiguous() for t in (q, k, v))
    out = module.flash_attn_func(q, k, v, softmax_scale=inputs.scale, causal=inputs.causal)
    return _bhsd(out)


def _bhsd(out) -> torch.Tensor:
    """A flash-attn entry point's output `[B, S, H, D]` (some builds return `(out, softmax_lse, ...)`) as
    `[B, H, S, D]`, a view."""
    return (out[0] if isinstance(out, tuple) else out).transpose(1, 2)


def kernel_variant(spec: KernelSpec = DEFAULT) -> Variant:
    """The `kernel` variant loading `spec` (the `--kernel` value): the repo travels in the Variant, not a global."""
    def run(inputs: Inputs) -> torch.Tensor:
        return kernel_attention(inputs, spec)

    def accepts(workload: Workload) -> Support:
        return supports(workload, spec)

    run.__name__ = "kernel_attention"
    run.kernel_spec = spec  # the repo it loads, for models/attention.py's adapter
    return Variant(name="kernel", fn=run, supports=accepts, family="kernel", backend="kernel",
                   fp8_path="the FP8 bytes, through flash_attn_with_kvcache (k_descale, v_descale)",
                   fp8_attention=FP8_ATTENTION_PATH,
                   description=f"a fused kernel loaded through the `kernels` library: {spec.label()}",
                   recipe=(kernel_variant, (spec,)))


KERNEL = kernel_variant(DEFAULT)
