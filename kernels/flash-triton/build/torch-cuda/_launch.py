"""Repeat launches straight to the compiled kernel: Triton's per-call work done once per call signature.

Why: `kernel[grid](*args, **meta)` binds every argument, specializes each one (dtype, 16-byte alignment, ints equal
to 1 or divisible by 16), builds a cache key from them and the options, looks the compiled kernel up, and only then
calls its C launcher. For the decode program's ~60 arguments that is most of a call's host time, paid on every layer
of every decode step (an eager `generate` over 16 layers pays it 16 times per token), while SDPA's C++ dispatch costs
~15-30 µs in all. Here the first launch of a call signature goes through Triton as usual and keeps the compiled
kernel and the launch's constant tail (the constexpr arguments); the next launches with the same signature call the
kernel's C launcher directly.

The contract: the caller's `key` must determine every runtime argument's specialization. The entry points key on
the call signature (shapes, strides, dtypes, devices, the 16-byte alignment of every pointer, flags, config), from
which every integer argument is computed, plus the class (== 1, % 16) of any integer that is not; floats are never
specialized. `FLASH_TRITON_CHECK_LAUNCH=1` makes every fast launch ask Triton's binder for the kernel it would have
launched and raise when that is not the cached one (the CUDA tests run with it on).

Only CUDA launches take the fast path: under Triton's interpreter, with a launch hook installed (proton, a
profiler), or where this Triton's compiled kernel lacks the launcher attributes this module uses (Triton 3.6's), a
launch goes through `kernel[grid]` every time; `FLASH_TRITON_FAST_LAUNCH=0` asks for that too (to measure the
difference). `fast_launch_problem()` says which applies.
"""

from __future__ import annotations

import os

from triton.runtime import driver

_CHECK = os.environ.get("FLASH_TRITON_CHECK_LAUNCH") == "1"
_OFF = os.environ.get("FLASH_TRITON_FAST_LAUNCH") == "0"  # to measure what the fast path saves
_MAX_ENTRIES = 4096
_LAUNCHER_ATTRS = ("run", "function", "packed_metadata")


def _knobs():
    try:
        from triton import knobs
    except ImportError:  # Triton < 3.4 has no knobs: no hooks to honour, no fast path (other launcher layout)
        return None
    return knobs


def _static_problem() -> str | None:
    from ._config import INTERPRETED

    if INTERPRETED:
        return "Triton's interpreter runs every launch through the interpreter"
    if _OFF:
        return "FLASH_TRITON_FAST_LAUNCH=0"
    if _knobs() is None:
        return "this Triton has no triton.knobs (launch hooks unknown)"
    return None


_STATIC = _static_problem()
_KNOBS = _knobs()


def _hooked(hook) -> bool:
    """Whether a launch hook is set: None or, from Triton 3.5, a `HookChain` with no calls means none."""
    return hook is not None and bool(getattr(hook, "calls", True))


def fast_launch_problem() -> str | None:
    """None when launches can skip Triton's binder here, else why not (this module's docstring)."""
    if _STATIC is not None:
        return _STATIC
    runtime = _KNOBS.runtime
    if _hooked(runtime.launch_enter_hook) or _hooked(runtime.launch_exit_hook):
        return "a Triton launch hook is installed (a profiler): every launch goes through kernel[grid]"
    return None


class Launcher:
    """`fn[grid](*args, **meta)` by key: the first launch per key through Triton, the next ones to the C launcher."""

    def __init__(self, fn) -> None:
        self.fn = fn  # a JITFunction; under the interpreter an InterpretedFunction, which never gets here below
        self.entries: dict = {}

    def __call__(self, key, grid: tuple, args: tuple, meta: dict) -> None:
        """`args`: the runtime arguments, the kernel's first len(args) parameters, in order; `meta`: the constexpr
        parameters and launch options (num_warps, num_stages), the same for every launch under `key`."""
        entry = self.entries.get(key) if key is not None else None
        if entry is not None and fast_launch_problem() is None:
            compiled, tail = entry
            if _CHECK:
                self._check(compiled, args, meta)
            g1 = grid[1] if len(grid) > 1 else 1
            g2 = grid[2] if len(grid) > 2 else 1
            drv = driver.active  # as Triton's own launch: the current device's current stream
            stream = drv.get_current_stream(drv.get_current_device())
            compiled.run(grid[0], g1, g2, stream, compiled.function, compiled.packed_metadata, None, None, None,
                         *args, *tail)
            return
        compiled = self.fn[grid](*args, **meta)
        if key is None or compiled is None or not all(hasattr(compiled, a) for a in _LAUNCHER_ATTRS):
            return  # the interpreter returns no compiled kernel
        if len(self.entries) >= _MAX_ENTRIES:
            self.entries.clear()
        params = self.fn.params[len(args):]  # the constexpr parameters after the runtime ones
        tail = tuple(meta[p.name] if p.name in meta else p.default for p in params)
        self.entries[key] = (compiled, tail)

    def _check(self, compiled, args: tuple, meta: dict) -> None:
        """Raise when Triton's own binder would launch another compiled kernel for these arguments."""
        other = self.fn.warmup(*args, grid=(1,), **meta)
        if other is not compiled:
            raise RuntimeError(f"flash-triton: the fast launch of {self.fn.__name__} would run another "
                               "specialization than Triton picks for these arguments: its key is incomplete")


def rebase(desc, base):
    """A copy of the TMA descriptor `desc` over the tensor `base` (same shape, strides and alignment class: the
    caller's key says so), without the constructor's validation, which costs more than the launch it describes."""
    new = object.__new__(type(desc))
    new.__dict__.update(desc.__dict__)
    new.base = base
    return new


_LAUNCHERS: dict = {}


def launcher(fn) -> Launcher:
    """The one `Launcher` of a kernel function."""
    got = _LAUNCHERS.get(fn)
    if got is None:
        got = _LAUNCHERS[fn] = Launcher(fn)
    return got
