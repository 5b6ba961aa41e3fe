"""Prefill and decode under the watcher: every SDPA call of a short `generate`, grouped by call site and shape class.

One forward is not what a served model runs. `generate` runs a prefill (Sq = Sk, one new length per request) and
then one decode step per token (Sq = 1, a KV length that grows by one every step), and a backend that is fastest on
the first can be the costliest on the second: cuDNN builds an execution plan for every new KV length (51 ms on the
H200, `/work/shared/GPU_FACTS.md`), and decode brings a new one every step. So the audit records generation and
groups its calls by where they come from and what shape they have:

- the call site: the attention module path with layer indices folded (`model.layers.*.self_attn`) and the file:line
  that called SDPA (transformers' `sdpa_attention_forward`): one site for the 16 identical layers of llama-1b;
- the shape class: `decode` (one query row), `prefill` (Sq = Sk), `append` (1 < Sq < Sk: chunked prefill, speculative
  tokens). transformers folds the query heads of a GQA decode step into the query length when it passes a mask
  (q `[B, Hkv, groups·1, D]`); the mask's own query length (1) tells such a call apart from a real append.

`pin` applies a fix while recording (`{"decode": "flash"}` or `{"all": "flash"}`): each SDPA call of that shape
class runs under `sdpa_kernel([that backend])`, what a user's attention function would do.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from attnprof.dispatch.sdpa_checks import BACKENDS
from attnprof.dispatch.watch import DispatchRecord, watch
from attnprof.errors import UsageError, first_line
from attnprof.models import padded_batch
from attnprof.models.features import build, refusal_on_forward

PHASES = ("prefill", "decode")
SHAPE_CLASSES = ("prefill", "decode", "append")
# which shape classes a requested phase keeps (decode brings its appends: speculative or chunked steps)
PHASE_CLASSES = {"prefill": ("prefill",), "decode": ("decode", "append")}
PIN_BACKENDS = ("flash", "efficient", "cudnn", "math")


def parse_phases(text: str) -> tuple[str, ...]:
    """`"prefill,decode"` → ("prefill", "decode"); an unknown or empty phase is a UsageError."""
    names = tuple(dict.fromkeys(p.strip() for p in text.split(",") if p.strip()))
    bad = [p for p in names if p not in PHASES]
    if bad or not names:
        raise UsageError(f"--phase {text!r}: unknown phase {', '.join(bad) or '(empty)'}; choose from "
                         f"{', '.join(PHASES)} (comma-separated)")
    return names


def parse_pin(text: str | None) -> dict[str, str]:
    """`flash` → {"all": "flash"}; `decode=flash,prefill=cudnn` → per shape class. Bad names: UsageError."""
    if not text:
        return {}
    pins: dict[str, str] = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        cls, _, backend = part.rpartition("=")
        cls = cls or "all"
        if cls not in (*SHAPE_CLASSES, "all") or backend not in PIN_BACKENDS:
            raise UsageError(f"--pin {text!r}: want BACKEND or CLASS=BACKEND,... with BACKEND one of "
                             f"{', '.join(PIN_BACKENDS)} and CLASS one of {', '.join(SHAPE_CLASSES)}")
        pins[cls] = backend
    return pins


def effective_sq(rec: DispatchRecord) -> int:
    """The query length of the step: the mask's when the query heads were folded into q's length."""
    sq = rec.q_shape[2] if len(rec.q_shape) == 4 else 0
    m = rec.mask_shape
    if m is not None and len(m) == 4 and 0 < m[2] < sq and sq % m[2] == 0:
        return m[2]
    return sq


def shape_class(sq: int, sk: int) -> str:
    if sq == 1 and sk > 1:
        return "decode"
    return "prefill" if sq >= sk else "append"


def _folded(path: str | None) -> str | None:
    return re.sub(r"\.\d+(?=\.|$)", ".*", path) if path else path


@dataclass
class Site:
    """One call site in one shape class: its calls in order, and which of them met a new shape (first calls)."""

    module: str | None  # folded module path: model.layers.*.self_attn
    location: str | None  # file:line in function that called SDPA
    shape_class: str
    calls: list[DispatchRecord] = field(default_factory=list)
    first: list[bool] = field(default_factory=list)  # per call: its envelope had not been seen before in the run
    modules: set = field(default_factory=set)  # the unfolded module paths

    @property
    def key(self) -> str:
        where = self.module or "?"
        loc = _short(self.location)
        return f"{where} @ {loc} [{self.shape_class}]" if loc else f"{where} [{self.shape_class}]"

    @property
    def n_first(self) -> int:
        return sum(self.first)

    @property
    def n_repeat(self) -> int:
        return len(self.calls) - self.n_first

    def ran(self) -> dict[str, int]:
        """backend → calls, most frequent first."""
        counts: dict[str, int] = {}
        for c in self.calls:
            counts[c.backend] = counts.get(c.backend, 0) + 1
        return dict(sorted(counts.items(), key=lambda kv: -kv[1]))

    def representative(self) -> DispatchRecord:
        """The call at the median KV length: what the repeat timing replays."""
        ordered = sorted(self.calls, key=lambda c: (c.k_shape[2] if len(c.k_shape) == 4 else 0, c.index))
        return ordered[len(ordered) // 2]

    def to_json(self) -> dict:
        return {"key": self.key, "module": self.module, "location": self.location, "shape_class": self.shape_class,
                "calls": len(self.calls), "first_calls": self.n_first, "repeat_calls": self.n_repeat,
                "layers": len(self.modules), "ran": self.ran(), "envelope": self.representative().envelope()}


def _short(location: str | None) -> str | None:
    """`…/site-packages/transformers/integrations/sdpa_attention.py:182 in f` → `transformers/integrations/…`."""
    if not location:
        return None
    for marker in ("site-packages/", "dist-packages/"):
        if marker in location:
            return location.split(marker, 1)[1]
    return location


def _shape_key(c: DispatchRecord) -> tuple:
    return (c.q_shape, c.k_shape, c.v_shape, c.dtypes, tuple(map(tuple, c.strides.values())), c.mask,
            c.mask_shape, c.mask_dtype, c.causal)


def group_sites(calls: list[DispatchRecord], classes: tuple[str, ...] = SHAPE_CLASSES) -> list[Site]:
    """SDPA calls → sites (call site × shape class), in order of first appearance; other kinds are left out."""
    sites: dict[tuple, Site] = {}
    seen: set[tuple] = set()
    for c in calls:
        if c.kind != "sdpa" or len(c.q_shape) != 4 or len(c.k_shape) != 4:
            continue
        shape = _shape_key(c)
        is_first = shape not in seen
        seen.add(shape)
        cls = shape_class(effective_sq(c), c.k_shape[2])
        if cls not in classes:
            continue
        key = (_folded(c.module) or c.module_class, c.location, cls)
        site = sites.get(key)
        if site is None:
            site = sites[key] = Site(module=key[0], location=c.location, shape_class=cls)
        site.calls.append(c)
        site.first.append(is_first)
        if c.module:
            site.modules.add(c.module)
    return list(sites.values())


@contextlib.contextmanager
def pinned(pins: dict[str, str]) -> Iterator[None]:
    """While open, each SDPA call runs under `sdpa_kernel([pins[its shape class]])` (or `pins["all"]`)."""
    if not pins:
        yield
        return
    from torch.nn.attention import sdpa_kernel

    inner = F.scaled_dot_product_attention

    def pinned_sdpa(query, key, value, *args, **kwargs):
        mask = kwargs.get("attn_mask", args[0] if args else None)
        sq = query.shape[-2]
        if isinstance(mask, torch.Tensor) and mask.dim() == 4 and 0 < mask.shape[2] < sq and sq % mask.shape[2] == 0:
            sq = mask.shape[2]  # GQA heads folded into the query length (see the module docstring)
        backend = pins.get(shape_class(sq, key.shape[-2]), pins.get("all"))
        if backend is None:
            return inner(query, key, value, *args, **kwargs)
        with sdpa_kernel([BACKENDS[backend]]):
            return inner(query, key, value, *args, **kwargs)

    F.scaled_dot_product_attention = pinned_sdpa
    try:
        yield
    finally:
        F.scaled_dot_product_attention = inner


@dataclass
class PhaseRun:
    """What ran: the model, its prompt, how many tokens it generated, and every SDPA call in order."""

    spec: str
    model_type: str
    layers: int
    batch: int
    prompt: int
    new_tokens: int  # decode steps that generated a token (0 when only prefill ran)
    dtype: str
    phases: tuple[str, ...]
    pins: dict[str, str]
    calls: list[DispatchRecord]
    rejected: str | None = None  # transformers refused SDPA for this model (its words): nothing ran

    def sites(self) -> list[Site]:
        classes = tuple(c for p in self.phases for c in PHASE_CLASSES[p])
        return group_sites(self.calls, classes)

    def to_json(self) -> dict:
        return {"spec": self.spec, "model_type": self.model_type, "layers": self.layers, "batch": self.batch,
                "prompt": self.prompt, "new_tokens": self.new_tokens, "dtype": self.dtype,
                "phases": list(self.phases), "pins": self.pins, "attention_calls": len(self.calls),
                "rejected": self.rejected}


def build_generator(spec: str, *, device: str, dtype: str, seed: int = 0):
    """(the model of `spec` with SDPA attention, None), (None, why) when its class refuses SDPA (transformers' words),
    or a UsageError when it cannot generate."""
    try:
        model, refused = build(spec, "sdpa", dtype=dtype, device=device, seed=seed)
    except KeyError as exc:
        raise UsageError(f"{spec}: cannot build a causal LM that generates ({first_line(exc)[:200]})") from None
    if model is None:
        return None, refused
    can = getattr(model, "can_generate", None)
    if not callable(can) or not can():
        raise UsageError(f"{spec}: {type(model).__name__} cannot generate (no generation head); --phase decode "
                         "needs a causal LM")
    return model, None


def record_phases(model, spec: str, *, phases: tuple[str, ...], batch: int, prompt: int, new_tokens: int,
                  dtype: str, pins: dict[str, str] | None = None, seed: int = 0) -> PhaseRun:
    """Run the phases under the watcher: one forward of the prompt when only prefill is asked, else a greedy
    `generate` of `new_tokens` tokens (its first forward is the prefill). Every call's operators are observed
    (`observe="every"`): a pin changes the dispatch of envelopes an earlier watch may have cached."""
    pins = dict(pins or {})
    device = str(next(model.parameters()).device)
    ids, mask = padded_batch(model.config, batch=batch, seq=prompt, seed=seed, device=device)
    steps = 0
    with torch.no_grad(), pinned(pins), watch(observe="every") as calls, refusal_on_forward() as said:
        try:
            if "decode" in phases:
                out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens,
                                     min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
                steps = int(out.shape[1] - ids.shape[1])
            else:
                model(input_ids=ids, attention_mask=mask)
        except RuntimeError as exc:
            if not pins:
                raise
            # a pinned backend that refuses the model's calls: the pin is the user's input
            raise UsageError(f"--pin {pins}: the model's attention cannot run pinned so "
                             f"({first_line(exc)[:300]})") from None
    layers = getattr(model.config, "num_hidden_layers", None) or 0
    return PhaseRun(spec, getattr(model.config, "model_type", "?"), layers, batch, prompt, steps, dtype,
                    tuple(phases), pins, [] if said else list(calls), rejected=f"sdpa: {said[0]}" if said else None)
