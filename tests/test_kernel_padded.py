"""Padded workloads through the `kernel` variant's varlen form (`variants/kernel_padded.py`), on the CPU.

The kernel runs in a child started with TRITON_INTERPRET=1 (this file is also that child: `python
tests/test_kernel_padded.py` prints one JSON line), in fp16 (the interpreter gets bf16 `tl.dot` wrong, and the varlen
program refuses bf16 there). The child runs `attnprof verify --cases pad-left,pad-right` (the kernel must pass the
gate, k × plain PyTorch's fp16 error against the fp64 oracle, with zero rows where no key is seen) and the variant
directly on the awkward forms: right-padded queries past the keys, Sq < Sk, Sq > Sk, no causal rule, GQA, a sequence
with no key at all; and `verify --model` on a left-padded batch. Reading a mask as key ranges, and refusing other
forms, is checked here, without a kernel.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest
import torch

from interpreter_child import child_report

INTERPRETER_CHILD = True  # its child starts in the background once tests are collected (conftest.py)

ROOT = Path(__file__).resolve().parents[1]

SHAPES = {  # name: (B, Hq, Hkv, Sq, Sk, D, causal, mask)
    "pad-right-causal": (3, 4, 2, 21, 21, 64, True, "pad-right"),
    "pad-left-causal": (3, 4, 2, 21, 21, 64, True, "pad-left"),
    "pad-right-chunk": (2, 2, 1, 7, 30, 64, True, "pad-right"),  # Sq < Sk: some queries see every real key
    "pad-left-queries-past-keys": (2, 2, 2, 30, 9, 128, True, "pad-left"),  # Sq > Sk: rows that see no key
    "pad-left-full": (3, 2, 2, 11, 17, 64, False, "pad-left"),
    "bool-causal": (2, 4, 4, 13, 13, 64, True, "bool"),
}


# ---------------------------------------------------------------------------------------------------------------
# The child: runs with TRITON_INTERPRET=1 from its first import on.
# ---------------------------------------------------------------------------------------------------------------
def _child() -> dict:
    out_dir = os.path.join(tempfile.mkdtemp(prefix="padded-kernel-"), "verify")  # removed by the fixture
    from attnprof.cli import main
    from attnprof.oracle.agreement import Reference
    from attnprof.variants.kernel_hub import KERNEL
    from attnprof.variants.naive import plain_attention
    from attnprof.workload import Workload

    results: dict = {}
    for name, (b, hq, hkv, sq, sk, d, causal, mask) in SHAPES.items():
        w = Workload(batch=b, heads=hq, kv_heads=hkv, seq=sq, kv_seq=sk, head_dim=d, dtype="fp16", causal=causal,
                     mask=mask)
        inputs = w.make_inputs(seed=1)
        ref = Reference.of(inputs)
        got, base = ref.compare(KERNEL(inputs), "fp16"), ref.compare(plain_attention(inputs), "fp16")
        results[name] = {"note": KERNEL.supports(w).note, "err": got.norm_rel, "eager": base.norm_rel,
                         "masked_rows": got.masked_rows, "masked_nonzero": got.masked_nonzero,
                         "nan": got.nan_out}
    # a sequence with no real key at all (its whole row of keys padded): every row of it is zeros
    w = Workload(batch=2, heads=2, seq=8, head_dim=64, dtype="fp16", mask="pad-right")
    inputs = w.make_inputs(seed=2)
    mask = inputs.attn_mask.clone()
    mask[1] = False
    empty = KERNEL.fn(type(inputs)(inputs.q, inputs.k, inputs.v, causal=False, scale=inputs.scale, attn_mask=mask,
                                   valid=mask))
    results["empty_sequence_zero"] = bool((empty[1] == 0).all()) and bool(empty[0].isfinite().all())
    results["bf16"] = KERNEL.supports(Workload(dtype="bf16", mask="pad-left")).reason
    rc = main(["verify", "--device", "cpu", "--variants", "kernel", "--cases", "pad-left,pad-right", "--dtype", "fp16",
               "--seed", "5", "--out", out_dir])
    results["verify"] = {"rc": rc, **json.loads((Path(out_dir) / "verify.json").read_text())["kernel"]["summary"]}
    # the model level's left-padded batch: the kernel runs it (transformers' bool mask is one key range per row)
    config = Path(out_dir).with_name("llama64.json")
    config.write_text(json.dumps({"model_type": "llama", "hidden_size": 128, "intermediate_size": 256,
                                  "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
                                  "head_dim": 64, "vocab_size": 128, "max_position_embeddings": 256}))
    model_out = Path(out_dir).with_name("model")
    rc = main(["verify", "--device", "cpu", "--model", str(config), "--impls", "eager,kernel", "--dtype", "fp16",
               "--seed", "5", "--model-batch", "2", "--model-seq", "12", "--decode-tokens", "3", "--out", str(model_out)])
    results["model"] = {"rc": rc, "results": json.loads((model_out / "verify.json").read_text())["model"]["results"]}
    results["tmp"] = str(Path(out_dir).parent)
    return results


@pytest.fixture(scope="module")
def interp() -> dict:
    yield from child_report(__file__)


@pytest.mark.parametrize("name", list(SHAPES))
def test_padded_shapes_match_the_oracle_within_twice_plain_pytorch(interp, name):
    r = interp[name]
    assert "flash_attn_varlen_func" in r["note"]
    assert r["nan"] == 0 and r["err"] <= 2 * r["eager"], f"kernel {r['err']:.3g} > 2 x plain fp16 {r['eager']:.3g}"
    assert r["masked_nonzero"] == 0, "rows that see no key must be zeros"
    if name in ("pad-left-causal", "pad-left-queries-past-keys"):
        assert r["masked_rows"] > 0  # the case has such rows: the zero check above was not vacuous


def test_verify_passes_the_kernel_on_padding_instead_of_rejecting_it(interp):
    v = interp["verify"]
    assert v["rc"] == 0
    assert v["kernel"]["status"] == "pass" and v["kernel"]["pass"] == 2 and v["kernel"]["rejected"] == 0


def test_verify_model_runs_the_kernel_on_a_left_padded_batch(interp):
    kernel = next(r for r in interp["model"]["results"] if r["impl"] == "kernel")
    assert interp["model"]["rc"] == 0 and kernel["status"] == "pass", kernel["reason"]
    assert kernel["agreement"]["positions"] < 2 * 12  # the batch was padded: fewer valid positions than tokens


def test_a_sequence_with_no_key_is_zeros(interp):
    assert interp["empty_sequence_zero"]


def test_bf16_padding_is_refused_under_the_interpreter(interp):
    assert "bf16" in interp["bf16"] and "fp16" in interp["bf16"]


# ---------------------------------------------------------------------------------------------------------------
# The mask as key ranges (no kernel needed)
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mask, causal, sq, sk", [("pad-left", True, 9, 9), ("pad-right", True, 5, 12),
                                                  ("pad-right", False, 9, 6), ("bool", True, 7, 7)])
def test_key_ranges_read_the_workloads_padding(mask, causal, sq, sk):
    from attnprof.variants.kernel_padded import key_ranges
    from attnprof.workload import Workload

    w = Workload(batch=4, heads=1, seq=sq, kv_seq=sk, head_dim=8, causal=causal, mask=mask)
    k0, k1, got_causal = key_ranges(w.valid_mask(), (sq, sk))
    lengths = torch.tensor(w.valid_lengths()) if mask != "bool" else torch.full((4,), sk)
    assert got_causal == causal
    assert torch.equal(k1 - k0, lengths)
    assert torch.equal(k1, torch.full((4,), sk) if mask == "pad-left" else lengths)


@pytest.mark.parametrize("damage", ["hole", "per-head", "float"])
def test_masks_that_are_not_key_ranges_are_refused_by_name(damage):
    from attnprof.variants.kernel_padded import key_ranges
    from attnprof.workload import Workload

    mask = Workload(batch=2, heads=2, seq=8, head_dim=8, mask="pad-right").valid_mask()
    if damage == "hole":
        mask = mask.clone()
        mask[0, 0, :, 2] = False  # key 2 of sequence 0 hidden from every query: not one range
    elif damage == "per-head":
        mask = mask.expand(2, 2, 8, 8)
    else:
        mask = mask.float()
    with pytest.raises(ValueError, match="key range|bool"):
        key_ranges(mask, (8, 8))


if __name__ == "__main__":
    assert os.environ.get("TRITON_INTERPRET") == "1", "run the child with TRITON_INTERPRET=1"
    print(json.dumps(_child()))
