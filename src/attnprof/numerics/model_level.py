"""Model-level verification: does swapping the attention implementation move a real model's outputs?

A transformers decoder from a config preset (random weights from a fixed seed, nothing downloaded) runs a
left-padded batch, the case where implementations most often disagree, once per attention implementation and
dtype. Each run is compared with the eager fp32 run on the valid (unpadded) positions only:

- max |Δ logits|, the mean and max KL(p_eager32 ‖ p_impl) over positions, top-1 agreement,
- greedy decoding of N tokens from the same prompts: the length of the prefix identical to eager fp32's.

The pass rule mirrors the kernel gate: each metric may be k × that of eager in the same dtype (the same
transformers model, only `attn_implementation` differs), with a floor per dtype. Top-1 agreement is judged only
at *decisive* positions: those where eager fp32's top-2 logit margin exceeds twice the max |Δ logits| the gate
allows (`decisive_margin`). An implementation within the allowed error cannot swap the top two there, while a
random model has near-ties that the rounding of any half-precision run flips (eager's own included): counting
those made the exit code of a correct implementation depend on the seed. Greedy prefixes gate only in
fp32 by default (half-precision rounding flips near-tied tokens of a random model for every implementation,
eager included); `min_prefix` makes them gate everywhere.

With an FP8 KV cache (`kv_dtype`, `models.fp8_cache.Fp8Cache`: every key and value stored in e4m3/e5m2 and read
dequantised, exactly, by every implementation), each implementation runs once more with it, named `impl (kv fp8)`,
judged by the same rule against eager fp32 over the same FP8 cache, with eager over it in the same dtype as the
baseline: a wrong cache or descale fails there. What the cache costs the model is its own block (`fp8_cost`, per
dtype): eager over the FP8 cache against eager over the 16-bit cache (max |Δ logits|, mean KL, top-1 at decisive
positions, the greedy prefix), measured, not gated.

An implementation that raises is `error` (a failure, with its reason; flex failing to compile included); it is
`rejected` only when it was refused before running: a pinned SDPA backend refusing the inputs ("No available
kernel"), the model class refusing the implementation (transformers' words, `models.features.switch`: Gemma 2 and
gpt-oss refuse SDPA in transformers 5.24), or a variant asked for an argument it cannot take (softcap, a sliding
window, sinks; `models.features.refuse_not_taken`). A flex run after dynamo hit its
recompile limit for flex attention (it then runs new shapes eagerly) is named `flex_attention (unfused)`.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from attnprof.errors import UsageError, first_line
from attnprof.models.attention import AttentionImpl
from attnprof.models.features import forward_refusal, switch
from attnprof.numerics.cannot_run import compile_cause
from attnprof.run import recompile_limit_hits, unfused_since
from attnprof.workload import DTYPES

# (max |Δ logits|, mean KL, top-1 disagreement) floors per dtype.
MODEL_FLOORS: dict[str, tuple[float, float, float]] = {
    "fp64": (1e-9, 1e-12, 0.0),
    "fp32": (1e-4, 1e-8, 0.0),
    "fp16": (5e-4, 1e-7, 0.02),
    "bf16": (4e-3, 1e-6, 0.02),
}


@dataclass(frozen=True)
class ModelRule:
    k: float = 2.0
    floors: dict[str, tuple[float, float, float]] = field(default_factory=lambda: dict(MODEL_FLOORS))
    min_prefix: int | None = None  # None: all N tokens in fp32/fp64, not gated in half precision

    def to_json(self) -> dict:
        return {"k": self.k, "floors": self.floors, "min_prefix": self.min_prefix,
                "baseline": "eager attention in the same dtype, against eager fp32",
                "top1": "at decisive positions: eager fp32's top-2 logit margin > 2 × the allowed max |Δ logits|"}


@dataclass(frozen=True)
class LogitsAgreement:
    max_abs: float
    kl_mean: float
    kl_max: float
    top1: float
    positions: int
    top1_decisive: float  # top-1 agreement at the positions where eager fp32's top-2 margin exceeds `margin`
    decisive: int  # how many positions those are
    margin: float  # the top-2 logit margin that makes a position decisive (`decisive_margin`)
    nan: int
    prefix_min: int
    prefix_mean: float
    tokens: int

    def to_json(self) -> dict:
        return dict(self.__dict__)


@dataclass(frozen=True)
class ModelResult:
    impl: str
    dtype: str
    status: str  # pass | fail | rejected | error | baseline
    reason: str | None = None
    agreement: LogitsAgreement | None = None

    def to_json(self) -> dict:
        return {"impl": self.impl, "dtype": self.dtype, "status": self.status, "reason": self.reason,
                "agreement": self.agreement.to_json() if self.agreement else None}


def _cache_kw(model, kv_dtype: str | None) -> dict:
    """`{<the model's cache argument>: a fresh Fp8Cache}` with an FP8 KV cache, else {} (transformers' default)."""
    if kv_dtype is None:
        return {}
    from attnprof.models.fp8_cache import Fp8Cache, cache_argument

    return {cache_argument(model): Fp8Cache(kv_dtype), "use_cache": True}


def _forward(model, ids, mask, kv_dtype: str | None = None) -> torch.Tensor:
    position_ids = (mask.long().cumsum(-1) - 1).clamp(min=0)  # left padding: real tokens count from 0
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask, position_ids=position_ids,
                     **_cache_kw(model, kv_dtype)).logits.float()  # (B, S, V)


def _greedy(model, ids, mask, n: int, kv_dtype: str | None = None) -> torch.Tensor:
    kw = {k: v for k, v in _cache_kw(model, kv_dtype).items() if k != "use_cache"}
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n,
                             do_sample=False, pad_token_id=0, **kw)
    return out[:, ids.shape[1]:]  # (B, N)


def decisive_margin(base_max_abs: float, dtype: str, rule: ModelRule) -> float:
    """The top-2 logit margin of eager fp32 above which a position is decisive: twice the largest |Δ logits| the
    gate allows in `dtype` (k × eager's own in that dtype, at least the floor). Swapping the top two logits of a
    position moves their difference by more than the margin, which needs one of them to move by more than half of
    it: beyond the allowed error."""
    f_abs = rule.floors.get(dtype, MODEL_FLOORS["fp32"])[0]
    return 2.0 * max(rule.k * base_max_abs, f_abs)


def agreement(logits: torch.Tensor, ref: torch.Tensor, valid: torch.Tensor, tokens: torch.Tensor,
              ref_tokens: torch.Tensor, margin: float = 0.0) -> LogitsAgreement:
    """logits/ref `[B, S, V]`, valid bool `[B, S]`, tokens `[B, N]`; `margin` picks the decisive positions."""
    a, r = logits[valid].double(), ref[valid].double()  # (P, V)
    top2 = r.topk(2, dim=-1).values  # (P, 2)
    decisive = (top2[:, 0] - top2[:, 1]) > margin  # (P,)
    hit = a.argmax(-1) == r.argmax(-1)  # (P,)
    nan = int((~a.isfinite()).sum())
    logp_r, logp_a = torch.log_softmax(r, -1), torch.log_softmax(a, -1)
    kl = (logp_r.exp() * (logp_r - logp_a)).sum(-1)  # (P,)
    same = tokens == ref_tokens  # (B, N)
    prefix = torch.where(same.all(-1), same.shape[1], (~same).int().argmax(-1))  # first mismatch per row
    return LogitsAgreement(
        max_abs=float((a - r).abs().max()) if nan == 0 else math.inf,
        kl_mean=float(kl.mean()) if nan == 0 else math.inf, kl_max=float(kl.max()) if nan == 0 else math.inf,
        top1=float(hit.double().mean()), positions=int(valid.sum()), nan=nan,
        top1_decisive=float(hit[decisive].double().mean()) if decisive.any() else 1.0,
        decisive=int(decisive.sum()), margin=margin,
        prefix_min=int(prefix.min()), prefix_mean=float(prefix.double().mean()), tokens=int(same.shape[1]))


def judge(a: LogitsAgreement, base: LogitsAgreement, dtype: str, rule: ModelRule) -> list[str]:
    """Reasons the implementation fails, empty when it passes."""
    if a.nan:
        return [f"{a.nan} NaN/Inf logits at valid positions (padding rows leaking NaN into real tokens?)"]
    f_abs, f_kl, f_dis = rule.floors.get(dtype, MODEL_FLOORS["fp32"])
    reasons = []
    lim = max(rule.k * base.max_abs, f_abs)
    if a.max_abs > lim:
        reasons.append(f"max |Δ logits| {a.max_abs:.3e} > {lim:.3e} (eager {dtype}: {base.max_abs:.2e})")
    lim = max(rule.k * base.kl_mean, f_kl)
    if a.kl_mean > lim:
        reasons.append(f"mean KL {a.kl_mean:.3e} > {lim:.3e} (eager {dtype}: {base.kl_mean:.2e})")
    lim = max(rule.k * (1 - base.top1_decisive), f_dis)
    if 1 - a.top1_decisive > lim + 1e-12:
        reasons.append(f"top-1 agreement {100 * a.top1_decisive:.1f}% at {a.decisive} decisive positions < "
                       f"{100 * (1 - lim):.1f}% (eager {dtype}: {100 * base.top1_decisive:.1f}%; decisive: eager "
                       f"fp32's top-2 margin > {a.margin:.2e})")
    need = rule.min_prefix if rule.min_prefix is not None else (a.tokens if dtype in ("fp32", "fp64") else 0)
    if a.prefix_min < need:
        reasons.append(f"greedy decoding diverges from eager fp32 after {a.prefix_min} of {a.tokens} tokens "
                       f"(need {need}; eager {dtype}: {base.prefix_min})")
    return reasons


def verify_model(preset: str, impls: Callable[[str, object], Sequence[AttentionImpl]], dtypes: Sequence[str], *,
                 device: str, seed: int, batch: int = 4, seq: int = 32, decode_tokens: int = 8,
                 rule: ModelRule = ModelRule(), on_step: Callable[[str], None] | None = None,
                 kv_dtype: str | None = None) -> dict:
    """Run every implementation (from `impls(dtype, config)`) in every dtype; see the module docstring."""
    from attnprof.models import build_model, padded_batch

    ref_model = build_model(preset, attn_implementation="eager", dtype="fp32", device=device, seed=seed)
    ids, mask = padded_batch(ref_model.config, batch=batch, seq=seq, seed=seed, device=device, side="left")
    valid = mask.bool()
    ref_logits = _forward(ref_model, ids, mask)
    ref_tokens = _greedy(ref_model, ids, mask, decode_tokens)
    fp8_ref = (_forward(ref_model, ids, mask, kv_dtype), _greedy(ref_model, ids, mask, decode_tokens, kv_dtype)) \
        if kv_dtype else None
    results: list[ModelResult] = []
    costs: dict[str, dict] = {}
    for dtype in dtypes:
        model = ref_model if dtype == "fp32" else copy.deepcopy(ref_model).to(DTYPES[dtype])
        if on_step:
            on_step(f"eager {dtype}")
        base_logits, base_tokens = _forward(model, ids, mask), _greedy(model, ids, mask, decode_tokens)
        base = _baseline(base_logits, base_tokens, ref_logits, ref_tokens, valid, dtype, rule)
        results.append(ModelResult("eager", dtype, "baseline", agreement=base))
        listed = impls(dtype, ref_model.config)
        for impl in listed:
            if impl.name == "eager":
                continue
            if on_step:
                on_step(f"{impl.name} {dtype}")
            results.append(_run_impl(model, impl, dtype, ids, mask, valid, ref_logits, ref_tokens, base, rule,
                                     decode_tokens))
        if fp8_ref is not None:
            if on_step:
                on_step(f"eager {dtype}, {kv_dtype} KV cache")
            eager8 = fp8_ref if model is ref_model else (_forward(model, ids, mask, kv_dtype),
                                                         _greedy(model, ids, mask, decode_tokens, kv_dtype))
            results += _fp8_runs(model, listed, dtype, kv_dtype, ids, mask, valid, fp8_ref, eager8, rule,
                                 decode_tokens, on_step)
            # what the cache costs the model in this dtype: eager over it against eager over the unquantized cache
            cost = agreement(eager8[0], base_logits, valid, eager8[1], base_tokens,
                             margin=decisive_margin(0.0, dtype, rule))
            costs[dtype] = {"against": f"eager {dtype}, unquantized KV cache", **cost.to_json()}
        model.set_attn_implementation("eager")
        if model is not ref_model:
            del model
            if device.startswith("cuda"):
                torch.cuda.empty_cache()
    return {"preset": preset, "batch": batch, "seq": seq, "padding": "left", "valid_positions": int(valid.sum()),
            "decode_tokens": decode_tokens, "config": _config_summary(ref_model.config), "kv_dtype": kv_dtype,
            "fp8_cost": costs or None, "results": [r.to_json() for r in results], "_results": results}


def _baseline(logits, tokens, ref_logits, ref_tokens, valid, dtype: str, rule: ModelRule) -> LogitsAgreement:
    """Eager's agreement in `dtype` with the reference, its decisive positions set by its own max |Δ logits|."""
    a = agreement(logits, ref_logits, valid, tokens, ref_tokens)
    return agreement(logits, ref_logits, valid, tokens, ref_tokens, margin=decisive_margin(a.max_abs, dtype, rule))


def _fp8_runs(model, impls, dtype, kv_dtype, ids, mask, valid, fp8_ref, eager8, rule, n, on_step) -> list[ModelResult]:
    """Eager over the FP8 cache in `dtype` (`eager8`: its logits and greedy tokens; the baseline row), then each
    implementation over it, judged against eager fp32 over the same cache (`fp8_ref`)."""
    ref_logits, ref_tokens = fp8_ref
    base = _baseline(*eager8, ref_logits, ref_tokens, valid, dtype, rule)
    rows = [ModelResult(f"eager (kv {kv_dtype})", dtype, "baseline", agreement=base)]
    for impl in impls:
        if impl.name == "eager":
            continue
        if on_step:
            on_step(f"{impl.name} {dtype}, {kv_dtype} KV cache")
        r = _run_impl(model, impl, dtype, ids, mask, valid, ref_logits, ref_tokens, base, rule, n, kv_dtype)
        rows.append(dataclasses.replace(r, impl=f"{r.impl} (kv {kv_dtype})"))
    return rows


def _run_impl(model, impl, dtype, ids, mask, valid, ref_logits, ref_tokens, base, rule, n,
              kv_dtype: str | None = None) -> ModelResult:
    if impl.rejected:
        return ModelResult(impl.name, dtype, "rejected", reason=impl.rejected)
    name, unfused = impl.name, None
    try:
        refused = switch(model, impl.attn_implementation)  # the model class refusing it: transformers' words
        if refused is not None:
            return ModelResult(impl.name, dtype, "rejected", reason=f"{impl.name}: {refused}")
        with impl.context(), recompile_limit_hits():
            logits = _forward(model, ids, mask, kv_dtype)
            tokens = _greedy(model, ids, mask, n, kv_dtype)
        if "flex" in impl.name and unfused_since("flex") is not None:
            name, unfused = f"{impl.name} (unfused)", (
                "unfused: dynamo hit its recompile limit for flex attention in this process, so shapes it had not "
                f"compiled before ran eagerly ({unfused_since('flex')})")
    except UsageError:
        raise
    except Exception as exc:  # noqa: BLE001 - the implementation's failure is its row, with its reason
        text = first_line(exc, typed=False)
        # a pinned SDPA backend refusing the inputs in its own words ("No available kernel") is PyTorch's dispatcher
        # refusing before anything ran: a refusal. Anything else that raised (flex failing to compile included) is a
        # crash: `error`, a failure with its reason (a crash is never `rejected`).
        refused = impl.name.startswith("sdpa-") and "No available kernel" in text
        said = forward_refusal(exc)  # transformers' attention integration refusing the call: a refusal too
        if said is not None:
            return ModelResult(impl.name, dtype, "rejected", reason=f"{impl.name}: {said}")
        status = "rejected" if refused else "error"
        cause = compile_cause(exc)  # inductor's "C++ compile error" names no cause: the compiler's first error does
        said = f"{impl.name}: {first_line(exc)}"
        said = (said if len(said) <= 240 else said[:239] + "…") + (f": {cause}" if cause else "")
        return ModelResult(impl.name, dtype, status, reason=said[:480])
    finally:
        model.set_attn_implementation("eager")
    a = agreement(logits, ref_logits, valid, tokens, ref_tokens, margin=base.margin)
    reasons = judge(a, base, dtype, rule) + ([unfused] if unfused else [])
    status = "fail" if len(reasons) > (1 if unfused else 0) else "pass"
    return ModelResult(name, dtype, status, reason="; ".join(reasons) or None, agreement=a)


def _config_summary(config) -> dict:
    keys = ("model_type", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
            "vocab_size")
    return {k: getattr(config, k, None) for k in keys}
