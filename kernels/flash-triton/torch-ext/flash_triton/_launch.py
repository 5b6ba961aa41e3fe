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

The direct launch (`_Direct`, Triton 3.6's launcher layout, the H200 image's): below `compiled.run` Triton still runs
Python per call, a `CudaLauncher.__call__` that sizes scratch buffers and, for a kernel with TMA descriptor arguments,
a wrapper that walks every argument and turns each descriptor into a `CUtensorMap` plus its shape and strides
(`make_tensordesc_arg`). For a kernel with no scratch, the first launch of a key plans that work once: it runs
Triton's own `make_tensordesc_arg` on the call's descriptors, records the arguments it hands the driver's
`fill_tma_descriptor`, and keeps everything but the base address. A later launch passes the base tensors where the
descriptors were (`Launcher.launch_bases`; no descriptor object is built or rebased), takes each `CUtensorMap` from
the slot's cache or fills it with the recorded arguments, and calls the compiled C launcher itself. Any other layout
(another Triton, scratch memory, a descriptor Triton expands differently) keeps `compiled.run`. Under
`FLASH_TRITON_CHECK_LAUNCH=1` a base launch also rebuilds the descriptors from the first call's to ask the binder, as
above.

What a direct launch caches, and why that is safe:
- The filled `CUtensorMap`s, per descriptor slot, by the base tensor's full `data_ptr()` (`_Slot.maps`, at most
  `_MAX_MAPS` per slot, emptied when full). Filling one is a driver call (`cuTensorMapEncodeTiled`) that builds a new
  Python object; its only inputs are the base address and the slot's recorded fill arguments, which are fixed for the
  slot (the key fixes shape, strides, dtype, box and swizzle: the contract above), so a map filled once for an address
  is the map any later launch at that address would fill. The caching allocator hands the same addresses back across
  layers and steps, so a model's repeat launches mostly hit. The map does not own or pin the memory it points at: a
  later tensor at a freed address gets the same (still right) map. The launcher only reads a map (Triton 3.6's passes
  a pointer to its bytes as the kernel parameter, which the driver copies when the launch is enqueued), and nothing
  writes one after the fill, so one object can serve every launch. The first call's own map, from the plan, seeds the
  cache.
- The stream: the active driver's `get_current_stream` and `get_current_device`, looked up once when the `_Direct` is
  built (Triton's own launch looks them up on `driver.active` every time; the active driver of a compiled CUDA kernel
  does not change under it). Each launch still asks them for the current device's current stream. Where the device
  function is `torch.cuda.current_device` and CUDA is initialized (a launch just ran), it is replaced by the
  `torch._C._cuda_getDevice` it calls after its lazy-init check (a no-op once initialized); the stream function is
  then `torch._C._cuda_getCurrentRawStream`, as Triton's CUDA driver sets it where torch is loaded.
"""

from __future__ import annotations

import os
import sys

from triton.runtime import driver

_CHECK = os.environ.get("FLASH_TRITON_CHECK_LAUNCH") == "1"
_OFF = os.environ.get("FLASH_TRITON_FAST_LAUNCH") == "0"  # to measure what the fast path saves
_MAX_ENTRIES = 4096
_MAX_MAPS = 64  # filled CUtensorMaps kept per descriptor slot (by base address); the slot's cache empties when full
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


class _Entry:
    """What the first launch of a key leaves for the next ones."""

    __slots__ = ("compiled", "tail", "meta", "direct")

    def __init__(self, compiled, tail: tuple, meta: dict, direct) -> None:
        self.compiled, self.tail, self.meta, self.direct = compiled, tail, meta, direct


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
            compiled = entry.compiled
            if _CHECK:
                self._check(compiled, args, meta)
            direct = entry.direct
            if direct is not None and not direct.slots:  # no descriptor to expand: straight to the C launcher
                direct(grid, args)
                return
            g1 = grid[1] if len(grid) > 1 else 1
            g2 = grid[2] if len(grid) > 2 else 1
            drv = driver.active  # as Triton's own launch: the current device's current stream
            stream = drv.get_current_stream(drv.get_current_device())
            compiled.run(grid[0], g1, g2, stream, compiled.function, compiled.packed_metadata, None, None, None,
                         *args, *entry.tail)
            return
        compiled = self.fn[grid](*args, **meta)
        if key is None or compiled is None or not all(hasattr(compiled, a) for a in _LAUNCHER_ATTRS):
            return  # the interpreter returns no compiled kernel
        if len(self.entries) >= _MAX_ENTRIES:
            self.entries.clear()
        params = self.fn.params[len(args):]  # the constexpr parameters after the runtime ones
        tail = tuple(meta[p.name] if p.name in meta else p.default for p in params)
        self.entries[key] = _Entry(compiled, tail, dict(meta), _plan_direct(compiled, args, tail))

    def launch_bases(self, key, grid: tuple, args: tuple) -> bool:
        """Launch `key`'s kernel with each TMA descriptor argument replaced by its base tensor (same shape, strides,
        alignment and box as the first launch's descriptor: the key says so) straight through the C launcher, and
        return True; False when this key cannot (no launch yet, no direct plan, a hook, the interpreter): the caller
        then builds the descriptors and calls the launcher as usual."""
        entry = self.entries.get(key) if key is not None else None
        if entry is None or entry.direct is None or not entry.direct.slots or fast_launch_problem() is not None:
            return False
        if _CHECK:
            self._check(entry.compiled, entry.direct.descriptors(args), entry.meta)
        entry.direct(grid, args)
        return True

    def _check(self, compiled, args: tuple, meta: dict) -> None:
        """Raise when Triton's own binder would launch another compiled kernel for these arguments."""
        other = self.fn.warmup(*args, grid=(1,), **meta)
        if other is not compiled:
            raise RuntimeError(f"flash-triton: the fast launch of {self.fn.__name__} would run another "
                               "specialization than Triton picks for these arguments: its key is incomplete")


class _Slot:
    """One TMA descriptor argument of a direct launch: how Triton expands it, planned from the first call's; `maps`
    keeps the maps `fill` made, by base address (the module docstring)."""

    __slots__ = ("pos", "fill", "fill_args", "rest", "template", "maps")

    def __init__(self, pos: int, fill, fill_args: tuple, rest: tuple, template, maps: dict | None = None) -> None:
        self.pos, self.fill, self.fill_args, self.rest, self.template = pos, fill, fill_args, rest, template
        self.maps = (maps if maps is not None else {}) if fill is not None else None  # never rebound

    def map(self, ptr: int):
        """The CUtensorMap over the base address `ptr`: the cached one, else a new fill (kept)."""
        got = self.maps.get(ptr)
        if got is None:
            got = self.filled(ptr)
        return got

    def filled(self, ptr: int):
        """Fill the CUtensorMap over `ptr` and keep it (the cache emptied first when full)."""
        maps = self.maps
        if len(maps) >= _MAX_MAPS:
            maps.clear()
        got = maps[ptr] = self.fill(ptr, *self.fill_args)
        return got

    def expand(self, base) -> tuple:
        """What Triton's launcher passes for this descriptor over `base`."""
        if self.fill is None:  # Triton passes the base tensor itself, then shape and strides
            return (base, *self.rest)
        return (self.map(base.data_ptr()), *self.rest)


def _stream_functions() -> tuple:
    """The active driver's (get_current_stream, get_current_device), with `torch.cuda.current_device` replaced by the
    `torch._C._cuda_getDevice` it ends in once CUDA is initialized (its lazy-init check is then a no-op)."""
    drv = driver.active
    stream_of, device = drv.get_current_stream, drv.get_current_device
    torch = sys.modules.get("torch")
    if torch is not None and device is getattr(torch.cuda, "current_device", None) and torch.cuda.is_initialized():
        device = getattr(torch._C, "_cuda_getDevice", device)
    return stream_of, device


class _Direct:
    """The C launcher of one compiled kernel, called with the arguments Triton 3.6's `CudaLauncher` would build.
    `streams`: (get_current_stream, get_current_device), the active driver's when not given."""

    __slots__ = ("launch", "function", "packed", "coop", "pdl", "tail", "slots", "plan", "stream_of", "device")

    def __init__(self, launch, compiled, coop, pdl, tail: tuple, slots: tuple, streams: tuple | None = None) -> None:
        self.launch, self.function, self.packed = launch, compiled.function, compiled.packed_metadata
        self.coop, self.pdl, self.tail, self.slots = coop, pdl, tail, slots
        # the slots last to first, so that inserting one slot's shape and strides leaves the earlier positions be
        self.plan = tuple(sorted(slots, key=lambda s: s.pos, reverse=True))
        self.stream_of, self.device = streams if streams is not None else _stream_functions()

    def __call__(self, grid: tuple, args: tuple) -> None:
        if self.plan:
            args = list(args)
            for slot in self.plan:
                args[slot.pos:slot.pos + 1] = slot.expand(args[slot.pos])
            args += self.tail
        else:
            args = (*args, *self.tail)
        self.launch(grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1,
                    self.stream_of(self.device()),  # the current device's current stream, as Triton's launch
                    self.function, self.coop, self.pdl, None, None, self.packed, None, None, None, *args)

    def descriptors(self, args: tuple) -> tuple:
        """`args` with the base tensors at the descriptor slots turned back into descriptors (the first call's,
        rebased): what the binder check of `FLASH_TRITON_CHECK_LAUNCH=1` needs."""
        args = list(args)
        for slot in self.slots:
            args[slot.pos] = rebase(slot.template, args[slot.pos])
        return tuple(args)


_BASE_ARGS = "iiiKKppOOOOOO"  # Triton 3.6's C launcher: grid, stream, function, coop, pdl, scratch x2, metadata, hooks


def _plan_direct(compiled, args: tuple, tail: tuple) -> _Direct | None:
    """A `_Direct` for this compiled kernel, or None where its launcher is not laid out as Triton 3.6's (the module
    docstring); `args` are the first call's (with its descriptors)."""
    try:
        run = compiled.run
        module = sys.modules.get(type(run).__module__)
        if getattr(module, "_BASE_ARGS_FORMAT", None) != _BASE_ARGS or type(run).__name__ != "CudaLauncher":
            return None
        if getattr(run, "global_scratch_size", 1) or getattr(run, "profile_scratch_size", 1):
            return None  # the kernel needs scratch buffers, which CudaLauncher.__call__ allocates per launch
        coop, pdl = run.launch_cooperative_grid, run.launch_pdl
        launch = run.launch
        code = getattr(launch, "__code__", None)
        if code is None:  # the compiled C launcher itself: no descriptor arguments to expand
            return _Direct(launch, compiled, coop, pdl, tail, ())
        cells = dict(zip(code.co_freevars, (c.cell_contents for c in launch.__closure__ or ())))
        expand = launch.__globals__.get("make_tensordesc_arg")
        if not {"launcher", "tensordesc_indices", "tensordesc_meta"} <= cells.keys() or expand is None \
                or expand.__code__.co_argcount != 2:
            return None
        metas = cells["tensordesc_meta"]
        slots = []
        for n, pos in enumerate(sorted(cells["tensordesc_indices"])):
            if pos >= len(args) or (slot := _plan_slot(pos, args[pos], metas[n] if metas else None, expand)) is None:
                return None
            slots.append(slot)
        return _Direct(cells["launcher"], compiled, coop, pdl, tail, tuple(slots))
    except Exception:  # noqa: BLE001 - any surprise in Triton's internals: keep its own launch path
        return None


_FILLS = ("fill_tma_descriptor", "fill_tma_descriptor_tiled")


def _plan_slot(pos: int, desc, meta, expand) -> _Slot | None:
    """Run Triton's `make_tensordesc_arg` on the first call's descriptor, recording what it hands the driver's
    `fill_tma_descriptor`; a slot when the expansion is (base tensor or filled map, then values that do not depend on
    the base address)."""
    base = getattr(desc, "base", None)
    if base is None:
        return None
    utils = driver.active.utils
    calls: list = []
    saved = {}
    for name in _FILLS:
        real = getattr(utils, name, None)
        if real is not None:
            saved[name] = real

            def record(*a, _real=real, _name=name):
                got = _real(*a)
                calls.append((_name, a, got))
                return got

            setattr(utils, name, record)
    try:
        expanded = expand(desc, meta)
    finally:
        for name, real in saved.items():
            setattr(utils, name, real)
    if not expanded:
        return None
    if not calls:
        return _Slot(pos, None, (), tuple(expanded[1:]), desc) if expanded[0] is base else None
    if len(calls) != 1 or calls[0][1][:1] != (base.data_ptr(),):
        return None
    name, fill_args, filled = calls[0]
    seed = {fill_args[0]: filled} if expanded[0] is filled else None  # the plan's own map: the first cache entry
    return _Slot(pos, saved[name], tuple(fill_args[1:]), tuple(expanded[1:]), desc, seed)


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
