"""The model registry of numerics and serving: transformers decoders from config presets (`presets`), the
attention implementations they can run by name (`attention`), and a model's attention call as a `Workload`."""

from attnprof.models.presets import PRESETS, attention_workload, build_model, load_config, padded_batch

__all__ = ["PRESETS", "attention_workload", "build_model", "load_config", "padded_batch"]
