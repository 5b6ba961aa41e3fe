"""What a model's attention asks for (softcap, a sliding window, sinks), layer by layer, and what each
implementation does with it: honours, refuses, or silently ignores it.

Why: Gemma 2 (softcap and a window on every other layer), Mistral (a window on every layer) and gpt-oss (sinks and a
window on every other layer) are not Llamas. A dispatch table or a logits gate on a sample shorter than the window,
with no word about the softcap, says nothing about the parts that differ. The asks are read from the config the way
transformers 5.x's modeling code reads them: `attn_logit_softcapping` on every layer; `sliding_window` on the layers
`layer_types` marks "sliding_attention" (every layer when the config has none, as Mistral); the learned sinks
(`s_aux=`) of `features.SINK_FAMILIES`.

The verdicts are measured, not guessed: `probe` builds a shrunk copy of the model (the same `model_type` and layer
kinds, 64 wide, random weights, fp32 on the CPU), with the window cut to `PROBE_WINDOW` keys and the softcap to
`PROBE_SOFTCAP` so both bite on a `PROBE_SEQ`-token sample, and compares each implementation's logits with eager's,
with every feature on and with each feature off in turn (window longer than the sample, softcap None, sinks -1e4):

- honours: the logits match eager with the feature (to 2 % of what the feature moves);
- ignores: they match eager *without* it (silently computes another model);
- differs: they match neither (the feature is computed some other way, or wrongly);
- not applied: the config sets it, but eager's logits do not move without it (Gemma 3's attention in transformers
  5.24 reads `attn_logit_softcapping` and never passes it on);
- refuses: transformers refuses the implementation for this class or the call (its words), or attnprof's adapter
  refuses an argument a variant cannot take (`features.refuse_not_taken`).

What cannot run on the CPU probe is said as such: a pinned SDPA backend without a CPU kernel gets sdpa's verdict
("as sdpa": the same transformers call, the pin only picks the kernel); the kernel and user variants get what their
adapter declares (`models.attention.takes`); flex_attention is probed only when the caller asks (it compiles, 30 to 80 s
on a CPU).
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass

import torch

FEATURES = ("softcap", "sliding_window", "sinks")
PROBE_WINDOW = 8  # keys: the probe's sample (PROBE_SEQ) is three windows long
PROBE_SEQ = 24
PROBE_SOFTCAP = 0.005  # a 64-wide random model's scores are ~0.03: a softcap of 50 would change nothing measurable
_SHRUNK = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
               vocab_size=128, num_local_experts=4, num_experts_per_tok=2, moe_intermediate_size=64)
_RELATIVE = 0.02  # matches a reference when within 2 % of what the feature moves the logits
_MIN_EFFECT = 1e-4  # below this the feature moves fp32 logits too little to tell apart


@dataclass(frozen=True)
class LayerAsks:
    """One decoder layer's attention: its kind and the features its call carries (None / False: not asked)."""

    layer: int
    kind: str  # "sliding" | "full"
    softcap: float | None
    window: int | None
    sinks: bool


@dataclass(frozen=True)
class Verdict:
    impl: str
    feature: str
    verdict: str  # honours | ignores | differs | refuses | error | not run | not probed | not applied
    how: str  # "measured" (the CPU probe) | "as sdpa" | "declared" (the adapter's own list)
    why: str = ""


def layer_asks(config) -> list[LayerAsks]:
    """Per layer, what the modeling code passes to attention (see the module docstring)."""
    from attnprof.models.features import SINK_FAMILIES, sliding_layers

    layers = int(getattr(config, "num_hidden_layers", 0) or 0)
    sliding = set(sliding_layers(config))
    cap = getattr(config, "attn_logit_softcapping", None) or None
    sinks = getattr(config, "model_type", "") in SINK_FAMILIES
    return [LayerAsks(i, "sliding" if i in sliding else "full", float(cap) if cap else None,
                      int(config.sliding_window) if i in sliding else None, sinks) for i in range(layers)]


def asked(layers: list[LayerAsks]) -> tuple[str, ...]:
    """The features some layer asks for, in `FEATURES` order."""
    have = {"softcap": any(x.softcap for x in layers), "sliding_window": any(x.window for x in layers),
            "sinks": any(x.sinks for x in layers)}
    return tuple(f for f in FEATURES if have[f])


def window_check(layers: list[LayerAsks], seq: int, max_positions: int, extra: int = 0) -> dict | None:
    """Whether a `seq`-token sample crosses the smallest window (a query sees more keys than the window keeps), and
    when not, a length that does: twice the window, capped by `max_positions` less `extra` (tokens generated after
    the sample). None when no layer has a window."""
    windows = [x.window for x in layers if x.window]
    if not windows:
        return None
    window = min(windows)
    room = max_positions - extra if max_positions else 2 * window
    cross = min(2 * window, room) if room > window else None
    return {"window": window, "seq": seq, "exercised": seq > window, "cross_seq": None if seq > window else cross}


def _shrunk(config, *, without: str | None = None):
    """A small copy of `config`: one layer of each kind it has, in order, `_SHRUNK` sizes, the probe's window and
    softcap; `without` turns that feature off (a window longer than the sample, no softcap)."""
    import transformers

    data = config.to_dict()
    kinds = list(dict.fromkeys(getattr(config, "layer_types", None) or []))
    data.update({k: v for k, v in _SHRUNK.items() if k in data or k in ("head_dim",)})
    data["num_hidden_layers"] = max(1, len(kinds))
    if kinds:
        data["layer_types"] = kinds
    data["max_position_embeddings"] = max(int(data.get("max_position_embeddings") or 0), 4 * PROBE_SEQ)
    if data.get("sliding_window"):
        data["sliding_window"] = 10 ** 6 if without == "sliding_window" else PROBE_WINDOW
    if data.get("attn_logit_softcapping"):
        data["attn_logit_softcapping"] = None if without == "softcap" else PROBE_SOFTCAP
    model_type = data.pop("model_type")
    for key in ("_attn_implementation", "_attn_implementation_internal", "transformers_version", "architectures"):
        data.pop(key, None)
    return transformers.AutoConfig.for_model(model_type, **data)


def _build(config, state=None):
    import transformers

    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager",
                                                          dtype=torch.float32).eval()
    if state is not None:
        model.load_state_dict(state)
    return model


def _logits(model, ids) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).logits.double()


def _no_sinks(model) -> int:
    """Sinks that take no weight (-1e4 before the softmax): eager without sinks. The number of sink tensors."""
    found = [p for name, p in model.named_parameters() if name.endswith("sinks")]
    with torch.no_grad():
        for p in found:
            p.fill_(-1e4)
    return len(found)


def classify(out: torch.Tensor, full: torch.Tensor, without: dict[str, torch.Tensor]) -> dict[str, tuple[str, str]]:
    """Per feature: (verdict, evidence) from an implementation's logits `out` against eager's with every feature
    (`full`) and eager's with that one feature off (`without[f]`)."""
    verdicts = {}
    off_full = (out - full).abs().max().item()
    for feature, ref in without.items():
        effect = (full - ref).abs().max().item()
        off_ref = (out - ref).abs().max().item()
        numbers = f"max |Δ logits| {off_full:.1e} from eager with it, {off_ref:.1e} without; the feature moves {effect:.1e}"
        if effect < _MIN_EFFECT:
            verdicts[feature] = ("not probed", f"the probe's {feature} moves the logits only {effect:.1e}")
        elif off_full <= _RELATIVE * effect:
            verdicts[feature] = ("honours", numbers)
        elif off_ref <= _RELATIVE * effect:
            verdicts[feature] = ("ignores", numbers)
        else:
            verdicts[feature] = ("differs", numbers)
    return verdicts


def probe(config, impls: list, *, flex: bool = False) -> list[Verdict]:
    """Each of `impls` (`models.attention.AttentionImpl`) × each feature `config` asks for: a `Verdict`."""
    from attnprof.errors import first_line

    wanted = asked(layer_asks(config))
    if not wanted:
        return []
    key = config.to_json_string(use_diff=False)
    try:
        if key not in _PROBES:
            _PROBES[key] = (_references(config, wanted), {})
        (model, ids, full, without), measured = _PROBES[key]
    except (ValueError, TypeError, KeyError, RuntimeError) as exc:  # a config transformers cannot shrink or run
        why = f"transformers cannot build or run a shrunk copy of this config ({first_line(exc)[:160]})"
        return [Verdict(i.name, f, "not probed", "measured", why) for i in impls for f in wanted]
    without = dict(without)
    inert = [f for f in wanted if (full - without[f]).abs().max().item() < _MIN_EFFECT]
    for f in inert:  # the config sets it, the modeling code does not apply it: nothing to honour or ignore
        without.pop(f)
    out = [Verdict("eager", f, "not applied", "measured", f"the config sets it, but {type(model).__name__}'s "
                   "attention does not apply it: eager's logits do not move without it") for f in inert]
    wanted = tuple(f for f in wanted if f not in inert)
    if not wanted:
        return out

    def measure(impl) -> list[Verdict]:
        if impl.name not in measured:  # sdpa and sdpa-math share an attn_implementation, not a context
            measured[impl.name] = _measure(model, impl, ids, full, without)
        return measured[impl.name]

    for impl in impls:
        if impl.name == "eager":
            out += [Verdict("eager", f, "honours", "measured", "the reference: transformers' own modeling code")
                    for f in wanted]
        elif impl.name == "kernel" or ":" in impl.name:
            out += _declared(impl, wanted)
        elif impl.name == "flex_attention" and not flex:
            out += [Verdict(impl.name, f, "not probed", "measured", "probing flex compiles it (30 to 80 s on a CPU); "
                            "verify --model with flex among --impls probes it") for f in wanted]
        # a pinned backend the probe's CPU has no kernel for (efficient, cudnn; or any refused one): judged as sdpa
        elif impl.name in ("sdpa-efficient", "sdpa-cudnn") or (impl.name.startswith("sdpa-") and impl.rejected):
            from attnprof.models.attention import AttentionImpl

            out += [dataclasses.replace(v, impl=impl.name, how="as sdpa")
                    for v in measure(AttentionImpl("sdpa", "sdpa"))]
        else:
            out += [dataclasses.replace(v, impl=impl.name) for v in measure(impl)]
    return out


_PROBES: dict[str, tuple] = {}  # config → (references, verdicts per attn_implementation): one probe per process


def _references(config, wanted: tuple[str, ...]):
    """(shrunk eager model, sample ids, its logits, its logits with each feature off)."""
    model = _build(_shrunk(config))
    ids = torch.randint(3, model.config.vocab_size, (1, PROBE_SEQ), generator=torch.Generator().manual_seed(0))
    without = {}
    for feature in wanted:
        if feature == "sinks":
            other = copy.deepcopy(model)
            _no_sinks(other)
        else:
            other = _build(_shrunk(config, without=feature), model.state_dict())
        without[feature] = _logits(other, ids)
    return model, ids, _logits(model, ids), without


def _measure(model, impl, ids, full, without) -> list[Verdict]:
    """Run the shrunk model on `impl` and classify its logits (a refusal or a crash holds for every feature)."""
    from attnprof.errors import first_line
    from attnprof.models.features import REFUSALS, forward_refusal, said

    model = copy.deepcopy(model)

    def every(verdict: str, why: str) -> list[Verdict]:
        return [Verdict(impl.name, f, verdict, "measured", why) for f in without]

    try:
        model.set_attn_implementation(impl.attn_implementation)
    except REFUSALS as exc:  # the model class refuses it (Gemma 2, gpt-oss: SDPA in transformers 5.24)
        return every("refuses", said(exc))
    if model.config._attn_implementation != impl.attn_implementation:
        return every("refuses", f"{type(model).__name__} cannot switch to {impl.attn_implementation!r}")
    try:
        with impl.context():
            out = _logits(model, ids)
    except REFUSALS as exc:
        text = forward_refusal(exc)
        if text is None:
            return every("error", first_line(exc))
        return every("refuses", text)
    except Exception as exc:  # noqa: BLE001 - the implementation's crash is its verdict, with its reason
        return every("error", first_line(exc))
    return [Verdict(impl.name, f, v, "measured", why) for f, (v, why) in classify(out, full, without).items()]


_ARG = {"softcap": "softcap", "sliding_window": "sliding_window", "sinks": "s_aux"}  # the call's keyword


def _declared(impl, wanted: tuple[str, ...]) -> list[Verdict]:
    """A variant-backed implementation (the kernel, package.module:function): what its adapter passes on
    (`models.attention.takes`); the rest it refuses before running (`features.refuse_not_taken`)."""
    from attnprof.models.attention import takes

    if not impl.attn_implementation:  # refused before it was registered (e.g. the kernel on a CPU)
        return [Verdict(impl.name, f, "not run", "declared", impl.rejected or "") for f in wanted]
    taken = takes(impl.attn_implementation)
    return [Verdict(impl.name, f, "honours", "declared", "the kernel repo lists it in MODEL_FEATURES (not run on "
                    "the CPU probe)") if _ARG[f] in taken else
            Verdict(impl.name, f, "refuses", "declared", f"an attnprof variant's call has no {_ARG[f]} argument "
                    "(refused before the model runs)") for f in wanted]


def attention_features(config, impls: list, *, seq: int, flag: str, extra: int = 0, flex: bool = False) -> dict:
    """The JSON block `audit --model` and `verify --model` write: per layer asks, per implementation verdicts, and
    whether the `seq`-token sample (then `extra` generated tokens) crosses the window (`flag` sets its length)."""
    layers = layer_asks(config)
    max_pos = int(getattr(config, "max_position_embeddings", 0) or 0)
    window = window_check(layers, seq, max_pos, extra)
    return {"asks": list(asked(layers)), "layers": [dataclasses.asdict(x) for x in layers],
            "window": None if window is None else {**window, "flag": flag, "max_positions": max_pos},
            "probe": {"device": "cpu", "dtype": "fp32", "seq": PROBE_SEQ, "window": PROBE_WINDOW,
                      "softcap": PROBE_SOFTCAP, "relative": _RELATIVE},
            "verdicts": [dataclasses.asdict(v) for v in probe(config, impls, flex=flex)]}


def model_features(spec: str, impls_spec: str, device: str, *, seq: int, extra: int, flag: str, kernel=None) -> dict:
    """`attention_features` for `verify --model`: its implementations (flex probed when among them)."""
    from attnprof.models.attention import resolve_impls
    from attnprof.models.presets import load_config

    impls = resolve_impls(impls_spec, device, kernel=kernel)
    return attention_features(load_config(spec), impls, seq=seq, extra=extra, flag=flag,
                              flex=any(i.name == "flex_attention" for i in impls))
