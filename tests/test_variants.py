"""Every variant against the fp64 oracle, over dtypes and awkward shapes (S = 97, D = 72, GQA, Sq != Sk)."""

import pytest
import torch

from attnprof.variants import VARIANTS, reference_attention
from attnprof.workload import Workload

FAST = [n for n in VARIANTS if n not in ("reference", "flex")]  # flex compiles: covered once below

SHAPES = {
    "odd": dict(batch=1, heads=2, seq=97, head_dim=72),
    "gqa": dict(batch=2, heads=8, kv_heads=2, seq=33, head_dim=64),
    "decode": dict(batch=2, heads=4, kv_heads=2, seq=1, kv_seq=61, head_dim=64),
    "prefill-chunk": dict(batch=1, heads=2, seq=17, kv_seq=40, head_dim=32),
    "pad-right": dict(batch=4, heads=2, seq=24, head_dim=32, mask="pad-right"),
    "strided": dict(batch=1, heads=3, seq=31, head_dim=40, transposed=True),
}


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.double() - ref).norm() / ref.norm())


def plain_pytorch_err(inputs, ref) -> float:
    """The error budget's baseline: the tutorial's in-place eager attention in the same dtype."""
    return rel_err(VARIANTS["inplace"](inputs), ref)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("name", FAST)
def test_variant_matches_fp64_reference(name, shape, dtype):
    w = Workload(dtype=dtype, **SHAPES[shape])
    variant = VARIANTS[name]
    support = variant.supports(w)
    if not support.ok:
        assert support.reason  # a rejection always says why
        pytest.skip(support.reason)
    inputs = w.make_inputs(seed=11)
    ref = reference_attention(inputs)
    out = variant(inputs)
    assert out.shape == inputs.q.shape and out.dtype == inputs.q.dtype
    assert torch.isfinite(out).all()
    floor = {"fp32": 1e-6, "bf16": 1e-2}[dtype]
    assert rel_err(out, ref) <= max(2 * plain_pytorch_err(inputs, ref), floor)


def test_flex_matches_reference_with_gqa_and_offset_causal():
    w = Workload(batch=1, heads=4, kv_heads=2, seq=16, kv_seq=48, head_dim=32)
    inputs = w.make_inputs(seed=2)
    assert rel_err(VARIANTS["flex"](inputs), reference_attention(inputs)) < 1e-5


def test_reference_puts_zeros_in_rows_that_see_no_key():
    inputs = Workload(batch=2, heads=1, seq=8, head_dim=8, mask="pad-left").make_inputs()
    ref = reference_attention(inputs)
    dead = ~inputs.valid.any(-1)  # [B, 1, Sq]
    assert dead.any()
    assert torch.all(ref.permute(0, 2, 1, 3)[dead.squeeze(1)] == 0)


def test_a_broken_variant_is_caught_by_the_same_check():
    w = Workload(batch=1, heads=2, seq=33, head_dim=32)
    inputs = w.make_inputs()
    ref = reference_attention(inputs)
    broken = torch.nn.functional.scaled_dot_product_attention(inputs.q, inputs.k, inputs.v, is_causal=True,
                                                              scale=inputs.scale * 1.01)
    assert rel_err(broken, ref) > 2 * plain_pytorch_err(inputs, ref)


def test_pinned_backends_without_a_cpu_kernel_are_rejected_with_reason():
    w = Workload(device="cpu")
    for name in ("sdpa-efficient", "sdpa-cudnn"):
        support = VARIANTS[name].supports(w)
        assert not support.ok and "CPU" in support.reason


def test_a_kernel_variant_travels_with_its_repo(tmp_path):
    """A `--kernel` variant pickles by its KernelSpec (a Ray worker rebuilds it for the same repo), not by its
    closure, which does not pickle, nor by name, which would load the default repo there."""
    import pickle
    import shutil

    from attnprof.variants import kernel_hub

    other = tmp_path / "my-kernel"
    shutil.copytree(kernel_hub.DEFAULT_REPO, other)
    spec = kernel_hub.parse_spec(str(other))
    back = pickle.loads(pickle.dumps(kernel_hub.kernel_variant(spec)))
    assert back.name == "kernel" and back.fn.kernel_spec == spec != kernel_hub.DEFAULT
    assert pickle.loads(pickle.dumps(kernel_hub.KERNEL)).fn.kernel_spec == kernel_hub.DEFAULT


# --- third-party conventions: each layout round-trips through a torch stand-in of the library's function --------

def _sdpa_bshd(q, k, v, causal, scale):
    f = torch.nn.functional.scaled_dot_product_attention
    gqa = q.shape[2] != k.shape[2]
    out = f(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal, scale=scale, enable_gqa=gqa)
    return out.transpose(1, 2)


def _fake_flash_attn_func(q, k, v, softmax_scale=None, causal=False):  # [B, S, H, D]
    return _sdpa_bshd(q, k, v, causal, softmax_scale)


def _fake_fa4_func(q, k, v, softmax_scale=None, causal=False):  # [B, S, H, D] → (out, lse), as flash_attn.cute
    out = _sdpa_bshd(q, k, v, causal, softmax_scale)
    return out, torch.zeros(out.shape[:3], dtype=torch.float32)


def _fake_sageattn(q, k, v, tensor_layout="HND", is_causal=False, sm_scale=None):
    assert tensor_layout == "HND"
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=is_causal, scale=sm_scale,
                                                            enable_gqa=q.shape[1] != k.shape[1])


def _fake_single_prefill(q, k, v, causal=False, sm_scale=None):  # NHD [S, H, D], one sequence
    return _sdpa_bshd(q[None], k[None], v[None], causal, sm_scale)[0]


def _fake_memory_efficient_attention(q, k, v, attn_bias=None, scale=None):  # BMHK
    assert attn_bias is None
    return _sdpa_bshd(q, k, v, False, scale)


@pytest.mark.parametrize("convention, fn, causal", [
    ("flash-attn", _fake_flash_attn_func, True),
    ("flash-attn", _fake_fa4_func, True),
    ("sageattention", _fake_sageattn, True),
    ("flashinfer", _fake_single_prefill, True),
    ("xformers", _fake_memory_efficient_attention, False),
])
def test_each_convention_hands_the_library_its_layout_and_returns_bhsd(convention, fn, causal):
    from attnprof.variants.adapters import CONVENTIONS

    w = Workload(batch=2, heads=4, kv_heads=4 if convention == "xformers" else 2, seq=16, head_dim=8, causal=causal)
    inputs = w.make_inputs()
    out = CONVENTIONS[convention].call(fn, inputs)
    assert out.shape == inputs.q.shape
    assert rel_err(out, reference_attention(inputs)) < 1e-5


def test_flash_attn_4_refuses_head_dims_outside_its_envelope_before_it_runs():
    """FA4 asserts on head dims past 256 or not a multiple of 8 mid-call; attnprof says so as a reason up front."""
    from attnprof.variants.adapters import LIBRARIES

    limits = LIBRARIES["flash-attn-4"].limits
    assert "head dim 512 is outside its 8–256" in limits(Workload(head_dim=512, device="cuda"))
    assert "head dim 100 is outside" in limits(Workload(head_dim=100, device="cuda"))


@pytest.mark.parametrize("name", ["sageattention", "flash-attn", "flash-attn-4", "flashinfer", "xformers",
                                  "flash_attn:flash_attn_func@flash-attn"])
def test_third_party_variants_pickle_by_name_for_ray_workers(name):
    """A Ray worker gets its variant pickled: a third-party one is rebuilt by name (its functions are closures)."""
    import pickle

    from attnprof.variants import resolve_variants

    (v,) = resolve_variants(name)
    back = pickle.loads(pickle.dumps(v))
    assert (back.name, back.family, back.backend, back.description) == (v.name, v.family, v.backend, v.description)
