"""The role table on the real kernel names the H200 printed (GPU_FACTS.md) and on CPU aten names."""

import pytest

from attnprof.backends import kernel_names_of
from attnprof.profiling.classify import classify_cpu, classify_gpu

H200_NAMES = [
    ("Memset (Device)", "memset", None),
    ("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT", "gemm", None),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::AUnaryFunctor<c10::BFloat16, c10::BFloat16, "
     "c10::BFloat16, at::native::binary_internal::MulFunctor<float> >, std::array<char*, 2ul> >(int, "
     "at::native::AUnaryFunctor<c10::BFloat16, c10::BFloat16, c10::BFloat16, "
     "at::native::binary_internal::MulFunctor<float> >, std::array<char*, 2ul>)", "scale", None),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<bool>, std::array<char*, 1ul> >"
     "(int, at::native::FillFunctor<bool>, std::array<char*, 1ul>)", "mask_build", None),
    ("void at::native::triu_tril_kernel<bool, int, true, 4, true>(at::cuda::detail::TensorInfo<bool, int>, "
     "at::cuda::detail::TensorInfo<bool const, int>, long, long, long, int)", "mask_build", None),
    ("Memcpy DtoD (Device -> Device)", "copy", None),
    ("void at::native::(anonymous namespace)::masked_fill_kernel(at::TensorIterator&, c10::Scalar const&)"
     "::{lambda()#1}::operator()() const", "mask_apply", None),
    ("void (anonymous namespace)::softmax_warp_forward<c10::BFloat16, c10::BFloat16, float, 10, false, false>"
     "(c10::BFloat16*, c10::BFloat16 const*, int, int, int, bool const*, int, bool)", "softmax", None),
    ("void at::native::(anonymous namespace)::cunn_SoftMaxForwardReg<c10::BFloat16, float, c10::BFloat16>",
     "softmax", None),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x64_4x1x1_cga1x1x1_kernel0_0",
     "fused_attention", "cudnn"),
    ("fmha_cutlassF_bf16_aligned_32x128_gmem_sm80(PyTorchMemEffAttention::AttentionKernel<cutlass::bfloat16_t, "
     "cutlass::arch::Sm80, true, 32, 128, 512, true, true>::Params)", "fused_attention", "efficient"),
    ("fmha_cutlassF_f32_aligned_64x128_rf_sm80", "fused_attention", "efficient"),
    ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, "
     "cutlass::bfloat16_t, Flash_kernel_traits<128, 128, 64, 4, cutlass::bfloat16_t> >, false, true, false, "
     "false, true, true, false, false>(pytorch_flash::Flash_fwd_params)", "fused_attention", "flash"),
    ("triton_tem_fused_flex_attention_0", "fused_attention", "flex"),
    ("attention_fwd", "fused_attention", "kernel"),  # kernels/flash-triton's Triton kernel, as the H200 named it
    ("attention_fwd_sm90_ws", "fused_attention", "kernel"),  # its warp-specialized Gluon program
    ("attention_fwd_sm90", "fused_attention", "kernel"),  # its one-warpgroup Gluon program
    ("attention_fwd_sm90_wsp", "fused_attention", "kernel"),  # its persistent Gluon program (the old regex missed it)
    ("_transpose_keys", "copy", None),  # flash-triton's FP8 prefill transposing v (21 µs on an H100): a layout copy
    ("triton_poi_fused__scaled_dot_product_attention_0", "other", None),  # Inductor pointwise, named after the op
    ("sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize128x128x16_stage4_warpsize2x2x1_ffma_aligna4_alignc4_execute_"
     "kernel__5x_cublas", "gemm", None),
    ("void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl_nocast<at::native::(anonymous "
     "namespace)::where_kernel_impl(at::TensorIterator&)::{lambda()#1}", "mask_apply", None),
]


@pytest.mark.parametrize("name,role,backend", H200_NAMES)
def test_real_h200_kernel_names(name, role, backend):
    c = classify_gpu(name)
    assert (c.role, c.backend) == (role, backend)


@pytest.mark.parametrize("name,parents,role", [
    ("aten::bmm", (), "gemm"),
    ("aten::copy_", ("aten::masked_fill", "aten::clone"), "copy"),
    ("aten::copy_", ("aten::mul", "aten::to", "aten::_to_copy"), "other"),
    ("aten::fill_", ("aten::ones",), "mask_build"),
    ("aten::masked_fill_", (), "mask_apply"),
    ("aten::_safe_softmax", (), "softmax"),
    ("aten::_scaled_dot_product_flash_attention_for_cpu", (), "fused_attention"),
])
def test_cpu_op_roles(name, parents, role):
    assert classify_cpu(name, parents).role == role


def test_the_kernel_repos_programs_are_read_from_the_loaded_module():
    """No list of our kernel's names to drift: they come from the module `kernels` loads, and classify knows them."""
    from attnprof.variants import kernel_hub

    module = kernel_hub.load()
    names = kernel_names_of(module)
    assert set(names) >= {"attention_fwd", "attention_fwd_sm90", "attention_fwd_sm90_ws", "attention_fwd_sm90_wsp"}
    assert not any(n.startswith("_") for n in names)  # helpers such as _load_kv are not launched programs
    for name in names:
        assert (classify_gpu(name).role, classify_gpu(name).backend) == ("fused_attention", "kernel")


def test_a_kernel_repo_program_without_attention_in_its_name_is_known_once_loaded(tmp_path):
    import types

    from attnprof.backends import register_kernel_module

    (tmp_path / "_prog.py").write_text("import triton\n@triton.jit\ndef tile_loop(x):\n    pass\n"
                                       "@triton.jit\ndef _helper(x):\n    pass\n")
    module = types.ModuleType("fake_kernel")
    module.__file__ = str(tmp_path / "__init__.py")
    assert classify_gpu("tile_loop").role == "other"
    assert register_kernel_module(module) == ("tile_loop",)
    assert classify_gpu("tile_loop").backend == "kernel"
    module.KERNEL_NAMES = ("exported_name",)
    assert kernel_names_of(module) == ("exported_name",)


# --- short names: the real H200 names of tests/data and docs/results -----------------------------------------

def _h200_names():
    import gzip
    import json
    from pathlib import Path

    names = set()
    for f in (Path(__file__).parent / "data").glob("h200-*.trace.json.gz"):
        names |= {e["name"] for e in json.load(gzip.open(f))["traceEvents"] if e.get("cat") == "kernel"}
    return names


def test_short_names_of_real_h200_kernels():
    from attnprof.profiling.names import short_name

    names = _h200_names()
    assert names, "tests/data has H200 traces"
    shorts = {short_name(n) for n in names}
    assert all(len(s) <= 60 and "::" not in s and "const" not in s for s in shorts), shorts
    assert "softmax_warp_forward" in shorts
    assert "nvjet GEMM (sm90, 256×128 tile, TNT)" in shorts
    assert "mul (MulFunctor<float>)" in shorts
    assert "triu_tril_kernel" in shorts


@pytest.mark.parametrize("name, short", [
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x128_4x1x1_cga1x1x1_kernel0_0",
     "cuDNN SDPA flash fprop (sm90, 64×128×128 tile)"),
    ("void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl_nocast<at::native::"
     "direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const>(int)",
     "direct_copy_kernel_cuda"),
    ("void at::native::(anonymous namespace)::cunn_SoftMaxForwardReg<c10::BFloat16, float, c10::BFloat16, "
     "at::native::(anonymous namespace)::SoftMaxForwardEpilogue, long, 4>(c10::BFloat16*, c10::BFloat16 const*, long)",
     "cunn_SoftMaxForwardReg"),
    ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, "
     "cutlass::bfloat16_t, Flash_kernel_traits<128, 128, 64, 4, cutlass::bfloat16_t> >, false>(Params)",
     "FlashAttention flash_fwd (d128, 128×64 tile)"),
    ("fmha_cutlassF_bf16_aligned_64x128_rf_sm80(PyTorchMemEffAttention::AttentionKernel<cutlass::bfloat16_t>::Params)",
     "mem-efficient fwd bf16 (sm80, 64×128 tile)"),
    ("triton_tem_fused_flex_attention_0", "Triton flex_attention (template)"),
    ("Memcpy DtoD (Device -> Device)", "Memcpy DtoD (Device -> Device)"),
    ("aten::bmm", "aten::bmm"),
    ("attention_fwd_sm90_ws", "attention_fwd_sm90_ws"),
])
def test_short_name(name, short):
    from attnprof.profiling.names import short_name

    assert short_name(name) == short
