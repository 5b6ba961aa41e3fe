"""Audit a real transformers model: build it from a config (random weights, nothing downloaded), run one forward
on a padded sample batch with `attn_implementation="sdpa"` under the watcher, one record per attention layer.
A model class that refuses SDPA (Gemma 2 and gpt-oss in transformers 5.24) runs nothing: `rejected` says why, in
transformers' words (`models.features.build`). What the model's attention asks for (softcap, sliding window, sinks) and
what eager, sdpa, flex and the kernel do with it comes with it (`models.attention_features`)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attnprof.dispatch.watch import DispatchRecord, watch


@dataclass
class ModelAudit:
    spec: str
    model_type: str
    layers: int
    batch: int
    seq: int
    dtype: str
    records: list[DispatchRecord]
    rejected: str | None = None  # transformers refused attn_implementation="sdpa" for this model: nothing ran
    features: dict | None = None  # `models.attention_features.attention_features`

    def to_json(self) -> dict:
        return {"spec": self.spec, "model_type": self.model_type, "layers": self.layers, "batch": self.batch,
                "seq": self.seq, "dtype": self.dtype, "attention_calls": len(self.records), "rejected": self.rejected,
                "attention_features": self.features}


def audit_model(spec: str, *, device: str = "cpu", dtype: str = "fp32", batch: int = 2, seq: int = 64,
                seed: int = 0, impls: str | None = None) -> ModelAudit:
    """One forward of `spec` (preset name or config.json) on a left-padded batch; which backend each layer got.
    `impls`: the implementations whose feature verdicts are listed (default `AUDITED`; a third-party kernel by
    name, e.g. flash-attn-4, is one through the registry adapter, `rejected` with its reason where it cannot run)."""
    from attnprof.models import load_config, padded_batch
    from attnprof.models.features import build, refusal_on_forward

    features = _features(load_config(spec), device, seq, impls or AUDITED)
    model, refused = build(spec, "sdpa", dtype=dtype, device=device, seed=seed)
    if model is None:
        config = load_config(spec)
        return ModelAudit(spec, getattr(config, "model_type", "?"), getattr(config, "num_hidden_layers", 0) or 0,
                          batch, seq, dtype, [], rejected=refused, features=features)
    ids, mask = padded_batch(model.config, batch=batch, seq=seq, seed=seed, device=device)
    layers = getattr(model.config, "num_hidden_layers", None) or 0
    with torch.no_grad(), watch() as calls, refusal_on_forward() as said:  # transformers' SDPA refusing a call
        model(input_ids=ids, attention_mask=mask)
    return ModelAudit(spec, getattr(model.config, "model_type", "?"), layers, batch, seq, dtype,
                      [] if said else list(calls), rejected=f"sdpa: {said[0]}" if said else None, features=features)


AUDITED = "eager,sdpa,flex_attention,kernel"  # the implementations whose verdicts the audit shows by default


def _features(config, device: str, seq: int, impls: str) -> dict:
    """The attention features block; flex is listed, not probed (its compile would dwarf the audit)."""
    from attnprof.models.attention import resolve_impls
    from attnprof.models.attention_features import attention_features

    return attention_features(config, resolve_impls(impls, device), seq=seq, flag="--seq")
