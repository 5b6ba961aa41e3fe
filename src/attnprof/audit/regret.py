"""Regret per call site: what ran, the measured fastest allowed arm, and what the difference costs.

For each site (call site × shape class, `audit.phases`) every arm is timed on the site's own call (`arm_timing`).
The run itself says how many of the site's calls met a new shape (first calls: every decode step brings a new KV
length) and how many repeated one; so each arm's cost for the site is

    estimate(arm) = first calls × its first-call time + repeat calls × its repeat time

`ran` is that sum over the backends the watcher saw run (each through the arm that pins it), `best` the smallest
estimate among those arms and the arms that reach another backend (an arm reaching a backend that ran, such as SDPA's
own choice, is not an alternative to it). The regret is `ran − best` in ms for the site's calls, per call, and per
generated token (divided by the decode steps the run made); the relative regret `ran / best − 1` is what
`--require measured` holds against the tolerance (default 0.10). A site whose backend could not be re-run is
`unmeasured`, never passed silently.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from attnprof.audit import regret_cache
from attnprof.audit.arm_timing import ARM_OF_BACKEND, ArmResult, arms, fresh_lengths, time_arm
from attnprof.audit.fixes import fixes, pin_backend
from attnprof.audit.phases import Site
from attnprof.variants.base import Variant

DEFAULT_TOLERANCE = 0.10


@dataclass(frozen=True)
class Plan:
    """How to measure: first-call samples per arm, timed repeats, warm-up, cache use."""

    samples: int = 3
    reps: int = 10
    warmup: int = 2
    cache: bool = True

    @classmethod
    def for_device(cls, device: str, cache: bool = True) -> Plan:
        return cls(5, 20, 3, cache) if device.startswith("cuda") else cls(3, 5, 1, cache)


@dataclass
class SiteRegret:
    site: Site
    arms: list[ArmResult]
    ran: dict[str, int]  # backend → calls
    ran_ms: float | None  # estimated ms of what ran, over the site's calls
    best: ArmResult | None
    best_ms: float | None
    steps: int  # decode steps of the run (tokens generated per sequence)
    tolerance: float
    fixes: list[str] = field(default_factory=list)
    pin: str | None = None  # backend to pin for this shape class when the site is over the tolerance
    unmeasured: str | None = None  # why `ran` has no estimate

    @property
    def regret_ms(self) -> float | None:
        return None if self.ran_ms is None or self.best_ms is None else max(0.0, self.ran_ms - self.best_ms)

    @property
    def regret_pct(self) -> float | None:
        if self.regret_ms is None or not self.best_ms:
            return None
        return 100.0 * self.regret_ms / self.best_ms

    @property
    def per_call_ms(self) -> float | None:
        return None if self.regret_ms is None else self.regret_ms / max(1, len(self.site.calls))

    @property
    def per_token_ms(self) -> float | None:
        return None if self.regret_ms is None or not self.steps else self.regret_ms / self.steps

    @property
    def verdict(self) -> str:
        if self.unmeasured is not None:
            return "unmeasured"
        return "over" if self.regret_pct is not None and self.regret_pct > 100 * self.tolerance else "ok"

    def estimate(self, arm: ArmResult) -> float | None:
        return arm.estimate(self.site.n_first, self.site.n_repeat)

    def to_json(self) -> dict:
        return {"site": self.site.to_json(), "ran": self.ran, "ran_ms": self.ran_ms,
                "best_arm": self.best.arm if self.best else None, "best_backend": self.best.backend if self.best
                else None, "best_ms": self.best_ms, "regret_ms": self.regret_ms, "regret_pct": self.regret_pct,
                "regret_ms_per_call": self.per_call_ms, "regret_ms_per_token": self.per_token_ms,
                "steps": self.steps, "tolerance": self.tolerance, "verdict": self.verdict, "fixes": self.fixes,
                "pin": self.pin, "unmeasured": self.unmeasured,
                "arms": [a.to_json() | {"estimate_ms": self.estimate(a)} for a in self.arms]}


def measure_site(site: Site, candidates: dict[str, Variant], *, device: str, base_kv: int, plan: Plan,
                 entries: dict, fresh: dict, seed: int = 0, on_arm: Callable[[str], None] | None = None
                 ) -> list[ArmResult]:
    """Every candidate arm on the site's representative call (cached entries reused, new ones added to `fresh`)."""
    rec = site.representative()
    out: list[ArmResult] = []
    for name, variant in candidates.items():
        if on_arm:
            on_arm(name)
        key = regret_cache.entry_key(device, name, rec, samples=plan.samples, reps=plan.reps)
        found = regret_cache.lookup(entries, key) if plan.cache else None
        if found is None:
            found = time_arm(variant, rec, kv_lengths=fresh_lengths(base_kv, plan.samples), reps=plan.reps,
                             warmup=plan.warmup, device=device, seed=seed)
            if plan.cache and regret_cache.cacheable(name, found):
                fresh[key] = found
        out.append(found)
    return out


def judge(site: Site, results: list[ArmResult], *, steps: int, tolerance: float, device: str) -> SiteRegret:
    by_name = {a.arm: a for a in results}
    ran = site.ran()
    ran_ms = 0.0
    missing = []
    for backend in ran:
        arm = _arm_for(backend, by_name)
        idx = [i for i, c in enumerate(site.calls) if c.backend == backend]
        n_first = sum(site.first[i] for i in idx)
        est = arm.estimate(n_first, len(idx) - n_first) if arm is not None else None
        if est is None:
            why = by_name.get(ARM_OF_BACKEND.get(backend, ""))
            missing.append(f"{backend}: " + (f"its arm {why.arm} is {why.status}: {why.reason}" if why else
                                             "no arm reproduces it"))
        else:
            ran_ms += est
    # an arm that reaches a backend which ran is that backend again (sdpa auto and sdpa-cudnn are one kernel): it
    # stands for what ran, through the arm that pins it, never as an "alternative" that differs only by noise
    ran_arms = [a for a in (_arm_for(b, by_name) for b in ran) if a is not None and a.ok]
    measured = [a for a in results if a.ok and a.backend not in ran] + ran_arms
    best = min(measured, key=lambda a: a.estimate(site.n_first, site.n_repeat)) if measured else None
    best_ms = best.estimate(site.n_first, site.n_repeat) if best else None
    out = SiteRegret(site, results, ran, None if missing else ran_ms, best, best_ms, steps, tolerance,
                     unmeasured="; ".join(missing) or (None if best else "no arm ran"))
    if out.verdict == "over" and best is not None:
        top = next(iter(ran))
        out.fixes = fixes(shape_class=site.shape_class, ran=top, best_arm=best.arm, best_backend=best.backend,
                          device=device)
        out.pin = pin_backend(best.arm, best.backend)
    return out


def _arm_for(backend: str, by_name: dict[str, ArmResult]) -> ArmResult | None:
    arm = by_name.get(ARM_OF_BACKEND.get(backend, ""))
    if arm is not None and arm.ok:
        return arm
    auto = by_name.get("sdpa")  # SDPA's own choice reaches the same backend
    return auto if auto is not None and auto.ok and auto.backend == backend else arm


def measure(sites: list[Site], *, device: str, steps: int, tolerance: float = DEFAULT_TOLERANCE,
            variants: list[Variant] | None = None, plan: Plan | None = None, seed: int = 0,
            on_arm: Callable[[str], None] | None = None) -> list[SiteRegret]:
    """Time every arm on every site and judge each site's regret (see the module docstring)."""
    plan = plan or Plan.for_device(device)
    candidates = arms(variants)
    base_kv = max((c.k_shape[2] for s in sites for c in s.calls), default=0)
    entries = regret_cache.load() if plan.cache else {}
    fresh: dict[str, ArmResult] = {}
    out = []
    for site in sites:
        results = measure_site(site, candidates, device=device, base_kv=base_kv, plan=plan, entries=entries,
                               fresh=fresh, seed=seed,
                               on_arm=(lambda name, s=site: on_arm(f"{s.key}: {name}")) if on_arm else None)
        out.append(judge(site, results, steps=steps, tolerance=tolerance, device=device))
    regret_cache.store(fresh)
    return out


def fix_flag(regrets: list[SiteRegret]) -> str | None:
    """The `--pin` that applies every site's pin fix (one backend for all classes when they agree)."""
    pins = {r.site.shape_class: r.pin for r in regrets if r.verdict == "over" and r.pin}
    if not pins:
        return None
    if len(set(pins.values())) == 1 and len(pins) == len({r.site.shape_class for r in regrets}):
        return f"--pin {next(iter(pins.values()))}"
    return "--pin " + ",".join(f"{cls}={b}" for cls, b in sorted(pins.items()))
