"""Audit a real transformers model: build it from a config (random weights, nothing downloaded), run one forward
on a padded sample batch with `attn_implementation="sdpa"` under the watcher, one record per attention layer."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attnprof.audit.watch import DispatchRecord, watch


@dataclass
class ModelAudit:
    spec: str
    model_type: str
    layers: int
    batch: int
    seq: int
    dtype: str
    records: list[DispatchRecord]

    def to_json(self) -> dict:
        return {"spec": self.spec, "model_type": self.model_type, "layers": self.layers, "batch": self.batch,
                "seq": self.seq, "dtype": self.dtype, "attention_calls": len(self.records)}


def audit_model(spec: str, *, device: str = "cpu", dtype: str = "fp32", batch: int = 2, seq: int = 64,
                seed: int = 0) -> ModelAudit:
    """One forward of `spec` (preset name or config.json) on a left-padded batch; which backend each layer got."""
    from attnprof.models import build_model, padded_batch

    model = build_model(spec, attn_implementation="sdpa", dtype=dtype, device=device, seed=seed)
    ids, mask = padded_batch(model.config, batch=batch, seq=seq, seed=seed, device=device)
    with torch.no_grad(), watch() as calls:
        model(input_ids=ids, attention_mask=mask)
    layers = getattr(model.config, "num_hidden_layers", None) or 0
    return ModelAudit(spec, getattr(model.config, "model_type", "?"), layers, batch, seq, dtype, list(calls))
