"""`attnprof.run`: the one measurement path. Every status it can give, each from a real variant on real tensors."""

from __future__ import annotations

import torch

from attnprof.oracle.agreement import Reference
from attnprof.oracle.gate import Gate
from attnprof.run import Status, asked_bytes, failure, run
from attnprof.stages import run_stages
from attnprof.variants import VARIANTS, Variant
from attnprof.variants.naive import naive_attention
from attnprof.workload import Workload

W = Workload(batch=1, heads=2, seq=24, head_dim=16)


def _scaled(factor: float) -> Variant:
    def attn(inputs):
        return naive_attention(inputs) * factor

    return Variant(f"times-{factor}", attn)


def test_ok_run_measures_what_was_asked():
    inputs = W.make_inputs(0)
    r = run(VARIANTS["sdpa"], W, inputs, reference=Reference.of(inputs), watch=True, reps=3, warmup=1,
            memory=True)
    assert r.status is Status.OK and r.status == "ok" and r.reason is None
    assert r.agreement.norm_rel < 1e-6
    assert [c.backend for c in r.calls] == ["cpu_flash"]
    assert r.timing.reps == 3 and r.timing.p50 > 0
    assert r.peak_mib is not None or r.peak_note


def test_rejected_before_running_with_the_variants_reason():
    calls = []
    refuse = Variant("picky", lambda inputs: calls.append(1), supports=VARIANTS["sdpa-cudnn"].supports)
    r = run(refuse, W, reps=3)
    assert r.status is Status.REJECTED and "cudnn" in r.reason and not calls


def test_a_crash_is_error_with_its_first_line():
    def broken(inputs):
        raise ValueError("bad block size\nmore detail")

    r = run(Variant("broken", broken), W, reps=3)
    assert r.status is Status.ERROR and r.reason == "ValueError: bad block size" and r.timing is None


def test_a_nan_output_is_error_never_ok():
    def nan(inputs):
        return naive_attention(inputs) * float("nan")

    inputs = W.make_inputs(0)
    r = run(Variant("nan", nan), W, inputs, reference=Reference.of(inputs))
    assert r.status is Status.ERROR and "non-finite output" in r.reason


def test_out_of_memory_names_the_bytes_asked():
    def greedy(inputs):
        torch.empty(1 << 50, dtype=torch.uint8)  # a petabyte: the CPU allocator refuses

    r = run(Variant("greedy", greedy), W, reps=3)
    assert r.status is Status.OOM and r.asked_bytes == 1 << 50 and "asked for 1125899906842624 bytes" in r.reason


def test_failure_reads_cuda_and_cpu_allocator_messages_alike():
    cuda = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity")
    assert failure(cuda)[0] is Status.OOM and asked_bytes(cuda) == 2 * 2**30
    assert failure(RuntimeError("")) == (Status.ERROR, "RuntimeError")


def test_lossy_only_with_a_gate_and_only_beyond_it():
    w = W.replace(dtype="fp32")
    inputs = w.make_inputs(1)
    ref = Reference.of(inputs, scale=True)
    gate = Gate.of(inputs, ref, w.dtype)
    assert run(_scaled(1.0), w, inputs, reference=ref, gate=gate).status is Status.OK
    off = run(_scaled(1.001), w, inputs, reference=ref, gate=gate)
    assert off.status is Status.LOSSY and "error" in off.reason and not off.verdict.ok
    assert run(_scaled(1.001), w, inputs, reference=ref).status is Status.OK  # no gate: finite is ok


def test_wrong_output_shape_is_an_error_row_naming_both_shapes():
    got = run(Variant("short", lambda inputs: inputs.q[:, :, :1]), W, reference=Reference.of(W.make_inputs(0)))
    assert got.status is Status.ERROR
    assert f"returned a tensor of shape [{W.batch}, {W.heads}, 1, {W.head_dim}]" in got.reason
    assert f"expected a tensor of shape [{W.batch}, {W.heads}, {W.seq}, {W.head_dim}]" in got.reason


def test_stages_pad_left_error_is_measured_on_rows_that_see_a_key(tmp_path):
    """Issue 14: naive with left padding reported max_rel_err = nan (its fully masked rows are NaN)."""
    w = Workload(batch=2, heads=2, seq=16, head_dim=8, mask="pad-left")
    (naive, nan) = run_stages(w, [VARIANTS["naive"], Variant("nan", lambda i: naive_attention(i) / 0 * 0)],
                              tmp_path, steps=1, reps=20)
    assert naive.status == "ok" and naive.max_rel_err < 1e-6
    assert nan.status == "error" and "non-finite output" in nan.reason
