"""The dispatch watcher: which attention backend each call really took, with no profiler.

Inside `watch()`, every `F.scaled_dot_product_attention` call is intercepted; while it runs, a `TorchDispatchMode`
records the aten operators it reaches. The backend is read from what executed —
`aten::_scaled_dot_product_cudnn_attention` is cuDNN, a call that reached no fused operator ran the math path —
never from a table of expected cases.

Two ways to intercept, because the cost matters inside a model forward (measured on the H200: a
`TorchFunctionMode` adds ~2 µs to *every* torch call, +64 % on a llama-1b forward):
- `hook="patch"` (default): `torch.nn.functional.scaled_dot_product_attention` is replaced for the duration of
  the block. Free for every other torch call; sees every call that looks the function up at call time
  (`F.scaled_dot_product_attention(...)`, as transformers, diffusers and timm do).
- `hook="mode"`: a `TorchFunctionMode`. Also sees calls through a reference bound before the block
  (`from torch.nn.functional import scaled_dot_product_attention`) and eager `flex_attention` calls.
Dispatch is a pure function of the call's envelope (shapes, strides, alignment, dtypes, device, mask, flags, grad
mode and the enabled backends), so the operators are observed on the first call of each distinct envelope and
reused for the identical ones that follow (`observe="every"` observes all).

Each record also carries the call's envelope (shapes `[B, H, S, D]`, dtypes, GQA, mask kind and dtype, causal flag,
dropout, strides and contiguity, device) and its call site: the module path (`model.layers.3.self_attn`) read from
the `nn.Module` frames on the Python stack at the moment of the call, so no hooks run on the other modules.

Beyond SDPA: an eager `flex_attention` call is seen as its higher-order operator; a compiled one (and any Triton
attention kernel, such as the stage-four kernel) is seen at launch, by tapping Triton's launchers while the watch
is open (CUDA only: on the CPU, compiled FlexAttention is C++ and leaves no trace without a profiler).
Calls made while Dynamo traces (inside `torch.compile`) are not recorded: the compiled code runs later.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import sys
import threading
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from attnprof.backends import SDPA_FUSED, fused_op_backend, kernel_backend
from attnprof.dispatch.sdpa_checks import preferred_backend, refusals_for_call

_SDPA = F.scaled_dot_product_attention  # the builtin, whatever the patch hook has put in its place


def backend_of(op_names: list[str]) -> tuple[str, str | None]:
    """(backend, the fused aten op) for the operators one SDPA call executed (`backends.FUSED_OPS`); no fused op
    means math."""
    for name in op_names:
        backend = fused_op_backend(name)
        if backend is not None:
            return backend, name
    return "math", None


@dataclass
class DispatchRecord:
    """One attention call: what ran, on what, from where. Shapes are `[B, H, S, D]`."""

    backend: str
    fused_op: str | None
    ops: list[str] = field(default_factory=list)
    q_shape: tuple = ()
    k_shape: tuple = ()
    dtype: str = ""
    device: str = ""
    kind: str = "sdpa"  # sdpa | flex | kernel
    v_shape: tuple = ()
    dtypes: tuple = ()  # (q, k, v)
    gqa: bool = False  # fewer kv heads than query heads
    enable_gqa: bool = False
    mask: str = "none"  # none | bool | additive | causal-bias:<variant> | <other tensor type>
    mask_dtype: str | None = None
    mask_shape: tuple | None = None
    causal: bool = False
    dropout: float = 0.0
    scale: float | None = None
    strides: dict = field(default_factory=dict)  # name → stride tuple
    contiguous: dict = field(default_factory=dict)  # name → bool
    requires_grad: bool = False
    module: str | None = None  # module path, e.g. model.layers.0.self_attn
    module_class: str | None = None
    location: str | None = None  # file:line in function, the innermost frame outside torch
    preferred: str | None = None  # the fastest backend this device offers (what SDPA picks for friendly inputs)
    refusals: dict = field(default_factory=dict)  # faster backend → why it was refused (PyTorch's words)
    note: str | None = None
    # True when this call's operators were recorded; False when it reused an identical envelope's observation
    observed: bool = True
    index: int = 0

    @property
    def fused(self) -> bool:
        """A fused kernel ran: an SDPA fused backend, compiled flex, or a Triton attention kernel."""
        return self.backend in SDPA_FUSED or (self.backend in ("flex", "kernel") and self.fused_op is not None)

    @property
    def fell_back(self) -> bool:
        """The call did not get the fastest backend this device offers."""
        if self.kind != "sdpa":
            return not self.fused
        return self.preferred is not None and self.backend != self.preferred

    @property
    def where(self) -> str:
        return self.module or self.location or "?"

    def envelope(self) -> str:
        """Short label: `1x32/8x2048→2048x64 bf16 causal mask=bool strided`."""
        if len(self.q_shape) != 4 or len(self.k_shape) != 4:
            return f"q{list(self.q_shape)} k{list(self.k_shape)} {self.dtype}"
        b, hq, sq, d = self.q_shape
        hk, sk = self.k_shape[1], self.k_shape[2]
        heads = f"{hq}/{hk}" if hk != hq else f"{hq}"
        seq = f"{sq}→{sk}" if sk != sq else f"{sq}"
        parts = [f"{b}x{heads}x{seq}x{d}", self.dtype]
        if self.causal:
            parts.append("causal")
        if self.mask != "none":
            parts.append(f"mask={self.mask}" + (f"[{self.mask_dtype}]" if self.mask_dtype else ""))
        if self.dropout:
            parts.append(f"dropout={self.dropout:g}")
        if self.contiguous and not all(self.contiguous.values()):
            parts.append("strided")
        return " ".join(parts)

    def to_json(self) -> dict:
        return {"index": self.index, "kind": self.kind, "backend": self.backend, "fused_op": self.fused_op,
                "fused": self.fused, "preferred": self.preferred, "fell_back": self.fell_back,
                "module": self.module, "module_class": self.module_class, "location": self.location,
                "q_shape": list(self.q_shape), "k_shape": list(self.k_shape), "v_shape": list(self.v_shape),
                "dtype": self.dtype, "dtypes": list(self.dtypes), "device": self.device, "gqa": self.gqa,
                "enable_gqa": self.enable_gqa, "mask": self.mask, "mask_dtype": self.mask_dtype,
                "mask_shape": list(self.mask_shape) if self.mask_shape is not None else None,
                "causal": self.causal, "dropout": self.dropout, "scale": self.scale,
                "strides": {k: list(v) for k, v in self.strides.items()}, "contiguous": self.contiguous,
                "requires_grad": self.requires_grad, "refusals": self.refusals, "note": self.note,
                "envelope": self.envelope(), "ops": self.ops, "observed": self.observed}


class _OpRecorder(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func.overloadpacket.__name__) if hasattr(func, "overloadpacket") else str(func))
        return func(*args, **(kwargs or {}))


def _dtype(t) -> str:
    return str(t.dtype).replace("torch.", "")


def _sdpa_args(args, kwargs) -> dict:
    """F.scaled_dot_product_attention(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)."""
    names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
    bound = dict(zip(names, args))
    bound.update(kwargs)
    return bound


def _mask_kind(mask) -> str:
    if mask is None:
        return "none"
    variant = getattr(mask, "variant", None)  # torch.nn.attention.bias.CausalBias
    if variant is not None:
        return f"causal-bias:{getattr(variant, 'name', variant).lower()}"
    if not isinstance(mask, torch.Tensor):
        return type(mask).__name__
    return "bool" if mask.dtype == torch.bool else "additive"


class _CallSites:
    """Module path of the innermost `nn.Module` on the Python stack, named from the outermost one."""

    # compared by identity: hashing a code object re-hashes its bytecode and constants on every call
    _CALL_IMPL = torch.nn.Module._call_impl.__code__
    _WRAPPED_CALL_IMPL = torch.nn.Module._wrapped_call_impl.__code__
    _SKIP_DIRS = (os.path.dirname(torch.__file__), os.path.dirname(__file__),
                  os.path.dirname(contextlib.__file__))

    def __init__(self) -> None:
        self._names: dict[int, tuple[weakref.ref, dict[int, str]]] = {}
        # innermost module → (ref, its path, the location its full walk found): later calls from a known module stop
        # walking at its frame, whatever lies below (the walk to the root reads f_locals of every module frame)
        self._known: dict[int, tuple[weakref.ref, str, str | None]] = {}
        # (id(code), bytecode offset) → (code, "file:line in function" or None inside torch/attnprof): f_lineno
        # decodes the line table on every read; in a model forward (cold caches) that cost more than the whole walk
        self._locations: dict[tuple[int, int], tuple] = {}

    def find(self) -> tuple[str | None, str | None, str | None]:
        """(module path, module class, file:line in function)."""
        frame = sys._getframe(2)
        modules: list[torch.nn.Module] = []
        location = None
        while frame is not None:
            code = frame.f_code
            if code is self._CALL_IMPL or code is self._WRAPPED_CALL_IMPL:
                mod = frame.f_locals.get("self")
                if isinstance(mod, torch.nn.Module) and (not modules or modules[-1] is not mod):
                    modules.append(mod)
                    known = self._known.get(id(mod)) if len(modules) == 1 else None
                    if known is not None and known[0]() is mod:  # stop at the innermost module: bounded cost
                        # no caller file below it (a torch module's own forward): the one its first full walk found
                        return known[1], type(mod).__name__, location if location is not None else known[2]
            elif location is None:
                site = (id(code), frame.f_lasti)
                seen = self._locations.get(site)
                if seen is not None and seen[0] is code:
                    location = seen[1]
                else:  # first sight of this bytecode position (or a dead code object's id reused)
                    location = (None if code.co_filename.startswith(self._SKIP_DIRS)
                                else f"{code.co_filename}:{frame.f_lineno} in {code.co_name}")
                    if len(self._locations) >= _CACHE_LIMIT:
                        self._locations.clear()
                    self._locations[site] = (code, location)
            frame = frame.f_back
        if not modules:
            return None, None, location
        inner, root = modules[0], modules[-1]
        cached = self._names.get(id(root))
        if cached is not None and cached[0]() is root:
            names = cached[1]
        else:  # first sight of this root (or its id was reused by a new object)
            names = {id(m): n for n, m in root.named_modules(remove_duplicate=False)}
            self._names[id(root)] = (weakref.ref(root), names)
        path = names.get(id(inner))
        if path is None:  # not a registered submodule: name it by the classes on the stack
            path = ".".join(type(m).__name__ for m in reversed(modules))
        elif path == "":
            path = type(root).__name__
        self._known[id(inner)] = (weakref.ref(inner), path, location)
        return path, type(inner).__name__, location


_SITES = _CallSites()


class _Watcher(TorchFunctionMode):
    def __init__(self, records: list[DispatchRecord], explain: bool, observe: str = "first") -> None:
        super().__init__()
        self.records = records
        self.explain = explain
        self.observe_every = observe == "every"
        # Shared by every watch() of the process: the dispatch decision depends only on the key (which holds the
        # enabled backends and their priority), so the next `with watch(): model(x)` starts warm.
        self._seen = _SEEN
        self.sites = _SITES
        self._refusal_cache = _REFUSALS
        self._flex_hop = _flex_hop()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is _SDPA:
            if torch.compiler.is_compiling():
                return func(*args, **kwargs)
            return self._sdpa(func, args, kwargs)
        if func is self._flex_hop and self._flex_hop is not None and not torch.compiler.is_compiling():
            self._flex_eager(args)
        return func(*args, **kwargs)

    def _sdpa(self, func, args, kwargs):
        a = _sdpa_args(args, kwargs)
        key = None if self.observe_every else _envelope_key(a)
        first = self._seen.get(key) if key is not None else None
        if first is not None:  # the same envelope as an observed call: the same dispatch decision
            out = func(*args, **kwargs)
            module, module_class, location = self.sites.find()
            # a shallow copy without __init__ (dataclasses.replace re-runs it over 30 fields: 5x slower than this)
            rec = object.__new__(DispatchRecord)
            rec.__dict__.update(first.__dict__, module=module, module_class=module_class, location=location,
                                index=len(self.records), refusals=dict(first.refusals), observed=False)
            self.records.append(rec)
            return out
        with _OpRecorder() as recorder:
            out = func(*args, **kwargs)
        backend, fused = backend_of(recorder.ops)
        q, k, v, mask = a["query"], a["key"], a["value"], a.get("attn_mask")
        module, module_class, location = self.sites.find()
        rec = DispatchRecord(
            backend=backend, fused_op=fused, ops=recorder.ops, q_shape=tuple(q.shape), k_shape=tuple(k.shape),
            dtype=_dtype(q), device=str(q.device), v_shape=tuple(v.shape), dtypes=(_dtype(q), _dtype(k), _dtype(v)),
            gqa=q.dim() == 4 and k.dim() == 4 and k.shape[1] != q.shape[1], enable_gqa=bool(a.get("enable_gqa")),
            mask=_mask_kind(mask), mask_dtype=_dtype(mask) if isinstance(mask, torch.Tensor) else None,
            mask_shape=tuple(mask.shape) if isinstance(mask, torch.Tensor) else None,
            causal=bool(a.get("is_causal")), dropout=float(a.get("dropout_p") or 0.0), scale=a.get("scale"),
            strides={"q": q.stride(), "k": k.stride(), "v": v.stride()},
            contiguous={"q": q.is_contiguous(), "k": k.is_contiguous(), "v": v.is_contiguous()},
            requires_grad=torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)),
            module=module, module_class=module_class, location=location, index=len(self.records))
        rec.preferred = preferred_backend(q.device)
        if self.explain and rec.fell_back:
            # its own name: `key` (the envelope cache's) is still needed below
            why_key = (rec.envelope(), tuple(map(tuple, rec.strides.values())), rec.requires_grad, rec.mask_shape,
                       rec.backend, _enabled_flags())
            if why_key not in self._refusal_cache:
                try:
                    self._refusal_cache[why_key] = refusals_for_call(
                        q, k, v, mask, rec.dropout, rec.causal, rec.enable_gqa, ran=backend)
                except (RuntimeError, TypeError) as exc:  # e.g. a tensor subclass SDPAParams will not take
                    self._refusal_cache[why_key] = {
                        "?": f"PyTorch could not be asked why ({type(exc).__name__}: {exc})"}
            rec.refusals = dict(self._refusal_cache[why_key])
        self.records.append(rec)
        if key is not None:
            if len(self._seen) >= _CACHE_LIMIT:
                self._seen.clear()
            self._seen[key] = rec
        return out

    def _flex_eager(self, args) -> None:
        q, k = args[0], args[1]
        module, module_class, location = self.sites.find()
        self.records.append(DispatchRecord(
            backend="flex", fused_op=None, kind="flex", q_shape=tuple(q.shape), k_shape=tuple(k.shape),
            v_shape=tuple(args[2].shape), dtype=_dtype(q), device=str(q.device), module=module,
            module_class=module_class, location=location, index=len(self.records),
            note="flex_attention ran eagerly (not under torch.compile): unfused, it materialises the scores"))

    def triton_launch(self, name: str, args) -> None:
        tensors = [a for a in args if isinstance(a, torch.Tensor)][:3]
        kind = "flex" if kernel_backend(name) == "flex" else "kernel"  # a Triton program: flex's, or a kernel's
        self.records.append(DispatchRecord(
            backend=kind, fused_op=name, kind=kind, q_shape=tuple(tensors[0].shape) if tensors else (),
            k_shape=tuple(tensors[1].shape) if len(tensors) > 1 else (),
            v_shape=tuple(tensors[2].shape) if len(tensors) > 2 else (),
            dtype=_dtype(tensors[0]) if tensors else "", device=str(tensors[0].device) if tensors else "",
            index=len(self.records), note="Triton kernel launch (shapes are its first tensor arguments)"))


_CACHE_LIMIT = 4096
_SEEN: dict[tuple, DispatchRecord] = {}  # envelope key → the record of its first, observed call
_REFUSALS: dict[tuple, dict] = {}


def clear_cache() -> None:
    """Forget every observed envelope and refusal: the next call of each envelope is observed again."""
    _SEEN.clear()
    _REFUSALS.clear()


_Tensor = torch.Tensor
_get_priority = getattr(torch._C, "_get_sdp_priority_order", None)


def _envelope_key(a: dict) -> tuple | None:
    """Everything SDPA's backend choice reads; None when a call must be observed on its own.

    This runs on every watched call, inside a model forward where caches are cold, so it is one flat tuple built
    inline: the watcher's overhead budget is a few µs per call. k, v and the mask share q's
    device (SDPA refuses anything else before choosing a backend).
    """
    q, k, v = a.get("query"), a.get("key"), a.get("value")
    if type(q) is not _Tensor or type(k) is not _Tensor or type(v) is not _Tensor:
        return None  # subclasses (fake, distributed, nested) may dispatch differently: observe every call
    mask = a.get("attn_mask")
    if mask is None:
        mask_key = None
    elif type(mask) is _Tensor:
        mask_key = (mask.shape, mask.stride(), mask.storage_offset() & 15, mask.dtype, mask.requires_grad)
    else:  # CausalBias and friends
        mask_key = (type(mask).__name__, str(getattr(mask, "variant", "")), getattr(mask, "seq_len_q", None),
                    getattr(mask, "seq_len_kv", None))
    return (q.shape, q.stride(), q.storage_offset() & 15, q.dtype, q.requires_grad,
            k.shape, k.stride(), k.storage_offset() & 15, k.dtype, k.requires_grad,
            v.shape, v.stride(), v.storage_offset() & 15, v.dtype, v.requires_grad, q.device, mask_key,
            bool(a.get("is_causal")), float(a.get("dropout_p") or 0.0), a.get("scale") is None,
            bool(a.get("enable_gqa")), torch.is_grad_enabled(), _enabled_flags(),
            tuple(_get_priority()) if _get_priority else ())


def _enabled_flags() -> tuple:
    return (torch._C._get_flash_sdp_enabled(), torch._C._get_mem_efficient_sdp_enabled(),
            torch._C._get_cudnn_sdp_enabled(), torch._C._get_math_sdp_enabled())


def _flex_hop():
    try:
        return torch.ops.higher_order.flex_attention
    except (AttributeError, RuntimeError):
        return None


def _kernel_name(obj) -> str:
    """The Python function's name under Triton's wrappers (Autotuner → Heuristics → JITFunction → function)."""
    for _ in range(5):
        obj = getattr(obj, "fn", None)
        if obj is None:
            return ""
        if inspect.isfunction(obj):
            return obj.__name__
    return ""


@contextlib.contextmanager
def _triton_tap(watcher: _Watcher) -> Iterator[None]:
    """While open, Triton launches of attention kernels (compiled flex, our Triton kernel) become records."""
    if not torch.cuda.is_available():
        yield
        return
    patched: list[tuple[type, object]] = []
    try:
        from torch._inductor.runtime.triton_heuristics import CachingAutotuner

        def autotuner_run(self, *args, _orig=CachingAutotuner.run, **kwargs):
            name = (getattr(self, "inductor_meta", None) or {}).get("kernel_name") or getattr(
                getattr(self, "fn", None), "__name__", "")
            if kernel_backend(name) == "flex":
                watcher.triton_launch(name, args)
            return _orig(self, *args, **kwargs)

        patched.append((CachingAutotuner, CachingAutotuner.run))
        CachingAutotuner.run = autotuner_run
    except ImportError:
        pass
    try:
        from triton.runtime.autotuner import Autotuner
        from triton.runtime.jit import JITFunction

        tuning = [0]  # inside an autotuned launch: its benchmark launches are not separate calls

        def jit_run(self, *args, _orig=JITFunction.run, **kwargs):
            name = _kernel_name(self)
            if not tuning[0] and not kwargs.get("warmup") and kernel_backend(name) is not None:
                watcher.triton_launch(name, args)
            return _orig(self, *args, **kwargs)

        def tuner_run(self, *args, _orig=Autotuner.run, **kwargs):
            name = _kernel_name(self)
            if not tuning[0] and kernel_backend(name) is not None:
                watcher.triton_launch(name, args)
            tuning[0] += 1
            try:
                return _orig(self, *args, **kwargs)
            finally:
                tuning[0] -= 1

        patched += [(JITFunction, JITFunction.run), (Autotuner, Autotuner.run)]
        JITFunction.run = jit_run
        Autotuner.run = tuner_run
    except ImportError:
        pass
    try:
        yield
    finally:
        for cls, orig in patched:
            cls.run = orig


@contextlib.contextmanager
def watch(*, explain: bool = True, hook: str = "patch", observe: str = "first") -> Iterator[list[DispatchRecord]]:
    """`with watch() as calls: model(x)` → `calls` lists one `DispatchRecord` per attention call.

    With `explain` (the default), a call that did not get the fastest backend this device offers carries
    `refusals`: each faster backend and PyTorch's reason for refusing it, computed once per distinct envelope.
    `hook` is "patch" (default, cheap) or "mode" (also sees pre-bound references and eager flex); `observe` is
    "first" (default: operators observed once per distinct envelope) or "every". See the module docstring.
    """
    if hook not in ("patch", "mode") or observe not in ("first", "every"):
        raise ValueError(f"watch(hook={hook!r}, observe={observe!r}): hook is patch|mode, observe is first|every")
    records: list[DispatchRecord] = []
    watcher = _Watcher(records, explain, observe)
    interceptor = watcher if hook == "mode" else _patch_sdpa(watcher)
    with interceptor, _triton_tap(watcher):
        yield records


def _own_torch_function(obj) -> bool:
    """Does `obj`'s class handle torch functions itself (CausalBias does), rather than inheriting Tensor's?"""
    handler = getattr(type(obj), "__torch_function__", None)
    return handler is not None and getattr(handler, "__func__", handler) is not _TENSOR_TORCH_FUNCTION


_TENSOR_TORCH_FUNCTION = torch.Tensor.__torch_function__.__func__


@contextlib.contextmanager
def _patch_sdpa(watcher: _Watcher) -> Iterator[None]:
    """Replace `torch.nn.functional.scaled_dot_product_attention` while the block runs; restore it after."""
    inner = F.scaled_dot_product_attention  # the builtin, or an outer watch()'s wrapper
    busy = threading.local()

    def recorded(*args, **kwargs):
        # CausalBias dispatches back into F.scaled_dot_product_attention: that inner call is part of this one
        if getattr(busy, "on", False) or torch.compiler.is_compiling():
            return inner(*args, **kwargs)
        busy.on = True
        try:
            return watcher._sdpa(call_inner, args, kwargs)
        finally:
            busy.on = False

    def call_inner(*args, **kwargs):
        mask = kwargs.get("attn_mask", args[3] if len(args) > 3 else None)
        if mask is not None and type(mask) is not torch.Tensor and _own_torch_function(mask):
            # CausalBias-style masks handle SDPA in __torch_function__ and recognise it by comparing with the module
            # attribute, which is `recorded` while patched: hand it over as torch itself would.
            return type(mask).__torch_function__(recorded, (type(mask),), args, kwargs)
        return inner(*args, **kwargs)

    # what functools.wraps would copy, minus its slow generic path (this runs on every `with watch()`)
    recorded.__name__, recorded.__qualname__, recorded.__doc__ = inner.__name__, inner.__qualname__, inner.__doc__
    recorded.__module__, recorded.__wrapped__ = inner.__module__, inner
    F.scaled_dot_product_attention = recorded
    try:
        yield
    finally:
        F.scaled_dot_product_attention = inner
