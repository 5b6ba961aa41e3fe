"""The persistent Gluon program's tile plan: which CTA computes which 128-row tiles, in which order.

Why a plan, not a counter: each CTA's producer warp and both its consumer warpgroups walk the same tiles; read from
one precomputed list they agree without any communication between them (an atomic tile counter would need one
partition to fetch and hand the tile to the others). The list is made once per shape on the host and kept on the
device (`plan_tensor`).

Why this order (longest processing time first): a causal tile of query block m walks m + 1 key blocks, so tiles
differ up to 128x in length. A static round-robin left most CTAs idle while a few finished long tiles (TUNING.md
step 7: 0.70x at 16k). Here the tiles are taken heaviest first and each goes to the CTA with the least work so far
(greedy LPT: the last tiles, the lightest, even the CTAs out), in sections of `l2_heads` (batch, head)s at a time
so that the K/V being read fits in L2 (FlashAttention's SingleTileLPTScheduler keeps the same sections). A tile's
cost is its key blocks plus `FIXED_BLOCKS` for what a tile costs besides its key loop (Q, the first block, the
epilogue: ~4.3 µs against 1.53 µs a key block on the per-tile program at head dim 128, `kernel_vs_fa4_bench.py
--timeline` on an H100; the persistent program hides part of it, so fewer).
"""

from __future__ import annotations

import functools
import heapq

import torch

FIXED_BLOCKS = 2  # a tile's cost besides its key loop, in key blocks


def tile_blocks(m: int, sq: int, sk: int, block_m: int, block_n: int, causal: bool,
                window: tuple[int, int] | None = None) -> int:
    """The key blocks query tile m walks, as the program computes them (`_gluon._plan_tile`): up to the diagonal
    (bottom-right) when causal, and with a `window` (left, right keys, both >= 0) from the first row's window start
    to the last row's window end."""
    end = min((m + 1) * block_m + sk - sq, sk) if causal else sk
    first = 0
    if window is not None:
        end = min(end, (m + 1) * block_m + sk - sq + window[1])
        first = max(m * block_m + sk - sq - window[0], 0) // block_n
    return max(-(-end // block_n) - first, 0)


@functools.lru_cache(maxsize=256)
def lpt_plan(n_m: int, n_bh: int, ctas: int, sq: int, sk: int, block_m: int, block_n: int, causal: bool,
             l2_heads: int, window: tuple[int, int] | None = None) -> tuple[int, ...]:
    """The plan for `n_bh` (batch, head)s of `n_m` query tiles each on `ctas` CTAs: `ctas + 1` offsets, then the
    tiles (`off_bh * n_m + m`, m the query block), CTA p's in entries [offsets[p], offsets[p + 1]) of the tiles, in the
    order it computes them. `window`: as `tile_blocks`."""
    def blocks(m: int) -> int:
        return tile_blocks(m, sq, sk, block_m, block_n, causal, window)

    order = sorted(range(n_m), key=lambda m: -blocks(m))  # heaviest query block first (stable: ties in m order)
    loads = [(0, p) for p in range(ctas)]  # (work so far, CTA): a heap, the least loaded on top
    lists: list[list[int]] = [[] for _ in range(ctas)]
    width = max(1, l2_heads)
    for first in range(0, n_bh, width):
        section = range(first, min(first + width, n_bh))
        for m in order:  # within a section every head's heaviest tile before any head's next one
            cost = blocks(m) + FIXED_BLOCKS
            for bh in section:
                load, p = heapq.heappop(loads)
                lists[p].append(bh * n_m + m)
                heapq.heappush(loads, (load + cost, p))
    offsets = [0]
    for tiles in lists:
        offsets.append(offsets[-1] + len(tiles))
    return tuple(offsets) + tuple(t for tiles in lists for t in tiles)


_ON_DEVICE: dict = {}  # (lpt_plan's arguments, device) -> (pinned host tensor, device tensor)
_CAPTURED: list = []  # the pinned sources of plans copied inside a CUDA graph capture (the graph reads them again)


def plan_tensor(device: torch.device, *args) -> torch.Tensor:
    """`lpt_plan(*args)` as an int32 tensor on `device`, made once per shape and device (keyed by the arguments, not
    the plan: a call's host time must not hash thousands of entries). The copy is issued on the current stream from
    pinned memory kept alive here. Inside a CUDA graph capture the copy is captured and runs at each replay; that
    tensor is not kept for calls outside the graph, which would read it before any replay wrote it."""
    key = (args, device)
    if key in _ON_DEVICE:
        return _ON_DEVICE[key][1]
    host = torch.tensor(lpt_plan(*args), dtype=torch.int32)
    if device.type != "cuda":
        return host.to(device)
    host = host.pin_memory()
    dev = host.to(device, non_blocking=True)
    if torch.cuda.is_current_stream_capturing():
        _CAPTURED.append(host)
    else:
        _ON_DEVICE[key] = (host, dev)
    return dev


__all__ = ["FIXED_BLOCKS", "lpt_plan", "plan_tensor", "tile_blocks"]
