"""The Python flash-triton runs per call before Triton's launcher, timed on any machine (no GPU needed).

`host_cost.py` measures a call's whole host time on the GPU (our Python, Triton's launcher, the driver). This script
isolates the first part: it loads the kernel source from a directory (this checkout's by default, or another
version's, to compare), replaces `_launch.Launcher`'s launches with no-ops, and times repeat calls of the three
shapes that matter for host cost on CPU tensors: a prefill call (1x16x1024x64, causal, `[B, H, S, D]` views), decode
at batch 16 over 4k keys (one split on the CPU) and decode at batch 1 with 8 splits (workspace and merge counters).
The CPU's tensors and allocator are not CUDA's, so the numbers compare versions on one machine; they are not a
GPU call's host time.

    TRITON_INTERPRET=1 python kernels/flash-triton/host_python.py [SOURCE_DIR] [--calls 20000]
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
import timeit
from pathlib import Path

import torch

SOURCE = Path(__file__).resolve().parent / "torch-ext" / "flash_triton"


def load(source: Path):
    """The kernel package at `source` with every launch a no-op."""
    spec = importlib.util.spec_from_file_location("flash_triton_host", source / "__init__.py",
                                                  submodule_search_locations=[str(source)])
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    launch = importlib.import_module(spec.name + "._launch")
    launch.Launcher.__call__ = lambda self, key, grid, args, meta: None
    if hasattr(launch.Launcher, "launch_bases"):
        launch.Launcher.launch_bases = lambda self, key, grid, args: True
    return mod


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("source", nargs="?", type=Path, default=SOURCE)
    p.add_argument("--calls", type=int, default=20000)
    args = p.parse_args()
    if os.environ.get("TRITON_INTERPRET") != "1":
        print("host_python: run with TRITON_INTERPRET=1 (the kernels are never launched, but the CPU build needs it)",
              file=sys.stderr)
        return 2
    mod = load(args.source)
    qh, kh, vh = (torch.randn(1, 16, 1024, 64, dtype=torch.float16) for _ in range(3))
    q, k, v = (t.transpose(1, 2) for t in (qh, kh, vh))
    qd = torch.randn(16, 1, 32, 128, dtype=torch.float16)
    kc, vc = (torch.randn(16, 4096, 8, 128, dtype=torch.float16) for _ in range(2))
    lens = torch.full((16,), 4096, dtype=torch.int32)
    q1, k1, v1, l1 = qd[:1].clone(), kc[:1].clone(), vc[:1].clone(), lens[:1].clone()
    calls = {
        "prefill 1x16x1024x64 causal": lambda: mod.flash_attn_func(q, k, v, causal=True),
        "decode B=16 over 4k": lambda: mod.flash_attn_with_kvcache(qd, kc, vc, cache_seqlens=lens),
        "decode B=1 over 4k, 8 splits": lambda: mod.flash_attn_with_kvcache(q1, k1, v1, cache_seqlens=l1,
                                                                             num_splits=8),
    }
    print(f"source: {args.source}")
    print(f"{'call':<32} {'python us/call':>15}")
    for name, fn in calls.items():
        fn()  # the signature's first call: checks and plan
        best = min(timeit.repeat(fn, number=args.calls, repeat=3)) / args.calls * 1e6
        print(f"{name:<32} {best:15.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
