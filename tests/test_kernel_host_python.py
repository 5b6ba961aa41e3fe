"""kernels/flash-triton/host_python.py: the per-call Python before Triton's launcher, timed on the CPU. It runs, prints
one row per entry point, and refuses to run without the interpreter with one line and exit 2."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "kernels" / "flash-triton" / "host_python.py"


def _run(interpret: bool) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    return subprocess.run([sys.executable, str(SCRIPT), "--calls", "20"], capture_output=True, text=True, env=env,
                          timeout=300)


def test_times_each_entry_point():
    done = _run(True)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [line for line in done.stdout.splitlines() if line.startswith(("prefill", "decode"))]
    assert len(rows) == 3 and all(float(r.split()[-1]) > 0 for r in rows), done.stdout


def test_needs_the_interpreter():
    done = _run(False)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr


LAYOUTS = r"""
import sys, torch
sys.path.insert(0, sys.argv[1])
import host_python
mod = host_python.load(host_python.SOURCE)  # launches are no-ops: only the outputs' allocation is looked at
def contiguous(shape):
    return torch.empty(shape).stride()
def check(name, out, want):
    assert tuple(out.stride()) == tuple(want), (name, out.stride(), want)
def prefill(q, k, v):  # the Triton prefill program, named: short calls may take the decode program by default
    return mod.attention(q, k, v, None, True, config=mod.Config(32, 32, 4, 2, True))
h = torch.randn(1, 4, 64, 64, dtype=torch.float16)
q = h.transpose(1, 2)  # [B, S, H, D] view of [B, H, S, D]: the output takes this layout
check("prefill heads view", prefill(q, q, q), q.stride())
c = q.contiguous()
check("prefill contiguous", prefill(c, c, c), c.stride())
wide = torch.randn(1, 64, 8, 64, dtype=torch.float16)
s = wide[:, :, :4]  # heads sliced from a wider tensor: not dense, the output is contiguous
check("prefill sliced heads", prefill(s, c, c), contiguous((1, 64, 4, 64)))
kc = torch.randn(2, 128, 2, 64, dtype=torch.float16)
lens = torch.full((2,), 100, dtype=torch.int32)
qd = torch.randn(2, 1, 4, 64, dtype=torch.float16)
out, lse = mod.flash_attn_with_kvcache(qd, kc, kc, cache_seqlens=lens, return_softmax_lse=True, num_splits=2)
check("decode contiguous", out, qd.stride())
check("decode lse", lse, contiguous((2, 4, 1)))
assert lse.dtype == torch.float32 and out.dtype == torch.float16
qs = torch.randn(2, 1, 8, 64, dtype=torch.float16)[:, :, ::2]  # every other head: not contiguous
check("decode strided q", mod.flash_attn_with_kvcache(qs, kc, kc, cache_seqlens=lens), contiguous((2, 1, 4, 64)))
qp = torch.randn(4, 2, 1, 64, dtype=torch.float16).permute(1, 2, 0, 3)  # dense, heads outermost
check("decode permuted q", mod.flash_attn_with_kvcache(qp, kc, kc, cache_seqlens=lens), contiguous((2, 1, 4, 64)))
sp = torch.randn(64, 1, 4, 64, dtype=torch.float16).permute(1, 0, 2, 3)  # dense, sequence outermost
check("prefill permuted q", prefill(sp, c, c), contiguous((1, 64, 4, 64)))
print("layouts ok")
"""


def test_outputs_keep_their_layout_whichever_way_they_are_allocated():
    """A call whose output has q's exact strides allocates it with `torch.empty_like(q)` (less host time than
    `empty_strided`/`empty` with keyword arguments); any other q still gets the output layout the launch assumes:
    q's for a `[B, S, H, D]` view of `[B, H, S, D]`, contiguous otherwise (prefill and decode, with the LSE), also
    for a dense permuted q, whose strides `empty_like` would copy."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    done = subprocess.run([sys.executable, "-c", LAYOUTS, str(SCRIPT.parent)], capture_output=True, text=True,
                          env=env, timeout=300)
    assert done.returncode == 0 and "layouts ok" in done.stdout, done.stderr[-2000:]
