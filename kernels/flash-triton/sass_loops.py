"""The Gluon programs' key loops as ptxas schedules them, read from sm_90 SASS on any machine (no GPU needed).

For each program (the dense warp-specialized one, its persistent and varlen forms, the one-warpgroup one, the FP8
one), with and without `Config.v_wait_early`, one line per key loop: its instructions, its warpgroup barriers
(`BAR.SYNC`), its exponentials (`MUFU.EX2`) and how many of them issue before the wait for P_{j-1}·V_{j-1}
(`WARPGROUP.DEPBAR.LE gsb0, 0x0`), the instructions a consumer issues between that wait and its next product (its
tensor-core queue empty), and the kernel's stack bytes. TUNING.md step 31's tables come from this script. It compiles
with whichever Triton is imported first, so the GPU image's can be read here too:

    python kernels/flash-triton/sass_loops.py                      # this checkout's Triton
    pip download --no-deps --only-binary=:all: -d /tmp/w triton==3.6.0 && python -m zipfile -e /tmp/w/triton-*.whl /tmp/t36
    chmod +x /tmp/t36/triton/backends/nvidia/bin/* && PYTHONPATH=/tmp/t36 python kernels/flash-triton/sass_loops.py

The compile helpers are the SASS tests' (`tests/test_kernel_gluon.py`, `tests/test_kernel_gluon_fp8.py`,
`tests/test_kernel_serving_sm90.py`): the programs are compiled exactly as those tests check them.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def loop_stats(body: list[str]) -> dict:
    """A key loop's counts (`key_loops` gives the loops): everything after the accumulator's wait up to the loop's
    end, plus the loop's start up to its first product, is time this consumer issues with no product of its own in
    flight."""
    first = next(i for i, x in enumerate(body) if "GMMA" in x)
    wait = next(i for i, x in enumerate(body) if "DEPBAR.LE gsb0, 0x0" in x)
    exps = [i for i, x in enumerate(body) if "MUFU.EX2" in x]
    return dict(instructions=len(body), barriers=sum("BAR.SYNC" in x for x in body), exps=len(exps),
                exps_under_pv=sum(i < wait for i in exps), after_wait=len(body) - wait + first)


def main() -> int:
    sys.path[:0] = [str(REPO / "src"), str(REPO / "tests")]
    warnings.filterwarnings("ignore")
    import triton
    from test_kernel_gluon import BIN, compile_sm90, key_loops
    from test_kernel_gluon_fp8 import compile_fp8
    from test_kernel_serving_sm90 import compile_gluon_varlen

    if not (BIN / "nvdisasm").exists():
        print(f"sass_loops: Triton {triton.__version__} ships no nvdisasm ({BIN})", file=sys.stderr)
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="sass_loops_"))

    def tools(kernel) -> tuple[str, str]:
        cubin = tmp / "k.cubin"
        cubin.write_bytes(kernel.asm["cubin"])
        return tuple(subprocess.run([str(BIN / tool), *flags, str(cubin)], capture_output=True, text=True,
                                    check=True).stdout
                     for tool, flags in (("nvdisasm", ["-c"]), ("cuobjdump", ["--dump-resource-usage"])))

    programs = {
        "warp-specialized d128 causal": lambda e: compile_sm90(128, 128, 128, 4, 3, True, tmp, ws=True,
                                                              v_wait_early=e)[1:],
        "warp-specialized d64 causal": lambda e: compile_sm90(128, 128, 64, 4, 3, True, tmp, ws=True,
                                                             v_wait_early=e)[1:],
        "warp-specialized d128 not causal": lambda e: compile_sm90(128, 128, 128, 4, 3, False, tmp, ws=True,
                                                                  v_wait_early=e)[1:],
        "one-warpgroup 64x64 s2 d64 window+sinks": lambda e: compile_sm90(64, 64, 64, 4, 2, True, tmp, window=True,
                                                                         sinks=True, v_wait_early=e)[1:],
        "persistent d64 causal": lambda e: compile_sm90(128, 128, 64, 4, 3, True, tmp, ws=True, persistent=True,
                                                       v_wait_early=e)[1:],
        "persistent d128 window+sinks": lambda e: compile_sm90(128, 128, 128, 4, 3, True, tmp, ws=True,
                                                              persistent=True, window=True, sinks=True,
                                                              v_wait_early=e)[1:],
        "varlen d128 (dense lengths)": lambda e: tools(compile_gluon_varlen(True, False, 128, 128, v_wait_early=e)),
        "FP8 d128 causal exp-poly/4": lambda e: tools(compile_fp8(128, True, exp_poly=4, v_wait_early=e)),
        "FP8 d64 causal exp-poly/4": lambda e: tools(compile_fp8(64, True, exp_poly=4, v_wait_early=e)),
    }
    print(f"Triton {triton.__version__}; per key loop: instructions, barriers, exps under P·V / exps, issued after "
          "the P·V wait")
    for name, compile_ in programs.items():
        for early in (False, True):
            sass, usage = compile_(early)
            stack = re.search(r"STACK:(\d+)", usage).group(1)
            loops = ", ".join(f"{s['instructions']} ins, {s['barriers']} bar, {s['exps_under_pv']}/{s['exps']} exp, "
                              f"{s['after_wait']} after" for s in map(loop_stats, key_loops(sass)))
            print(f"{name:<42} {'v_wait_early' if early else 'default':<12} stack {stack:>3}  {loops}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
