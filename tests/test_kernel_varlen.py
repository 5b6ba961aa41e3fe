"""flash-triton's `flash_attn_varlen_func` on the CPU, through Triton's interpreter, against the fp64 oracle.

As in test_kernel_interpret.py, the kernel runs in a child interpreter started with TRITON_INTERPRET=1 (this file
is also that child: `python tests/test_kernel_varlen.py` prints one JSON line); the tests assert on what it
measured. Rule: the kernel's norm-relative error over all sequences of a case is at most twice that of plain
eager attention in the same dtype (fp16: the interpreter gets bf16 `tl.dot` wrong, issue 17; bf16 runs on the GPU,
test_kernel_serving_cuda.py). Bad arguments are refused before launch, so those tests run in this process.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from interpreter_child import run_child

INTERPRETER_CHILD = True  # its child starts in the background once tests are collected (conftest.py)

ROOT = Path(__file__).resolve().parents[1]
REPO = ROOT / "kernels" / "flash-triton"

CASES = {  # name: (query lengths, key lengths, Hq, Hkv, D, causal)
    "prefill-gqa-causal": ([5, 0, 1, 37, 70], [5, 0, 1, 37, 70], 4, 2, 64, True),
    "chunked-causal-d128": ([3, 20, 1, 9, 2], [40, 20, 1, 4, 0], 2, 1, 128, True),  # q > k: rows that see no key
    "full-d64": ([17, 33, 1], [50, 2, 9], 4, 4, 64, False),
}


# ---------------------------------------------------------------------------------------------------------------
# The child: runs with TRITON_INTERPRET=1 from its first import on.
# ---------------------------------------------------------------------------------------------------------------
def _child() -> dict:
    from attnprof.variants import kernel_hub
    from kernel_ref import Check, packed

    mod = kernel_hub.load(kernel_hub.parse_spec(str(REPO)))
    gen = torch.Generator().manual_seed(0)
    results: dict = {"interpreted": bool(mod.INTERPRETED)}
    outs = {}
    for name, (lq, lk, hq, hkv, d, causal) in CASES.items():
        q, cu_q = packed(lq, hq, d, torch.float16, generator=gen)
        k, cu_k = packed(lk, hkv, d, torch.float16, generator=gen)
        v = torch.randn(k.shape, generator=gen).half()
        out = mod.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lq), max(lk), causal=causal)
        check = Check()
        for i in range(len(lq)):
            rows, keys = slice(cu_q[i], cu_q[i + 1]), slice(cu_k[i], cu_k[i + 1])
            check.add(out[rows], q[rows], k[keys], v[keys], causal, d ** -0.5)
        blind = [int(cu_q[i]) + j for i in range(len(lq)) for j in range(lq[i]) if causal and j + lk[i] - lq[i] < 0]
        results[name] = {**check.result(), "shape": list(out.shape), "dtype": str(out.dtype),
                         "blind_rows_zero": bool((out[blind] == 0).all()) if blind else True}
        outs[name] = (q, k, v, cu_q, cu_k, out)

    # transformers' layout: [total, H, D] views of [1, H, total, D] tensors (strided): same program, pointer loads
    q, k, v, cu_q, cu_k, want = outs["prefill-gqa-causal"]
    qs, ks, vs = (t.transpose(0, 1).contiguous().transpose(0, 1) for t in (q, k, v))  # same values, strided
    got = mod.flash_attn_varlen_func(qs, ks, vs, cu_q, cu_k, 70, 70, causal=True)
    results["strided"] = {"contiguous_input": qs.is_contiguous(), "same": bool(torch.equal(got, want))}
    # a grid for a longer max_seqlen_q than any sequence (transformers pads it for CUDA graphs): same output
    got = mod.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 128, 128, causal=True)
    results["padded_grid"] = {"same": bool(torch.equal(got, want))}

    # equal lengths: the varlen launch and the dense one are the same program on the same rows
    dense_q, dense_k, dense_v = (torch.randn(3, 40, h, 64, generator=gen).half() for h in (4, 2, 2))
    cu = torch.tensor([0, 40, 80, 120], dtype=torch.int32)
    varlen = mod.flash_attn_varlen_func(dense_q.flatten(0, 1), dense_k.flatten(0, 1), dense_v.flatten(0, 1), cu, cu,
                                        40, 40, causal=True)
    dense = mod.flash_attn_func(dense_q, dense_k, dense_v, causal=True)
    results["dense_equivalence"] = {"same": bool(torch.equal(varlen.view(3, 40, 4, 64), dense)),
                                    "dense_program": mod.choose_config(dense_q, dense_k, True).label()}
    # the dense entry point on [B, S, H, D] views of [B, H, S, D] tensors (what transformers passes): no copy needed
    views = [t.transpose(1, 2).contiguous().transpose(1, 2) for t in (dense_q, dense_k, dense_v)]
    results["dense_strided"] = {"contiguous_input": views[0].is_contiguous(),
                                "same": bool(torch.equal(mod.flash_attn_func(*views, causal=True), dense))}

    # TMA tiles crossing a sequence end: inf/NaN in the next sequence's first keys/values must not reach this one
    lq = lk = [45, 40]
    q, cu_q = packed(lq, 2, 64, torch.float16, generator=gen)
    k, cu_k = packed(lk, 2, 64, torch.float16, generator=gen)
    v = torch.randn(k.shape, generator=gen).half()
    k_bad, v_bad = k.clone(), v.clone()
    k_bad[45:53] = float("nan")
    v_bad[45:53] = float("inf")
    out = mod.varlen_attention(q, k_bad, v_bad, cu_q, cu_k, 45, None, False, config=mod.Config(32, 32, 4, 2, True))
    check = Check()
    check.add(out[:45], q[:45], k[:45], v[:45], False, 64 ** -0.5)
    results["tma_neighbour_inf"] = check.result()
    try:  # the Gluon program over packed sequences has no interpreter: refused with the reason, never run wrong
        mod.varlen_attention(q, k, v, cu_q, cu_k, 45, None, True, config=mod.Config(128, 128, 4, 3, gluon=True,
                                                                                     warp_specialize=True))
        results["gluon_on_cpu"] = ""
    except ValueError as e:
        results["gluon_on_cpu"] = str(e)
    return results


# ---------------------------------------------------------------------------------------------------------------
# The tests
# ---------------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def interp() -> dict:
    return run_child(__file__)


def test_child_ran_the_interpreter(interp):
    assert interp["interpreted"]


@pytest.mark.parametrize("case", list(CASES))
def test_matches_oracle_within_twice_eager(interp, case):
    r = interp[case]
    total, hq, d = sum(CASES[case][0]), CASES[case][2], CASES[case][4]
    assert r["shape"] == [total, hq, d] and r["dtype"] == "torch.float16"
    assert r["finite"] and r["err"] <= 2 * r["eager"], f"kernel {r['err']:.3g} > 2 x eager fp16 {r['eager']:.3g}"
    assert r["blind_rows_zero"], "rows that see no key must be zeros"


def test_strided_views_as_transformers_passes_them(interp):
    r = interp["strided"]
    assert not r["contiguous_input"] and r["same"]


def test_a_longer_grid_than_the_longest_sequence_changes_nothing(interp):
    assert interp["padded_grid"]["same"]


def test_equal_lengths_are_the_dense_kernel_bit_for_bit(interp):
    r = interp["dense_equivalence"]
    assert r["same"], r
    assert "decode" not in r["dense_program"]


def test_dense_entry_point_reads_strided_views(interp):
    r = interp["dense_strided"]
    assert not r["contiguous_input"] and r["same"]


def test_non_finite_values_in_the_next_sequence_do_not_leak_through_a_tma_tile(interp):
    r = interp["tma_neighbour_inf"]
    assert r["finite"] and r["err"] <= 2 * r["eager"], r


def test_gluon_varlen_refused_on_the_cpu_with_the_reason(interp):
    assert "needs a CUDA GPU" in interp["gluon_on_cpu"] and "ws gluon" in interp["gluon_on_cpu"]


def _packed(total=10, hq=2, hkv=2, d=64, dtype=torch.float16):
    cu = torch.tensor([0, 4, total], dtype=torch.int32)
    return (torch.randn(total, hq, d, dtype=dtype), torch.randn(total, hkv, d, dtype=dtype),
            torch.randn(total, hkv, d, dtype=dtype), cu, cu.clone(), 6, 6)


@pytest.mark.parametrize("change, words", [
    (dict(dropout_p=0.1), "dropout_p=0.1"),
    (dict(window_size=(16, -3)), "window_size=(16, -3)"),
    (dict(softcap=float("inf")), "softcap=inf"),
    (dict(alibi_slopes=torch.ones(2)), "alibi_slopes"),
    (dict(return_attn_probs=True), "return_attn_probs"),
    (dict(block_table=torch.zeros(2, 1, dtype=torch.int32)), "block_table"),
    (dict(s_aux=torch.zeros(3)), "s_aux"),
], ids=["dropout", "bad-window", "bad-softcap", "alibi", "probs", "block-table", "bad-sinks"])
def test_unsupported_arguments_are_refused_by_name(change, words):
    from kernels import get_local_kernel

    mod = get_local_kernel(REPO)
    with pytest.raises(ValueError, match="flash_attn_varlen_func: " + words.replace("(", r"\(").replace(")", r"\)")):
        mod.flash_attn_varlen_func(*_packed(), **change)


@pytest.mark.parametrize("make, words", [
    (lambda q, k, v, cq, ck, mq, mk: (q, k, v, cq.float(), ck, mq, mk), "int32"),
    (lambda q, k, v, cq, ck, mq, mk: (q, k, v, cq, ck[:2], mq, mk), "as many as cu_seqlens_q"),
    (lambda q, k, v, cq, ck, mq, mk: (q[None], k, v, cq, ck, mq, mk), "3-D"),
    (lambda q, k, v, cq, ck, mq, mk: (q, k, v[:, :1], cq, ck, mq, mk), "same shape"),
    (lambda q, k, v, cq, ck, mq, mk: (q.float(), k, v, cq, ck, mq, mk), "float16 and bfloat16"),
    (lambda q, k, v, cq, ck, mq, mk: (q[..., :48], k[..., :48], v[..., :48], cq, ck, mq, mk), "head dim 48"),
    (lambda q, k, v, cq, ck, mq, mk: (q[..., ::2], k, v, cq, ck, mq, mk), "contiguous last"),
], ids=["cu-dtype", "cu-length", "4d", "kv-shape", "fp32", "d48", "strided-head-dim"])
def test_bad_inputs_refused_before_launch(make, words):
    from kernels import get_local_kernel

    mod = get_local_kernel(REPO)
    with pytest.raises(ValueError, match=words):
        mod.flash_attn_varlen_func(*make(*_packed()))


if __name__ == "__main__":
    assert os.environ.get("TRITON_INTERPRET") == "1", "run the child with TRITON_INTERPRET=1"
    print(json.dumps(_child()))
