"""The attention workload: one frozen description of shapes, dtype, mask and device, and the inputs it makes.

Every consumer (profiling, audit, numerics, bench) takes the same `Workload` and the same `Inputs` from
`Workload.make_inputs(seed)`, so there is exactly one way in. Layout at this boundary is always `[B, H, S, D]`:
q is `[B, Hq, Sq, D]`, k and v are `[B, Hkv, Sk, D]` (GQA when Hkv < Hq; query head h reads kv head
h // (Hq // Hkv), the grouping of SDPA's `enable_gqa` and of transformers' `repeat_kv`).

With `kv_dtype="fp8"` (e4m3; "fp8_e5m2") the keys and values are an FP8 KV cache: `Inputs.fp8` holds the cache as
stored (x / descale, descales per (batch, kv head) in flash-attn's convention, each a power of two, so that the
dequantised values are exact in the workload dtype) and the values before quantization; `Inputs.k`/`v` are the
dequantised cache in the workload dtype: what a variant without an FP8 path reads after a dequantize step, and what
the fp64 oracle takes. A variant with an FP8 path (our kernel's `flash_attn_with_kvcache`) reads the FP8 bytes.

With `dtype="fp8"` the attention itself is FP8 (e4m3 q, k and v, bf16 activations and output): the inputs are drawn in
bf16 and quantized once, per (batch, kv head) with power-of-two descales in FlashAttention-3's convention (the
query's per kv-head group); `Inputs.q`/`k`/`v` are the dequantised bf16 values (exact), what the fp64 oracle and a
bf16 comparison take, and `Inputs.fp8_qkv` holds the descales and the values before quantization. A variant with an
FP8 attention path quantizes q, k and v itself inside its call (with those descales: exactly the stored bytes), so
the quantize steps are part of its time and its profile, as they are in a model; a variant without one is rejected.

Causal means bottom-right aligned, as FlashAttention and every KV-cache decoder define it: query i sees keys
j <= i + (Sk - Sq). With Sq == Sk that is the ordinary lower triangle; with Sq == 1 (decode) the query sees all
keys. Rows that see no key at all (Sq > Sk, or left padding) must come out as zeros.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from attnprof.errors import UsageError
from attnprof.kinds import MASK_KINDS, MaskKind  # defined without torch: the CLI's choices read them

DTYPES: dict[str, torch.dtype] = {
    "fp32": torch.float32,
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
    "fp64": torch.float64,
}
# FP8 KV cache formats (`Workload.kv_dtype`) and the torch dtype each is stored in
KV_DTYPES: dict[str, torch.dtype] = {"fp8": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}
KV_DTYPE_ALIASES = {"fp8_e4m3": "fp8", "e4m3": "fp8", "float8_e4m3fn": "fp8", "e5m2": "fp8_e5m2",
                    "float8_e5m2": "fp8_e5m2"}
# FP8 attention (`--dtype fp8`): e4m3 q, k, v, with these activations (before quantization) and output
FP8_ATTENTION: dict[str, torch.dtype] = {"fp8": torch.float8_e4m3fn}
FP8_ACTIVATIONS = torch.bfloat16
DTYPE_ALIASES = {"float32": "fp32", "float": "fp32", "float16": "fp16", "half": "fp16", "bfloat16": "bf16",
                 "float64": "fp64", "double": "fp64", "e4m3": "fp8", "fp8_e4m3": "fp8", "float8_e4m3fn": "fp8"}


def dtype_name(name: str) -> str:
    """Canonical dtype name (`bf16`, `fp16`, `fp32`, `fp64`, `fp8`) or a UsageError listing the valid ones."""
    key = DTYPE_ALIASES.get(name.lower(), name.lower())
    if key not in DTYPES and key not in FP8_ATTENTION:
        raise UsageError(f"unknown dtype {name!r}; choose one of {', '.join([*DTYPES, *FP8_ATTENTION])} "
                         "(fp8: e4m3 attention)")
    return key


def model_dtype_name(name: str) -> str:
    """A model's weights dtype: `dtype_name` without fp8 (FP8 attention is a workload's, not a model's, dtype)."""
    key = dtype_name(name)
    if key in FP8_ATTENTION:
        raise UsageError("--dtype fp8 is FP8 attention on a workload (stages, bench, verify, audit --dtypes); a "
                         "model's weights take bf16, fp16 or fp32 (an FP8 KV cache: --kv-dtype fp8)")
    return key


def kv_dtype_name(name: str | None) -> str | None:
    """Canonical FP8 KV-cache format (`fp8` = e4m3, `fp8_e5m2`), None for none, or a UsageError."""
    if name in (None, "", "none"):
        return None
    key = KV_DTYPE_ALIASES.get(name.lower(), name.lower())
    if key not in KV_DTYPES:
        raise UsageError(f"unknown KV-cache dtype {name!r}; choose one of {', '.join(KV_DTYPES)} (e4m3, e5m2)")
    return key


def resolve_device(name: str | None) -> str:
    """`None`/`auto` → the best local device; an explicit device must exist here."""
    if name in (None, "", "auto"):
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise UsageError(f"--device {name} asked for CUDA, but this machine has no CUDA device "
                             f"(torch {torch.__version__}); use --device cpu")
        index = int(name.split(":")[1]) if ":" in name else 0
        if index >= torch.cuda.device_count():
            raise UsageError(f"--device {name}: only {torch.cuda.device_count()} CUDA device(s) here")
        return name
    if name == "cpu":
        return "cpu"
    raise UsageError(f"unknown device {name!r}; use cpu, cuda or cuda:N")


@dataclass(frozen=True)
class Fp8KV:
    """An FP8 KV cache as stored: k/v `[B, Hkv, Sk, D]` in an FP8 dtype holding x / descale, descales fp32
    `[B, Hkv]`, and (a workload's) the keys/values before quantization, for the lossy factor. `fmt` set: k/v are
    that FP8 format's bytes as uint8 (a static cache's storage inside a compiled step, viewed as `fmt` by the op
    that reads it: `models.kernel_cache`)."""

    k: torch.Tensor
    v: torch.Tensor
    k_descale: torch.Tensor
    v_descale: torch.Tensor
    k_orig: torch.Tensor | None = None
    v_orig: torch.Tensor | None = None
    fmt: torch.dtype | None = None


def fp8_descale(x: torch.Tensor, fmt: torch.dtype, headroom: float = 1.0) -> torch.Tensor:
    """fp32 `[B, H]` descales of x `[B, H, S, D]` for an FP8 cache: per (batch, head) the power of two that puts
    headroom × its largest |x| at or below the format's largest value (so x8 · descale is exact in fp16/bf16/fp32;
    `headroom` > 1 leaves room for later tokens, which saturate past it)."""
    amax = x.abs().amax(dim=(2, 3)).float().clamp_min(1e-30)
    return torch.exp2(torch.ceil(torch.log2(headroom * amax / torch.finfo(fmt).max)))


def fp8_quantize(x: torch.Tensor, descale: torch.Tensor, fmt: torch.dtype) -> torch.Tensor:
    """x `[B, H, S, D]` / descale `[B, H]`, saturated at the format's largest value, in the FP8 format."""
    top = torch.finfo(fmt).max
    return (x.float() / descale[:, :, None, None]).clamp(-top, top).to(fmt)


def fp8_dequantize(x8: torch.Tensor, descale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x8 `[B, H, S, D]` · descale `[B, H]` in `dtype` (exact for power-of-two descales)."""
    return (x8.float() * descale[:, :, None, None]).to(dtype)


def quantize_kv(x: torch.Tensor, fmt: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x `[B, H, S, D]` as an FP8 cache: (x8, descale `[B, H]` fp32, x8 · descale in x's dtype), `fp8_descale`
    without headroom (the whole cache is known)."""
    descale = fp8_descale(x, fmt)
    x8 = fp8_quantize(x, descale, fmt)
    return x8, descale, fp8_dequantize(x8, descale, x.dtype)


@dataclass(frozen=True)
class Fp8QKV:
    """FP8 attention's inputs (`Workload.dtype == "fp8"`): fp32 descales `[B, Hkv]` for q (one per kv-head group), k
    and v, and q/k/v before quantization (for the lossy factor). `Inputs.q`/`k`/`v` hold the dequantised values."""

    q_descale: torch.Tensor
    k_descale: torch.Tensor
    v_descale: torch.Tensor
    q_orig: torch.Tensor
    k_orig: torch.Tensor
    v_orig: torch.Tensor
    fmt: torch.dtype = torch.float8_e4m3fn

    def q_descale_per_head(self, hq: int) -> torch.Tensor:
        """The query descale `[B, Hq]`: each query head takes its kv head's."""
        return self.q_descale.repeat_interleave(hq // self.q_descale.shape[1], dim=1)


def quantize_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, fmt: torch.dtype
                 ) -> tuple[Fp8QKV, torch.Tensor, torch.Tensor, torch.Tensor]:
    """q `[B, Hq, Sq, D]`, k/v `[B, Hkv, Sk, D]` as FP8 attention's inputs: (the descales and originals, then q, k,
    v dequantised in their own dtype). The query's descale is per kv-head group, as FlashAttention-3 takes it."""
    b, hq, sq, d = q.shape
    hkv = k.shape[1]
    grouped = q.reshape(b, hkv, (hq // hkv) * sq, d)  # a kv head's query heads as one row block
    qd = fp8_descale(grouped, fmt)
    (_, kd, k_deq), (_, vd, v_deq) = (quantize_kv(x, fmt) for x in (k, v))
    qkv = Fp8QKV(qd, kd, vd, q, k, v, fmt)
    q_heads = qkv.q_descale_per_head(hq)
    q_deq = fp8_dequantize(fp8_quantize(q, q_heads, fmt), q_heads, q.dtype)
    return qkv, q_deq, k_deq, v_deq


@dataclass(frozen=True)
class Inputs:
    """Tensors for one attention call. q `[B, Hq, Sq, D]`, k/v `[B, Hkv, Sk, D]`.

    `attn_mask` is None or `[B, 1, Sq, Sk]` (bool: True = attend; float: additive, 0 or -inf) and, when present,
    already contains the causal rule, so `causal` is then False for the call. `valid` is the boolean `[B, 1, Sq, Sk]`
    form of the same rule, kept for checks (None when there is no mask and no causal flag).
    """

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    causal: bool
    scale: float
    attn_mask: torch.Tensor | None = None
    valid: torch.Tensor | None = None
    fp8: Fp8KV | None = None  # an FP8 KV cache (`Workload.kv_dtype`): k/v above are its dequantised values
    fp8_qkv: Fp8QKV | None = None  # FP8 attention (`Workload.dtype == "fp8"`): q/k/v above are dequantised

    def keep(self) -> torch.Tensor | None:
        """Boolean `[B, 1, Sq, Sk]` of the keys each query sees: `valid`, else a boolean `attn_mask`, else None."""
        if self.valid is None and self.attn_mask is not None and self.attn_mask.dtype == torch.bool:
            return self.attn_mask
        return self.valid

    def unquantized(self) -> Inputs:
        """These inputs before FP8 quantization: the keys/values of an FP8 cache, or q, k, v of FP8 attention
        (itself when nothing was quantized)."""
        if self.fp8 is not None:
            return dataclasses.replace(self, k=self.fp8.k_orig, v=self.fp8.v_orig, fp8=None)
        if self.fp8_qkv is not None:
            c = self.fp8_qkv
            return dataclasses.replace(self, q=c.q_orig, k=c.k_orig, v=c.v_orig, fp8_qkv=None)
        return self


@dataclass(frozen=True)
class Workload:
    batch: int = 2
    heads: int = 8
    kv_heads: int | None = None
    seq: int = 256
    kv_seq: int | None = None
    head_dim: int = 64
    dtype: str = "fp32"
    causal: bool = True
    mask: MaskKind = "none"
    device: str = "cpu"
    # Non-contiguous inputs: q/k/v made as [B, S, H, D] and transposed to [B, H, S, D] views (as in most models).
    transposed: bool = False
    kv_dtype: str | None = None  # "fp8" (e4m3) / "fp8_e5m2": the keys and values as an FP8 KV cache (see above)

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", dtype_name(self.dtype))
        object.__setattr__(self, "kv_dtype", kv_dtype_name(self.kv_dtype))
        if self.kv_dtype and self.dtype == "fp64":
            raise UsageError("an FP8 KV cache takes fp16, bf16 or fp32 queries, not fp64")
        if self.kv_dtype and self.dtype in FP8_ATTENTION:
            raise UsageError("--dtype fp8 already quantizes the keys and values to e4m3; --kv-dtype is for an FP8 "
                             "cache under 16-bit queries")
        if self.kv_heads is None:
            object.__setattr__(self, "kv_heads", self.heads)
        if self.kv_seq is None:
            object.__setattr__(self, "kv_seq", self.seq)
        for field in ("batch", "heads", "kv_heads", "seq", "kv_seq", "head_dim"):
            value = getattr(self, field)
            if not isinstance(value, int) or value <= 0:
                raise UsageError(f"{field.replace('_', '-')} must be a positive integer, got {value!r}")
        if self.heads % self.kv_heads:
            raise UsageError(f"heads ({self.heads}) must be divisible by kv-heads ({self.kv_heads}) for GQA")
        if self.mask not in MASK_KINDS:
            raise UsageError(f"unknown mask kind {self.mask!r}; choose one of {', '.join(MASK_KINDS)}")

    # -- derived -------------------------------------------------------------------------------------------------
    @property
    def torch_dtype(self) -> torch.dtype:
        """The dtype of the tensors a variant gets and returns: FP8 attention's activations are bf16."""
        return DTYPES.get(self.dtype, FP8_ACTIVATIONS)

    @property
    def fp8_attention(self) -> torch.dtype | None:
        """The FP8 format q, k and v are quantized to (`dtype="fp8"`), else None."""
        return FP8_ATTENTION.get(self.dtype)

    @property
    def gqa(self) -> bool:
        return self.kv_heads != self.heads

    @property
    def scale(self) -> float:
        return self.head_dim ** -0.5

    def label(self) -> str:
        """Short human label: `2x8x256x64 fp32 causal` (B×Hq[/Hkv]×Sq[→Sk]×D)."""
        heads = f"{self.heads}/{self.kv_heads}" if self.gqa else f"{self.heads}"
        seq = f"{self.seq}→{self.kv_seq}" if self.kv_seq != self.seq else f"{self.seq}"
        parts = [f"{self.batch}x{heads}x{seq}x{self.head_dim}", self.dtype, "causal" if self.causal else "full"]
        if self.mask != "none":
            parts.append(f"mask={self.mask}")
        if self.transposed:
            parts.append("strided")
        if self.kv_dtype:
            parts.append(f"kv={self.kv_dtype}")
        return " ".join(parts)

    def replace(self, **changes) -> Workload:
        return dataclasses.replace(self, **changes)

    def to_json(self) -> dict:
        return {"batch": self.batch, "heads": self.heads, "kv_heads": self.kv_heads, "seq": self.seq,
                "kv_seq": self.kv_seq, "head_dim": self.head_dim, "dtype": self.dtype, "causal": self.causal,
                "mask": self.mask, "device": self.device, "layout": "bhsd", "transposed": self.transposed,
                **({"kv_dtype": self.kv_dtype} if self.kv_dtype else {})}

    def input_bytes(self) -> int:
        """Bytes of q, k, v and the output: the least any implementation must move (FP8 attention: q, k, v one
        byte per element, the bf16 output two; an FP8 cache: one byte per key/value element)."""
        elem = torch.empty((), dtype=self.torch_dtype).element_size()
        q_o = self.batch * self.heads * self.seq * self.head_dim
        kv = 2 * self.batch * self.kv_heads * self.kv_seq * self.head_dim
        if self.fp8_attention:
            return q_o * (1 + elem) + kv
        return 2 * q_o * elem + kv * (1 if self.kv_dtype else elem)

    # -- masks ---------------------------------------------------------------------------------------------------
    def valid_lengths(self) -> list[int]:
        """Per-batch count of real (unpadded) keys for the padding masks: full, 3/4, 1/2, 1/4, … of Sk, >= 1."""
        fractions = (1.0, 0.75, 0.5, 0.25)
        return [max(1, int(self.kv_seq * fractions[b % len(fractions)])) for b in range(self.batch)]

    def valid_mask(self, device: str | torch.device = "cpu") -> torch.Tensor | None:
        """Boolean `[B, 1, Sq, Sk]` (True = attend) for causal + padding, or None when every key is visible."""
        if not self.causal and self.mask == "none":
            return None
        sq, sk = self.seq, self.kv_seq
        keep = torch.ones(self.batch, 1, sq, sk, dtype=torch.bool, device=device)
        if self.causal:
            # bottom-right aligned: query i sees key j when j <= i + (Sk - Sq)
            keep &= torch.ones(sq, sk, dtype=torch.bool, device=device).tril(diagonal=sk - sq)
        if self.mask in ("pad-right", "pad-left", "bool", "additive"):
            lengths = torch.tensor(self.valid_lengths(), device=device)
            pos = torch.arange(sk, device=device)
            if self.mask == "pad-left":
                key_ok = pos[None, :] >= (sk - lengths)[:, None]  # (B, Sk): real tokens at the right end
            else:
                key_ok = pos[None, :] < lengths[:, None]  # (B, Sk): real tokens at the left end
            if self.mask in ("bool", "additive"):
                key_ok = torch.ones_like(key_ok)  # plain masks: causal only, but passed as a tensor
            keep &= key_ok[:, None, None, :]
        return keep

    # -- inputs --------------------------------------------------------------------------------------------------
    def make_inputs(self, seed: int = 0) -> Inputs:
        """Random normal q, k, v (never zeros: zeros hide unwritten outputs) with the workload's mask."""
        gen = torch.Generator(device="cpu").manual_seed(seed)
        b, hq, hkv, sq, sk, d = self.batch, self.heads, self.kv_heads, self.seq, self.kv_seq, self.head_dim

        def draw(h: int, s: int) -> torch.Tensor:
            if self.transposed:
                x = torch.randn(b, s, h, d, generator=gen)  # (B, S, H, D)
                x = x.to(self.device, self.torch_dtype)
                return x.transpose(1, 2)  # (B, H, S, D) view with the heads stride innermost-but-one
            return torch.randn(b, h, s, d, generator=gen).to(self.device, self.torch_dtype)

        q, k, v = draw(hq, sq), draw(hkv, sk), draw(hkv, sk)
        valid = self.valid_mask(self.device)
        attn_mask = None
        if self.mask != "none":
            attn_mask = valid
            if self.mask == "additive":
                attn_mask = torch.zeros(valid.shape, dtype=self.torch_dtype, device=self.device)
                attn_mask.masked_fill_(~valid, float("-inf"))
        fp8 = None
        if self.kv_dtype:
            (k8, kd, k_deq), (v8, vd, v_deq) = (quantize_kv(x, KV_DTYPES[self.kv_dtype]) for x in (k, v))
            fp8, k, v = Fp8KV(k8, v8, kd, vd, k, v), k_deq, v_deq
        fp8_qkv = None
        if self.fp8_attention:
            fp8_qkv, q, k, v = quantize_qkv(q, k, v, self.fp8_attention)
        if self.transposed and (fp8 or fp8_qkv):  # the dequantised values in the workload's [B, S, H, D] storage
            q, k, v = (x.transpose(1, 2).contiguous().transpose(1, 2) for x in (q, k, v))
        return Inputs(q=q, k=k, v=v, causal=self.causal and attn_mask is None, scale=self.scale,
                      attn_mask=attn_mask, valid=valid, fp8=fp8, fp8_qkv=fp8_qkv)


def check_runs_here(w: Workload) -> None:
    """UsageError when this device cannot compute in the workload's dtype (bf16 on an old GPU, fp16 on some CPUs)."""
    if w.device.startswith("cuda") and w.dtype in ("bf16", "fp8") and not torch.cuda.is_bf16_supported():
        raise UsageError(f"{w.device} ({torch.cuda.get_device_name()}) cannot run bf16; use --dtype fp16")
    if w.device == "cpu" and w.dtype == "fp16" and not _cpu_half_matmul_ok():
        raise UsageError("this CPU build of torch cannot multiply fp16 matrices; use --dtype fp32 or bf16")


def _cpu_half_matmul_ok() -> bool:
    try:
        torch.ones(2, 2, dtype=torch.float16) @ torch.ones(2, 2, dtype=torch.float16)
    except RuntimeError:
        return False
    return True


def default_workload(device: str) -> tuple[Workload, str]:
    """The default workload for a device, and the sentence that says why it was chosen."""
    if device.startswith("cuda"):
        return (Workload(batch=8, heads=16, seq=1024, head_dim=64, dtype="bf16", causal=True, device=device),
                "default for CUDA: the tutorial's 8x16x1024x64 bf16 causal")
    return (Workload(batch=2, heads=8, seq=512, head_dim=64, dtype="fp32", causal=True, device=device),
            "default for CPU: 2x8x512x64 fp32 causal, smaller than the tutorial's 8x16x1024x64 bf16 "
            "so it finishes in seconds (the CPU has no fast bf16 matmul)")
