"""Real model families: what transformers refuses, and what a model asks of attention that a variant cannot give.

Two kinds of "no", both a `rejected` row with the reason, never a traceback and never a silent fallback:

- **transformers refuses an implementation for a model class.** Gemma 2 and gpt-oss refuse SDPA in transformers
  5.24 (`_sdpa_can_dispatch` raises ValueError; 5.17 let Gemma 2 run SDPA), a missing package is an ImportError.
  transformers raises these (`REFUSALS`) while a model is built with, or switched to, an `attn_implementation`.
  `build()` and `switch()` turn exactly those into the reason in transformers' words (its first sentence); a class
  that cannot switch at all (transformers only logs a warning and keeps the old implementation) is refused too.
- **the model's attention calls carry arguments a registry `Variant` has no place for** (`models.attention`'s
  `_NOT_TAKEN`: sliding_window, softcap, s_aux). `not_taken(config)` reads them from the config, the way the
  modeling code passes them: `attn_logit_softcapping`; `sliding_window` on the layers `layer_types` marks
  "sliding_attention" (every layer when the config has no `layer_types`, as Mistral and Phi-3); the learned sinks of
  the families whose attention passes `s_aux`. `refuse_not_taken(impls, config)` refuses the variant-backed
  implementations (the kernel, `package.module:function`) up front instead of a ValueError mid-forward, except for
  the features their adapter passes on (`models.attention.takes`: the kernel whose repo lists them in
  `MODEL_FEATURES`, as flash-triton does, gets softcap, sliding windows and sinks).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator

from attnprof.errors import first_line

REFUSALS = (ValueError, ImportError)  # what transformers raises when a model refuses an attn_implementation
# model types whose attention passes learned sinks (`s_aux=`) on every layer (transformers 5.17 to 5.24)
SINK_FAMILIES = ("gpt_oss", "granite_swa", "granitemoe_swa", "mimo_v2_flash", "deepseek_v4", "hy_v4", "hy_v4_vl",
                 "flint", "openai_privacy_filter")


def said(exc: BaseException) -> str:
    """transformers' refusal in its own words: the first sentence of its message (the rest is a link and advice)."""
    import transformers

    text = first_line(exc, typed=False)
    head, dot, _ = text.partition(". ")
    return f"transformers {transformers.__version__}: {head}{dot.strip()}"


def switch(model, name: str) -> str | None:
    """Put `model` on `name`; None when it runs `name` now, else why not (transformers' words, or `sdpa_gap`)."""
    try:
        model.set_attn_implementation(name)
    except REFUSALS as exc:
        return said(exc)
    now = model.config._attn_implementation
    if now != name:  # transformers logged a warning and kept the old one
        return (f"{type(model).__name__} cannot switch its attention implementation (it does not call attention "
                f"through transformers' AttentionInterface); it kept {now!r}")
    gap = sdpa_gap(model.config, name)
    if gap is not None:
        model.set_attn_implementation("eager")
    return gap


def sdpa_gap(config, name: str) -> str | None:
    """SDPA has no softcap argument: transformers 5.24 refuses a softcapped call on its first forward, 5.17 runs it
    without the softcap (Gemma 2 accepted SDPA there). Either way the model is not what runs: refused up front."""
    cap = getattr(config, "attn_logit_softcapping", None)
    if not cap or name.rpartition("|")[2] != "sdpa":
        return None
    return (f"SDPA has no softcap argument and this model's attention asks for attn_logit_softcapping={cap:g} "
            "(transformers 5.17 drops it under SDPA, 5.24 refuses it)")


@contextlib.contextmanager
def refusal_on_forward() -> Iterator[list[str]]:
    """While open, transformers' attention integration refusing a call (`forward_refusal`) ends the block and its
    words are appended to the list the block gets; anything else that raises goes on."""
    words: list[str] = []
    try:
        yield words
    except REFUSALS as exc:
        text = forward_refusal(exc)
        if text is None:
            raise
        words.append(text)


def forward_refusal(exc: BaseException) -> str | None:
    """transformers' words when `exc` is its attention integration refusing a call on the first forward (a
    ValueError/ImportError raised inside `transformers/integrations/*attention*` or its flash utilities, such as
    "`sdpa` attention does not support `softcap`"), else None: anything else that raised is a crash, not a refusal."""
    if not isinstance(exc, REFUSALS) or exc.__traceback__ is None:
        return None
    import traceback

    where = traceback.extract_tb(exc.__traceback__)[-1].filename.replace("\\", "/")
    if "/transformers/" in where and ("/integrations/" in where and "attention" in where
                                       or where.endswith("modeling_flash_attention_utils.py")):
        return said(exc)
    return None


def build(spec: str, attn_implementation: str, *, dtype: str, device: str, seed: int = 0):
    """(model, None), or (None, transformers' refusal) when the model class refuses `attn_implementation`.

    A config that transformers cannot build into a causal LM with any implementation is the user's input: the
    same config is built with "eager" on the meta device (no memory) to tell the two apart."""
    from attnprof.models.presets import build_model, load_config, not_a_causal_lm

    try:
        model = build_model(spec, attn_implementation=attn_implementation, dtype=dtype, device=device, seed=seed)
    except REFUSALS as exc:
        refused = exc
    else:
        gap = sdpa_gap(model.config, attn_implementation)
        return (None, f"{attn_implementation}: {gap}") if gap else (model, None)
    import torch
    import transformers

    try:
        with torch.device("meta"):
            transformers.AutoModelForCausalLM.from_config(load_config(spec), attn_implementation="eager")
    except REFUSALS as exc:  # e.g. "Unrecognized configuration class … for AutoModelForCausalLM"
        raise not_a_causal_lm(spec, exc) from None
    return None, f"{attn_implementation}: {said(refused)}"


def sliding_layers(config) -> list[int]:
    """The layers whose attention gets a sliding window (`sliding_window=` in the call)."""
    if not getattr(config, "sliding_window", None):
        return []
    layers = getattr(config, "num_hidden_layers", 0) or 0
    types = getattr(config, "layer_types", None)
    if types:
        return [i for i, kind in enumerate(types) if kind == "sliding_attention"]
    return list(range(layers))


def not_taken(config) -> dict[str, str]:
    """Attention arguments of this model's calls that a `Variant` cannot take (`_NOT_TAKEN`), each with where the
    config asks for it."""
    from attnprof.models.attention import _NOT_TAKEN

    asks: dict[str, str] = {}
    cap = getattr(config, "attn_logit_softcapping", None)
    if cap:
        asks["softcap"] = f"attention logit softcapping (attn_logit_softcapping={cap:g})"
    sliding = sliding_layers(config)
    if sliding:
        layers = getattr(config, "num_hidden_layers", len(sliding))
        asks["sliding_window"] = (f"a sliding window of {config.sliding_window} keys on {len(sliding)} of {layers} "
                                  "layers")
    model_type = getattr(config, "model_type", "")
    if model_type in SINK_FAMILIES:
        asks["s_aux"] = f"learned attention sinks (s_aux, {model_type})"
    return {k: v for k, v in asks.items() if k in _NOT_TAKEN}


def refuse_not_taken(impls: list, config) -> list:
    """`impls` (`models.attention.AttentionImpl`) with each variant-backed one (the kernel, user functions: registered
    as "attnprof_…") refused when the model asks for an argument a variant cannot take."""
    from attnprof.models.attention import takes

    asks = not_taken(config)
    if not asks:
        return impls
    out = []
    for impl in impls:
        variant_backed = impl.name == "kernel" or ":" in impl.name
        missing = {k: v for k, v in asks.items() if k not in takes(impl.attn_implementation)}
        if variant_backed and impl.rejected is None and missing:
            why = "; ".join(missing.values())
            impl = dataclasses.replace(impl, rejected=f"{impl.name}: this model's attention asks for {why}, and an "
                                                      f"attnprof variant's call has no {'/'.join(missing)} argument")
        out.append(impl)
    return out
