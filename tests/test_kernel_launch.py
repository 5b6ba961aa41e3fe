"""flash-triton's direct launch (`_launch.py`) on the CPU, with stand-ins for Triton's driver and C launcher.

`_launch.py` is loaded alone, under a stand-in package whose `_config` says "not interpreted" (the rest of the kernel
package is not imported). What is checked: a slot's filled `CUtensorMap`s are cached by full base address (one fill
per address, a new address a new fill, the cache bounded); `_Direct` hands the launcher exactly the arguments Triton
3.6's `CudaLauncher` would build (each descriptor's base expanded in place), on the stream its stream functions give;
`_plan_slot` seeds the cache with the plan's own map; `_stream_functions` skips `torch.cuda.current_device`'s
lazy-init layer only once CUDA is initialized.
"""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "kernels" / "flash-triton" / "torch-ext" / "flash_triton"
PKG = "flash_triton_launch_under_test"


@pytest.fixture(scope="module")
def launch():
    pkg = types.ModuleType(PKG)
    pkg.__path__ = [str(SOURCE)]
    config = types.ModuleType(PKG + "._config")
    config.INTERPRETED = False
    spec = importlib.util.spec_from_file_location(PKG + "._launch", SOURCE / "_launch.py")
    mod = importlib.util.module_from_spec(spec)
    saved = {name: sys.modules.get(name) for name in (PKG, config.__name__, spec.name)}
    sys.modules.update({PKG: pkg, config.__name__: config, spec.name: mod})
    try:
        spec.loader.exec_module(mod)
        yield mod
    finally:
        for name, old in saved.items():
            if old is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = old


class Base:
    """A base tensor stand-in: only its address matters to a slot."""

    def __init__(self, ptr: int) -> None:
        self.ptr = ptr

    def data_ptr(self) -> int:
        return self.ptr


class Fill:
    """`fill_tma_descriptor`: counts its calls and returns a fresh map object naming its arguments."""

    def __init__(self) -> None:
        self.calls: list = []

    def __call__(self, ptr, *args):
        self.calls.append((ptr, *args))
        return ("map", ptr, *args, len(self.calls))  # a new object per fill, as the driver's


class Recorder:
    """The compiled C launcher: keeps each call's arguments."""

    def __init__(self) -> None:
        self.calls: list = []

    def __call__(self, *args) -> None:
        self.calls.append(args)


COMPILED = types.SimpleNamespace(function="FUNCTION", packed_metadata="PACKED")
FILL_ARGS = (128, 2, 10, [64, 64], [4, 1024, 64], [65536, 64, 1], 0)
STREAMS = (lambda device: ("stream", device), lambda: 3)


def test_one_fill_per_base_address_and_a_new_address_gets_its_own_map(launch):
    fill = Fill()
    slot = launch._Slot(2, fill, FILL_ARGS, (4, 1024, 64, 65536, 64, 1), None)
    first = slot.expand(Base(0x7F0000001000))
    again = slot.expand(Base(0x7F0000001000))
    assert len(fill.calls) == 1 and fill.calls[0] == (0x7F0000001000, *FILL_ARGS)
    assert first[0] is again[0] and first[1:] == (4, 1024, 64, 65536, 64, 1)
    other = slot.expand(Base(0x7F0000001000 + 4096))  # same alignment class, another address: not the same map
    assert len(fill.calls) == 2 and other[0] is not first[0] and other[0][1] == 0x7F0000001000 + 4096
    assert slot.expand(Base(0x7F0000001000))[0] is first[0]  # the first address's map is still kept


def test_the_cache_is_bounded_and_refills_after_it_empties(launch):
    fill = Fill()
    slot = launch._Slot(0, fill, FILL_ARGS, (), None)
    ptrs = [0x1000 * (n + 1) for n in range(launch._MAX_MAPS)]
    maps = [slot.map(p) for p in ptrs]
    assert len(fill.calls) == launch._MAX_MAPS == len(slot.maps)
    assert [slot.map(p) for p in ptrs] == maps and len(fill.calls) == launch._MAX_MAPS  # all hits
    slot.map(0xDEAD000)  # one more: the full cache is emptied first
    assert len(slot.maps) == 1 and len(fill.calls) == launch._MAX_MAPS + 1
    refilled = slot.map(ptrs[0])
    assert len(fill.calls) == launch._MAX_MAPS + 2 and refilled is not maps[0] and refilled[1] == ptrs[0]


def expected(slots, args: tuple) -> tuple:
    """What the launcher must get for `args` (each slot's base replaced by its expansion), built the plain way."""
    out, prev = [], 0
    for slot in sorted(slots, key=lambda s: s.pos):
        out += args[prev:slot.pos]
        base = args[slot.pos]
        out += [base] if slot.fill is None else [("map", base.data_ptr(), *slot.fill_args)]
        out += slot.rest
        prev = slot.pos + 1
    return (*out, *args[prev:])


def strip_counts(call: tuple) -> tuple:
    """A launcher call's arguments with each fill's call number dropped (so maps compare by what they were filled
    from)."""
    return tuple(a[:-1] if isinstance(a, tuple) and a[:1] == ("map",) else a for a in call)


def make_direct(launch, fill):
    slots = (
        launch._Slot(1, fill, FILL_ARGS, (2, 64, 128, 1), None),
        launch._Slot(3, None, (), (7, 8), None),  # Triton passes the base itself, then shape and strides
        launch._Slot(4, fill, FILL_ARGS[:-1] + (1,), (5, 6), None),
        launch._Slot(6, fill, FILL_ARGS, (), None),
    )
    rec = Recorder()
    return launch._Direct(rec, COMPILED, 0, 1, ("TAIL0", "TAIL1"), slots, STREAMS), rec, slots


def test_direct_launch_passes_what_triton_would_with_maps_in_place(launch):
    fill = Fill()
    direct, rec, slots = make_direct(launch, fill)
    q, k, v, kv = Base(0x10000), Base(0x20000), Base(0x30000), Base(0x40000)
    args = (0.5, q, 17, kv, k, None, v, 99)
    direct((8, 4), args)
    direct((8, 4, 2), args)
    assert len(fill.calls) == 3  # three filled slots, each filled once over two launches
    header = (8, 4, 1, ("stream", 3), "FUNCTION", 0, 1, None, None, "PACKED", None, None, None)
    assert rec.calls[0][:13] == header and rec.calls[1][:13] == (8, 4, 2) + header[3:]
    body = expected(slots, args) + ("TAIL0", "TAIL1")
    assert strip_counts(rec.calls[0][13:]) == body and rec.calls[1][13:] == rec.calls[0][13:]
    assert rec.calls[0][13:][7] is kv  # the unfilled slot's base tensor itself
    assert args == (0.5, q, 17, kv, k, None, v, 99)  # the caller's tuple untouched

    k2 = Base(0x50000)  # a new key buffer: only its slot fills again, and its map lands where k's was
    moved = (0.5, q, 17, kv, k2, None, v, 99)
    direct((8,), moved)
    assert len(fill.calls) == 4 and fill.calls[-1][0] == 0x50000
    assert rec.calls[2][:3] == (8, 1, 1) and strip_counts(rec.calls[2][13:]) == expected(slots, moved) + (
        "TAIL0", "TAIL1")


def test_direct_launch_without_descriptors_passes_args_then_tail(launch):
    rec = Recorder()
    direct = launch._Direct(rec, COMPILED, 1, 0, (64, 3), (), STREAMS)
    direct((5, 6, 7), (1, 2.0, None))
    assert rec.calls == [(5, 6, 7, ("stream", 3), "FUNCTION", 1, 0, None, None, "PACKED", None, None, None,
                          1, 2.0, None, 64, 3)]


def test_direct_launch_asks_for_the_current_stream_on_every_launch(launch):
    current = {"device": 0}
    rec = Recorder()
    direct = launch._Direct(rec, COMPILED, 0, 0, (), (), (lambda d: f"stream-of-{d}", lambda: current["device"]))
    direct((1,), ())
    current["device"] = 1  # torch.cuda.set_device / a stream context between launches
    direct((1,), ())
    assert [c[3] for c in rec.calls] == ["stream-of-0", "stream-of-1"]


class Desc:
    """A TMA descriptor stand-in: its base tensor and what Triton's expansion reads."""

    def __init__(self, base, shape, strides) -> None:
        self.base, self.shape, self.strides = base, shape, strides


def fake_driver(fill):
    utils = types.SimpleNamespace(fill_tma_descriptor=fill)
    active = types.SimpleNamespace(utils=utils, get_current_stream=STREAMS[0], get_current_device=STREAMS[1])
    return types.SimpleNamespace(active=active)


def test_plan_slot_seeds_the_cache_with_the_plans_own_map(launch, monkeypatch):
    fill = Fill()
    drv = fake_driver(fill)
    monkeypatch.setattr(launch, "driver", drv)

    def expand(desc, meta):  # Triton 3.6's make_tensordesc_arg: fill through the driver's utils, then shape, strides
        cu_map = launch.driver.active.utils.fill_tma_descriptor(desc.base.data_ptr(), meta["swizzle"], 2, 10,
                                                                  [64, 64], list(desc.shape), list(desc.strides), 0)
        return [cu_map, *desc.shape, *desc.strides]

    base = torch.zeros(4, 64)
    slot = launch._plan_slot(1, Desc(base, (4, 64), (64, 1)), {"swizzle": 128}, expand)
    assert drv.active.utils.fill_tma_descriptor is fill  # the recording wrapper is taken back off
    assert slot is not None and slot.fill is fill and slot.rest == (4, 64, 64, 1)
    assert len(fill.calls) == 1 and list(slot.maps) == [base.data_ptr()]
    planned = slot.maps[base.data_ptr()]
    assert slot.expand(base)[0] is planned and len(fill.calls) == 1  # the first fast launch: no new fill
    other = torch.zeros(4, 64)
    assert slot.expand(other)[0][1] == other.data_ptr() and len(fill.calls) == 2

    rec = Recorder()
    direct = launch._Direct(rec, COMPILED, 0, 0, (), (slot,))  # stream functions from the (stand-in) driver
    direct((1,), (None, base))
    assert rec.calls[0][3] == ("stream", 3) and rec.calls[0][14] is planned and len(fill.calls) == 2


def test_plan_slot_passing_the_base_itself_has_no_cache(launch, monkeypatch):
    monkeypatch.setattr(launch, "driver", fake_driver(Fill()))
    base = torch.zeros(2, 8)
    slot = launch._plan_slot(0, Desc(base, (2, 8), (8, 1)), None, lambda desc, meta: [desc.base, 2, 8, 8, 1])
    assert slot is not None and slot.fill is None and slot.maps is None
    assert slot.expand(base) == (base, 2, 8, 8, 1)


def test_stream_functions_skip_the_lazy_init_layer_only_once_cuda_is_initialized(launch, monkeypatch):
    def raw_device():
        return 5

    def raw_stream(device):
        return device

    active = types.SimpleNamespace(get_current_stream=raw_stream, get_current_device=torch.cuda.current_device)
    monkeypatch.setattr(launch, "driver", types.SimpleNamespace(active=active))
    monkeypatch.setattr(torch._C, "_cuda_getDevice", raw_device, raising=False)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    assert launch._stream_functions() == (raw_stream, torch.cuda.current_device)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    assert launch._stream_functions() == (raw_stream, raw_device)
    other = types.SimpleNamespace(get_current_stream=raw_stream, get_current_device=raw_device)
    monkeypatch.setattr(launch, "driver", types.SimpleNamespace(active=other))  # a torch-free driver: kept as is
    assert launch._stream_functions() == (raw_stream, raw_device)
