"""How the decode program is launched: its config, the M tile, the number of key splits, the merge counters.

Everything here is decided from shapes on the host (never from `cache_seqlens`, which lives on the device), so a
decode step launches the same grid every time its shapes repeat and can be captured in a CUDA graph.

Splits: with fewer CTAs than ~0.8 × the CTA slots (`ctas_per_sm` × SMs; FlashAttention-2 counts 2 per SM, we count
1), split the keys so that one wave of CTAs fills the slots best: the largest split count that fits in one wave
(`num_splits_heuristic`). Batch 1 with 8 KV heads on 132 SMs gets 16 splits (128 CTAs), batch 2 8, batch 4 4; batch
64 gets none. FlashAttention-2 (`num_splits_heuristic` in flash_api.cpp) takes the smallest count within 85 % of the
best wave efficiency over any number of waves: 14 at batch 1 over 32k keys, 112 of 132 SMs busy, 2 % slower on an
H100 (TUNING.md step 20); a second wave lost more (32 splits). The split length is a whole number of key blocks.

Counters (the fused merge): one int32 per (b, kv head, M tile), 0 before a call and put back to 0 by the CTA that
merges. They come from a ring of zeros per device, handed out as consecutive ranges (the ring and the range's first
index: a slice would cost a tensor view per call), so calls in flight on different streams use different counters.
The first ring is made outside any CUDA-graph capture (zeros must be
real before a graph reads them); a call whose first use is inside a capture gets its own zeroed counters (the
memset is captured with it).
"""

from __future__ import annotations

import dataclasses
import functools
import threading
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class DecodeConfig:
    """Launch shape of the decode program (`_decode.py`): key block, warps, pipelining depth, how partials merge."""

    block_n: int = 0  # keys per tile; 0: by head dim (`for_head_dim`)
    num_warps: int = 4
    num_stages: int = 3
    fused_reduce: bool = True  # the last CTA of a tile merges the splits (one launch); else a second launch does
    num_splits: int = 0  # 0: the heuristic below; n > 0: n splits (capped at the number of key blocks)
    max_block_m: int = 64  # the GQA group's query rows per M tile (Sq x Hq/Hkv rows, padded to >= 16)
    # CTA slots per SM the split heuristic fills. FlashAttention-2 counts 2; on the H200 1 (half the splits, twice
    # as long: less to merge, longer K/V streams) is faster at batch 1-4 and equal above (TUNING.md step 15)
    ctas_per_sm: int = 1
    # The merge: `merge_group` splits' partials loaded per L2 round trip (1 or 4), and with `prefetch_merge` the next
    # group loaded while this one merges (`_decode._reduce_splits`). Four, no prefetch: batch 1 at 8k 19.6 -> 18.1 µs
    # against cuDNN's 18.6 on an H100, where one partial per trip with prefetch took 19.6 (TUNING.md step 19).
    prefetch_merge: bool = False
    merge_group: int = 4
    # A floor on the keys per split (0: none): slots left empty rather than splits too short to pay for their merge
    min_split_keys: int = 0

    def __post_init__(self) -> None:
        if self.merge_group not in (1, 4):
            raise ValueError(f"DecodeConfig.merge_group must be 1 or 4 (got {self.merge_group})")

    def for_head_dim(self, d: int, page: int = 0) -> DecodeConfig:
        """This config with block_n decided: 128-key tiles up to head dim 128 (three stages of K and V: 192 KiB of
        shared memory; 8-16 % faster than 64 at batch 1-64 on the H200), 64 above (256: the same), and 64 over pages
        of fewer than 128 keys (a tile spanning pages loads one block-table entry per row: 128-key tiles over 64-key
        pages run 11-25 % slower than dense, 64 over 64 within 0-7 %; TUNING.md steps 8 and 15)."""
        if self.block_n:
            return self
        return dataclasses.replace(self, block_n=128 if d <= 128 and not 0 < page < 128 else 64)

    def label(self) -> str:
        return (f"decode {self.block_n or 'auto'} w{self.num_warps} s{self.num_stages} "
                + ("fused" if self.fused_reduce else "2-launch")
                + (f" splits={self.num_splits}" if self.num_splits else "")
                + f" {self.ctas_per_sm}/SM" + (" prefetch" if self.prefetch_merge else "")
                + (f" merge{self.merge_group}" if self.merge_group != 1 else "")
                + (f" >={self.min_split_keys}/split" if self.min_split_keys else ""))


DEFAULT = DecodeConfig()
# Over an FP8 cache a split streams half the bytes: two CTA slots per SM (twice the splits) were 1.22x at batch 16 over
# 8k keys and 1.12x at batch 1 over 32k on an H100, the same where one wave holds no split (batch 64), but 0.94x at
# batch 1 over 8k, where each of 33 splits held 256 keys (docs/results/kernel-fp8-decode/tune): at least 512 keys per
# split gives that shape one slot's 16 splits and leaves the others as they were
DEFAULT_FP8 = DecodeConfig(ctas_per_sm=2, min_split_keys=512)
MAX_SPLITS = 128
_CPU_SMS = 4  # the interpreter has no SMs; a small number makes the heuristic split small test shapes too


@dataclass(frozen=True)
class Plan:
    """The grid of one decode call."""

    block_m: int
    m_tiles: int
    num_splits: int
    split_len: int  # keys per split, a multiple of block_n


def cdiv(a: int, b: int) -> int:
    """Plain integer ceil-division: `triton.cdiv` is a jit function, ~8 µs per call from the host."""
    return -(-a // b)


def block_m_for(rows: int, cfg: DecodeConfig) -> int:
    """Rows of the M tile: the GQA group's Sq x G rows rounded up to a power of two, 16 <= BLOCK_M <= max_block_m."""
    return max(16, min(cfg.max_block_m, 1 << (max(rows, 1) - 1).bit_length()))


_SMS: dict[torch.device, int] = {}


def sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return _CPU_SMS
    if device not in _SMS:
        _SMS[device] = torch.cuda.get_device_properties(device).multi_processor_count
    return _SMS[device]


def num_splits_heuristic(ctas: int, slots: int, n_blocks: int, max_splits: int) -> int:
    """The largest split count whose CTAs fit in one wave of the slots (the module docstring), counting only counts
    that change the key blocks per split (another only adds empty splits)."""
    if ctas >= 0.8 * slots:
        return 1
    max_splits = min(max_splits, slots // ctas, n_blocks)
    return next((s for s in range(max_splits, 1, -1) if -(-n_blocks // s) != -(-n_blocks // (s - 1))), 1)


@functools.lru_cache(maxsize=4096)
def plan(batch: int, hkv: int, rows: int, capacity: int, device: torch.device, cfg: DecodeConfig,
         num_splits: int = 0) -> Plan:
    """Grid for `rows` = Sq x G query rows per kv head over a cache of `capacity` key positions (a function of
    shapes only, cached: a decode loop asks for the same few grids every step)."""
    block_m = block_m_for(rows, cfg)
    m_tiles = cdiv(rows, block_m)
    n_blocks = max(1, cdiv(capacity, cfg.block_n))
    wanted = num_splits or cfg.num_splits
    if wanted:
        splits = max(1, min(wanted, n_blocks, MAX_SPLITS))
    else:
        most = max(1, n_blocks * cfg.block_n // cfg.min_split_keys) if cfg.min_split_keys else MAX_SPLITS
        splits = num_splits_heuristic(batch * hkv * m_tiles, cfg.ctas_per_sm * sm_count(device), n_blocks,
                                      min(MAX_SPLITS, most))
    split_len = cdiv(n_blocks, splits) * cfg.block_n
    return Plan(block_m, m_tiles, cdiv(n_blocks * cfg.block_n, split_len), split_len)


_RING_SIZE = 1 << 20
_rings: dict[torch.device, list] = {}  # device -> [zeros, next free index]
_lock = threading.Lock()


def counter_slot(device: torch.device, n: int) -> tuple[torch.Tensor, int]:
    """`n` int32 counters that are 0 now and that the merging CTAs put back to 0 (see the module docstring), as
    (counters, index of the first): the device's ring and a range of it, or a fresh zeroed tensor and 0."""
    with _lock:
        ring = _rings.get(device)
        if n > _RING_SIZE or (ring is None and device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
            return torch.zeros(n, dtype=torch.int32, device=device), 0
        if ring is None:
            zeros = outside_graph_pools(device, lambda: torch.zeros(_RING_SIZE, dtype=torch.int32, device=device))
            ring = _rings[device] = [zeros, 0]
        start = ring[1] if ring[1] + n <= _RING_SIZE else 0
        ring[1] = start + -(-n // 16) * 16  # ranges start 64-byte aligned (the merge's atomics, one line apart)
        return ring[0], start


_ones: dict[torch.device, torch.Tensor] = {}


def one_on(device: torch.device) -> torch.Tensor:
    """fp32 1.0 on `device`, one per device for the process (the descale an FP8 call without one reads), made by
    `outside_graph_pools`: a call's cached plan that made its own inside a CUDA-graph warm-up kept an allocation of
    the graph's pool alive, and torch.compile's reduce-overhead decode over an FP8 cache failed with "Detected 1
    tensor(s) in the cudagraph pool not tracked as outputs" (H100)."""
    with _lock:
        if device not in _ones:
            _ones[device] = outside_graph_pools(device, lambda: torch.ones(1, dtype=torch.float32, device=device))
        return _ones[device]


def outside_graph_pools(device: torch.device, make) -> torch.Tensor:
    """`make()` (a tensor kept for the process), run on a helper thread. torch.compile's CUDA-graph trees warm a
    graph up with this thread's allocations routed into the graph's private pool; a tensor made there and kept alive
    here is an allocation the tree does not track ("Detected 1 tensor(s) in the cudagraph pool not tracked as
    outputs", seen on the H200). Another thread allocates from the ordinary pool; it waits for its kernels, so any
    stream may use the tensor at once."""
    if device.type != "cuda":
        return make()
    made: list = []

    def run() -> None:
        with torch.cuda.device(device):
            made.append(make())
            torch.cuda.current_stream(device).synchronize()

    worker = threading.Thread(target=run, name="flash-triton-outside-graph-pools")
    worker.start()
    worker.join()
    if not made:
        raise RuntimeError(f"flash-triton: could not allocate a process-wide tensor on {device}")
    return made[0]
