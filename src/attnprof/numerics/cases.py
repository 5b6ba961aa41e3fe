"""The default workloads of the numerics gate: the shapes where attention implementations are usually wrong.

Each case exists for a bug class seen in real kernels:

| case | what it catches |
| --- | --- |
| odd-causal    | Sq = Sk = 97 (not a multiple of any block), head dim 80 (not a power of two): tail blocks, causal diagonal |
| odd-full      | head dim 59 (not even a multiple of 8), no mask: padding of the head dim, scale 1/sqrt(59) |
| gqa           | 8 query heads over 2 kv heads: which kv head a query head reads |
| chunk         | Sq = 33 < Sk = 161, causal: bottom-right alignment (top-left is the classic bug) |
| decode        | Sq = 1 over a long key, GQA: split-K reductions and low-precision accumulators |
| pad-right     | per-batch key lengths with padding on the right, causal |
| pad-left      | padding on the left, causal: the first rows of short sequences see no key at all |
| fully-masked  | Sq = 48 > Sk = 40, causal bottom-right: the first 8 rows see no key (must be zeros, never NaN) |

Sizes grow on CUDA (longer keys, where accumulation errors show) but stay small enough that the whole set,
every backend, two dtypes, runs in seconds on a GPU and well under a minute on a CPU (flex compiles per shape).
"""

from __future__ import annotations

from dataclasses import dataclass

from attnprof.workload import Workload


@dataclass(frozen=True)
class Case:
    name: str
    workload: Workload
    why: str

    def to_json(self) -> dict:
        return {"name": self.name, "why": self.why, "workload": self.workload.to_json()}


def default_cases(device: str, dtype: str) -> list[Case]:
    """The default set for one device and dtype (layout `[B, H, S, D]`, causal bottom-right aligned)."""
    gpu = device.startswith("cuda")
    s = 1025 if gpu else 97  # odd query/key length
    long_key = 16385 if gpu else 4097  # decode: one query over a long key
    w = Workload(batch=2, heads=4, seq=s, head_dim=80, dtype=dtype, causal=True, device=device)
    return [
        Case("odd-causal", w, f"Sq=Sk={s}, head dim 80: tail blocks and the causal diagonal"),
        Case("odd-full", w.replace(head_dim=59, causal=False), "head dim 59 (not a multiple of 8), no mask"),
        Case("gqa", w.replace(heads=8, kv_heads=2, seq=128 if not gpu else 1024, kv_seq=128 if not gpu else 1024,
                              head_dim=64),
             "8 query heads over 2 kv heads: the query→kv head map"),
        Case("chunk", w.replace(seq=33, kv_seq=161 if not gpu else 2049, head_dim=64),
             "Sq < Sk, causal: bottom-right alignment"),
        Case("decode", w.replace(batch=3, heads=8, kv_heads=2, seq=1, kv_seq=long_key, head_dim=128),
             f"Sq=1 over {long_key} keys, GQA: long reductions, low-precision accumulators"),
        Case("pad-right", w.replace(batch=4, seq=77 if not gpu else 777, head_dim=64, mask="pad-right"),
             "per-row key lengths, padding on the right, causal"),
        Case("pad-left", w.replace(batch=4, seq=77 if not gpu else 777, head_dim=96, mask="pad-left"),
             "padding on the left, causal: early rows of short sequences see no key"),
        Case("fully-masked", w.replace(seq=48, kv_seq=40, head_dim=64),
             "Sq > Sk, causal bottom-right: the first rows see no key and must be zeros"),
    ]
