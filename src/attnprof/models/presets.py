"""Decoder models built from configuration presets: real transformers architectures, random weights, offline.

Nothing is downloaded: a preset is a config, the weights are drawn from a fixed seed. A local `config.json` path
works wherever a preset name does. transformers is an optional dependency (`pip install 'attnprof[models]'`).
`attention_workload` is a model's attention call as a `Workload`, written once for numerics and serving.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from attnprof.errors import UsageError, first_line
from attnprof.files import read_json
from attnprof.memory_fit import check_model_fits
from attnprof.validate import check_model_fields

# name → (architecture, config fields). Llama-3-like shapes; the tiny ones run in seconds on a CPU.
PRESETS: dict[str, tuple[str, dict[str, Any]]] = {
    "tiny-llama": ("llama", dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                                 num_key_value_heads=2, vocab_size=512, max_position_embeddings=1024)),
    "tiny-qwen": ("qwen2", dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                                num_key_value_heads=2, vocab_size=512, max_position_embeddings=1024)),
    "llama-1b": ("llama", dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                               num_key_value_heads=8, vocab_size=128256, max_position_embeddings=131072,
                               rope_theta=500000.0, tie_word_embeddings=True)),
    "llama-8b": ("llama", dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                               num_key_value_heads=8, vocab_size=128256, max_position_embeddings=131072,
                               rope_theta=500000.0)),
    "qwen-1.5b": ("qwen2", dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                                num_key_value_heads=2, vocab_size=151936, max_position_embeddings=32768)),
}


def _transformers():
    try:
        import transformers
    except ImportError:
        raise UsageError("this needs transformers: pip install 'attnprof[models]'") from None
    return transformers


def load_config(name_or_path: str, *, attn_implementation: str = "eager"):
    """A transformers config from a preset name or a local config.json; UsageError for anything else."""
    tf = _transformers()
    path = Path(name_or_path)
    if name_or_path in PRESETS:
        arch, fields = PRESETS[name_or_path]
        check_model_fields(fields, name_or_path)
        cls = {"llama": tf.LlamaConfig, "qwen2": tf.Qwen2Config}[arch]
        config = cls(**fields)
    elif path.suffix == ".json" or path.is_dir():
        file = path / "config.json" if path.is_dir() else path
        data = read_json(file, what="config.json", missing="config file")
        model_type = data.get("model_type") if isinstance(data, dict) else None
        if not model_type:
            raise UsageError(f"{file}: config has no model_type")
        check_model_fields(data, str(file))  # before transformers divides by a zero head count
        check_model_type(model_type, str(file))
        try:
            config = tf.AutoConfig.for_model(model_type, **{k: v for k, v in data.items() if k != "model_type"})
        except Exception as exc:  # ValueError, KeyError, huggingface_hub's strict validators: all the config's fault
            cause = exc.__cause__ or exc
            raise UsageError(f"{file}: transformers cannot build a {model_type!r} config "
                             f"({first_line(cause)})") from None
        check_model_fields(config.to_dict(), str(file))
    else:
        raise UsageError(f"unknown model preset {name_or_path!r}; presets: {', '.join(PRESETS)}, or a config.json path")
    config._attn_implementation = attn_implementation
    return config


def check_model_type(model_type: object, where: str) -> None:
    """UsageError unless transformers knows `model_type`, naming the five closest known types: transformers' own
    error lists every type it knows (~800 names, one 12,000-character line)."""
    import difflib

    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    if isinstance(model_type, str) and model_type in CONFIG_MAPPING:
        return
    known = list(CONFIG_MAPPING.keys())
    close = difflib.get_close_matches(str(model_type), known, n=5)
    version = _transformers().__version__
    hint = (f"closest known: {', '.join(close)}" if close else f"none of the {len(known)} it knows is close")
    raise UsageError(f"{where}: transformers {version} has no model_type {model_type!r}; {hint}")


def build_model(name_or_path: str, *, attn_implementation: str = "eager", dtype: str = "fp32", device: str = "cpu",
                seed: int = 0):
    """A causal LM from a preset or config, random weights from `seed`, in eval mode on `device`."""
    import torch

    from attnprof.workload import DTYPES, model_dtype_name

    tf = _transformers()
    config = load_config(name_or_path, attn_implementation=attn_implementation)
    check_model_fits(config, model_dtype_name(dtype), device, name_or_path)  # before transformers allocates the weights
    torch.manual_seed(seed)
    try:
        with torch.device(device):
            model = tf.AutoModelForCausalLM.from_config(config, attn_implementation=attn_implementation,
                                                        dtype=DTYPES[model_dtype_name(dtype)])
    except (ValueError, ImportError) as exc:
        if attn_implementation != "eager":
            raise  # the implementation may be what the class refuses: `models.features.build` tells them apart
        raise not_a_causal_lm(name_or_path, exc) from None
    return model.eval()


def not_a_causal_lm(name_or_path: str, exc: BaseException) -> UsageError:
    """The user's config is not one transformers builds into a causal LM (with eager attention, which every class
    takes), e.g. "Unrecognized configuration class … for AutoModelForCausalLM"."""
    return UsageError(f"{name_or_path}: transformers cannot build a causal LM from it ({first_line(exc)[:200]})")


def padded_batch(config, *, batch: int = 4, seq: int = 32, seed: int = 0, device: str = "cpu",
                 side: str = "left"):
    """(input_ids, attention_mask) with rows of different lengths padded on `side`: the usual suspect for bugs."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, config.vocab_size, (batch, seq), generator=gen)
    mask = torch.ones(batch, seq, dtype=torch.long)
    for b in range(batch):
        pad = (b * seq) // (2 * batch)  # 0, 1/8, 1/4, 3/8 of the row padded
        if pad:
            if side == "left":
                mask[b, :pad] = 0
            else:
                mask[b, seq - pad:] = 0
    ids = ids.masked_fill(mask == 0, 0)
    return ids.to(device), mask.to(device)


def attention_workload(config, *, batch: int, seq: int, dtype: str, device: str, mask: str = "none"):
    """The attention call of `config`'s layers on a `[batch, seq]` batch as a `Workload` (heads, kv heads, head dim,
    causal, `mask` "pad-left" for a left-padded batch): what `Variant.supports` and SDPA's checks are asked."""
    from attnprof.workload import Workload

    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return Workload(batch=batch, heads=heads, kv_heads=getattr(config, "num_key_value_heads", None) or heads,
                    seq=seq, head_dim=head_dim, dtype=dtype, causal=True, mask=mask, device=device)
