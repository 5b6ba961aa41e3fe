import pytest
import torch

from attnprof.errors import UsageError
from attnprof.workload import Workload


@pytest.mark.parametrize("bad", [dict(head_dim=0), dict(heads=6, kv_heads=4), dict(seq=-1), dict(batch=0),
                                 dict(dtype="fp7"), dict(mask="diagonal")])
def test_impossible_workloads_are_usage_errors(bad):
    with pytest.raises(UsageError):
        Workload(**bad)


def test_inputs_have_the_declared_layout_and_gqa_heads():
    inp = Workload(batch=2, heads=8, kv_heads=2, seq=5, kv_seq=7, head_dim=16).make_inputs(0)
    assert inp.q.shape == (2, 8, 5, 16)  # [B, Hq, Sq, D]
    assert inp.k.shape == inp.v.shape == (2, 2, 7, 16)  # [B, Hkv, Sk, D]


def test_same_seed_same_inputs_other_seed_other_inputs():
    w = Workload(seq=8)
    assert torch.equal(w.make_inputs(3).q, w.make_inputs(3).q)
    assert not torch.equal(w.make_inputs(3).q, w.make_inputs(4).q)


def test_causal_is_bottom_right_aligned():
    keep = Workload(batch=1, heads=1, seq=2, kv_seq=4, causal=True).valid_mask()
    # query 0 sees keys 0..2, query 1 sees keys 0..3 (the last query sees everything, as in decode)
    assert keep[0, 0].tolist() == [[True, True, True, False], [True, True, True, True]]


def test_left_padding_with_causal_makes_fully_masked_rows():
    w = Workload(batch=2, heads=1, seq=8, mask="pad-left", causal=True)
    keep = w.valid_mask()
    assert keep[0].any(-1).all()  # the first row of the batch is unpadded
    assert not keep[1, 0, 0].any()  # padded rows at the left see nothing at all


def test_transposed_inputs_are_strided_views():
    inp = Workload(seq=8, transposed=True).make_inputs()
    assert not inp.q.is_contiguous() and inp.q.shape == (2, 8, 8, 64)
