"""Multi-tenant simulation of NestDNN's scheduler against the status quo (METHODS §1.6).

Protocol (NestDNN §4.3.1, as far as the paper states it; the rest is ours and documented here):

* **Apps.** A pool of ``pool_size`` apps (6, as the paper's six); app ``i`` runs the profile
  ``i mod P`` of the ``P`` given profiles (so two profiles give three apps each). Each app's
  goals: A_min = its best level's accuracy; L_max = ``goal_factor`` x the knee level's latency,
  i.e. the device can run ``goal_factor`` knee models at their stream rate (``1000 / L_max``
  frames/s). Our profiles are milliseconds on a desktop CPU, not a phone's tens of ms, so L_max
  is set relative to the profile rather than to a 30 fps camera.
* **Trace.** Second 0 starts ``min_apps`` random apps. At every later second one draw decides:
  start a random idle app (probability ``p_start``), kill a random running one (``p_kill``), or
  nothing; a start at ``max_apps`` or a kill at ``min_apps`` does nothing. ``seconds`` seconds
  per run, ``runs`` runs, each seeded by ``(seed, run)``; every system sees the same traces.
* **Systems.** NestDNN: on every change of the running set the scheduler (``greedy``, ``cached``
  or ``exact`` with each objective) decides level and share per app, under
  ``memory_mb`` (default ``memory_fraction`` = 0.75 of the pool's largest levels summed; the
  paper's 400 MB is 76 % of its six apps' 524.6 MB). Baseline: each app runs its fixed knee
  model (:func:`~nestflex.deploy.scheduler.knee_level`) with an equal share (``1/n``); it ignores
  the memory budget and we count the seconds it is over.
* **Per app and second.** Paging time ``p`` (ms) when the app starts (loading its level) or
  switches level: the profile's measured switch time (``switching`` rows, ``nested_ms``) when
  present, else the MB paged (|S(b) - S(a)|, or S(b) at a start) at ``paging_mb_per_s``.
  Frames ``f = min(1000 / L_max, max(0, 1000 u - p) / L(m))`` (fluid: a stream cannot deliver
  more than its frame rate, and the app has ``1000 u`` ms of compute per second).
* **Energy.** Device busy time per second ``B = sum(f L(m) + p)`` ms; energy
  ``P_active B + P_idle (1000 - B)`` mJ. Defaults ``P_active = 1 W``, ``P_idle = 0``: energy is
  then busy time, and energy per frame is the frame-weighted latency plus paging. Both powers
  are parameters; a phone's measured numbers can be put in.

Metrics (NestDNN's, per app, over the baseline): accuracy gain = mean over app-seconds of
``100 (A(m) - A(knee))`` points; frame-rate speedup = total frames / baseline's total frames
(also the mean of the per-app-second ratios); energy reduction = baseline's energy per frame /
NestDNN's. Over the alpha sweep we report the paper's three points per objective: the best
accuracy gain at a frame rate at least the baseline's, the best speedup at an accuracy at least
the baseline's, and the knee of the sweep (max of normalised gain + normalised speedup), with its
energy reduction.

A paper replay, not part of the runtime: it lives beside the benchmarks (timm keeps
``benchmark.py`` outside its package) and ``benchmarks/engine/multitenant.py`` is its command line::

    python benchmarks/engine/multitenant.py --profiles runs/a/grow/profile.json runs/b/grow/profile.json \\
        --out runs/multitenant
"""

from __future__ import annotations

import json
import math
import statistics
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from nestflex.deploy.scheduler import (
    OBJECTIVES,
    AppProfile,
    Decision,
    SchedulerError,
    get_scheduler,
    knee_level,
)

__all__ = [
    "SimulationError",
    "SimulationConfig",
    "PAPER",
    "DEFAULT_ALPHAS",
    "build_pool",
    "make_trace",
    "simulate",
    "plot",
    "synthetic_flag",
]

SCHEMA_VERSION = 1

#: NestDNN's reported figures (MobiCom 2018, §4.3; METHODS §1.6), for side-by-side reporting
PAPER = {
    "accuracy_gain_pct": 4.2,
    "frame_rate_speedup": 2.0,
    "energy_reduction": 1.7,
    "knee": {"frame_rate_speedup": 1.5, "accuracy_gain_pct": {"total": 2.6, "max": 2.1}},
}

DEFAULT_ALPHAS = (0.0, 1e-4, 3e-4, 1e-3, 3e-3, 0.01, 0.03, 0.1, 0.3, 1.0)


class SimulationError(SchedulerError):
    """A simulation argument is out of range or an input profile is unusable."""


@dataclass(frozen=True)
class SimulationConfig:
    """Settings of one simulation (see the module docstring for what each one models).

    Attributes:
        runs: simulated runs (the paper: 100).
        seconds: seconds per run (the paper: 60).
        min_apps: fewest apps running at once (the paper: 2).
        max_apps: most apps running at once (the paper: 6).
        pool_size: distinct apps that can be started.
        p_start: probability, each second, of starting an app.
        p_kill: probability, each second, of killing an app.
        goal_factor: L_max = goal_factor x the knee level's latency.
        memory_mb: memory budget S_max (MB); ``None``: ``memory_fraction`` of the pool's largest
            levels summed.
        memory_fraction: see ``memory_mb``.
        alphas: the latency weights swept.
        objectives: ``"total"`` and/or ``"max"``.
        scheduler: ``"greedy"``, ``"cached"``, ``"exact"`` or ``"greedy_jump"``; the scheduler
            used is ``<scheduler>_<objective>`` from the registry (``greedy_jump`` only with
            ``"total"``).
        unit: compute unit of the scheduler.
        seed: base seed of the traces.
        batch_size: which profiled latency to use (``latency_ms[str(batch_size)]``).
        active_power_w: device power while computing or paging (W).
        idle_power_w: device power while idle (W).
        paging_mb_per_s: paging bandwidth when the profile has no measured switch times.
        latency_model: ``"measured"`` uses the profiled latencies; ``"macs"`` models a
            compute-bound device: L(m) = L(largest) x MACs(m) / MACs(largest) (tiny models on a
            desktop CPU at batch 1 are overhead-bound, so their measured latencies barely
            shrink with the level, unlike a phone's).
    """

    runs: int = 100
    seconds: int = 60
    min_apps: int = 2
    max_apps: int = 6
    pool_size: int = 6
    p_start: float = 0.4
    p_kill: float = 0.3
    goal_factor: float = 3.0
    memory_mb: float | None = None
    memory_fraction: float = 0.75
    alphas: tuple[float, ...] = DEFAULT_ALPHAS
    objectives: tuple[str, ...] = OBJECTIVES
    scheduler: str = "greedy"
    unit: float = 0.01
    seed: int = 0
    batch_size: int = 1
    active_power_w: float = 1.0
    idle_power_w: float = 0.0
    paging_mb_per_s: float = 1000.0
    latency_model: str = "measured"

    def __post_init__(self) -> None:
        def bad(arg: str, value: Any, rule: str, hint: str = "") -> SimulationError:
            return SimulationError(f"`{arg}` {rule}, got {value!r}." + (f" HINT: {hint}" if hint else ""))

        for arg in ("runs", "seconds", "pool_size", "min_apps", "max_apps"):
            v = getattr(self, arg)
            if not (isinstance(v, int) and v >= 1):
                raise bad(arg, v, "must be an integer >= 1")
        if self.min_apps > self.max_apps:
            raise bad("min_apps", self.min_apps, f"must be <= `max_apps`={self.max_apps}")
        if self.max_apps > self.pool_size:
            raise bad("max_apps", self.max_apps, f"must be <= `pool_size`={self.pool_size}",
                      "the pool must hold enough distinct apps")
        for arg in ("p_start", "p_kill"):
            v = getattr(self, arg)
            if not (0.0 <= v <= 1.0):
                raise bad(arg, v, "must be in [0, 1]")
        if self.p_start + self.p_kill > 1.0 + 1e-12:
            raise bad("p_start", self.p_start, f"plus `p_kill`={self.p_kill} must be <= 1")
        if not (self.goal_factor > 0):
            raise bad("goal_factor", self.goal_factor, "must be > 0")
        if self.memory_mb is not None and not (self.memory_mb > 0):
            raise bad("memory_mb", self.memory_mb, "must be > 0 (or None for the default)")
        if not (0.0 < self.memory_fraction <= 1.0):
            raise bad("memory_fraction", self.memory_fraction, "must be in (0, 1]")
        if len(self.alphas) == 0 or any(not (0.0 <= a <= 1.0) for a in self.alphas):
            raise bad("alphas", self.alphas, "must be a non-empty list of values in [0, 1]")
        if len(self.objectives) == 0 or any(o not in OBJECTIVES for o in self.objectives):
            raise bad("objectives", self.objectives, f"must be a non-empty subset of {list(OBJECTIVES)}")
        if self.scheduler not in ("greedy", "cached", "exact", "greedy_jump"):
            raise bad("scheduler", self.scheduler, "must be one of ['cached', 'exact', 'greedy', 'greedy_jump']")
        if self.scheduler == "greedy_jump" and "max" in self.objectives:
            raise bad("scheduler", self.scheduler, "has no MinMaxCost variant", "pass objectives=('total',)")
        for arg in ("active_power_w", "paging_mb_per_s"):
            if not (getattr(self, arg) > 0):
                raise bad(arg, getattr(self, arg), "must be > 0")
        if self.latency_model not in ("measured", "macs"):
            raise bad("latency_model", self.latency_model, "must be 'measured' or 'macs'")
        if not (self.idle_power_w >= 0):
            raise bad("idle_power_w", self.idle_power_w, "must be >= 0")

    def scheduler_name(self, objective: str) -> str:
        """Registry name of the scheduler used for ``objective``."""
        if self.scheduler == "greedy_jump":
            return "greedy_total_jump"
        return f"{self.scheduler}_{objective}"


def build_pool(profiles: Sequence[AppProfile], config: SimulationConfig) -> list[AppProfile]:
    """The ``pool_size`` simulated apps: profile ``i mod P``, named ``<profile>#<i>``, with goals.

    Raises:
        SimulationError: no profiles.
    """
    if len(profiles) == 0:
        raise SimulationError(
            "no profiles to simulate. HINT: pass --profiles <out>/grow/profile.json or --bundles <bundle>."
        )
    if config.latency_model == "macs":
        profiles = [_macs_latency(p) for p in profiles]
    pool = []
    for i in range(config.pool_size):
        prof = profiles[i % len(profiles)]
        knee = prof.levels[knee_level(prof)]
        pool.append(prof.renamed(f"{prof.name}#{i}").with_goals(max_latency_ms=config.goal_factor * knee.latency_ms))
    return pool


def _macs_latency(app: AppProfile) -> AppProfile:
    top = app.levels[-1]
    if top.macs <= 0:
        raise SimulationError(
            f"app {app.name!r}: `latency_model`='macs' needs the levels' MACs, but they are missing. "
            "HINT: use latency_model='measured'."
        )
    levels = tuple(replace(lv, latency_ms=top.latency_ms * lv.macs / top.macs) for lv in app.levels)
    return replace(app, levels=levels)


def make_trace(config: SimulationConfig, run: int) -> list[tuple[int, ...]]:
    """Running apps (sorted pool indices) at each second of run ``run``; seeded by ``(seed, run)``.

    Example:
        >>> trace = make_trace(SimulationConfig(seconds=5), run=0)
        >>> len(trace), all(2 <= len(s) <= 6 for s in trace)
        (5, True)
    """
    rng = np.random.default_rng([config.seed, run])
    running = sorted(rng.choice(config.pool_size, size=config.min_apps, replace=False).tolist())
    trace = [tuple(running)]
    for _ in range(1, config.seconds):
        draw = rng.random()
        if draw < config.p_start:
            idle = [i for i in range(config.pool_size) if i not in running]
            if len(running) < config.max_apps and idle:
                running = sorted(running + [idle[int(rng.integers(len(idle)))]])
        elif draw < config.p_start + config.p_kill:
            if len(running) > config.min_apps:
                running.pop(int(rng.integers(len(running))))
        trace.append(tuple(running))
    return trace


class _Totals:
    """Accumulators of one system over all runs."""

    def __init__(self) -> None:
        self.frames = 0.0
        self.energy_mj = 0.0
        self.busy_ms = 0.0
        self.paging_ms = 0.0
        self.app_seconds = 0
        self.acc_sum = 0.0
        self.gain_sum = 0.0
        self.goal_met = 0
        self.switches = 0
        self.seconds = 0
        self.over_budget_s = 0
        self.peak_memory_mb = 0.0
        self.ratio_sum = 0.0  # per-app-second frame ratio to the baseline
        self.cost_sum = 0.0

    def report(self, baseline: "_Totals | None") -> dict[str, Any]:
        out = {
            "mean_accuracy": self.acc_sum / self.app_seconds,
            "frames_per_app_second": self.frames / self.app_seconds,
            "energy_mj_per_frame": self.energy_mj / self.frames if self.frames else math.inf,
            "busy_share": self.busy_ms / (1000.0 * self.seconds),
            "paging_ms_total": self.paging_ms,
            "level_switches": self.switches,
            "goal_met_share": self.goal_met / self.app_seconds,
            "peak_memory_mb": self.peak_memory_mb,
            "seconds_over_memory_budget": self.over_budget_s,
            "mean_decision_value": self.cost_sum / self.seconds,
        }
        if baseline is not None:
            out.update(
                accuracy_gain_pct=100.0 * self.gain_sum / self.app_seconds,
                frame_rate_speedup=self.frames / baseline.frames,
                frame_rate_speedup_mean=self.ratio_sum / self.app_seconds,
                energy_reduction=(baseline.energy_mj / baseline.frames) / (self.energy_mj / self.frames),
            )
        return out


def _account(
    totals: _Totals, pool: list[AppProfile], running: tuple[int, ...], decision: Decision,
    prev: dict[int, int], knee_acc: list[float], config: SimulationConfig, budget: float,
    base_frames: dict[int, float] | None,
) -> tuple[dict[int, int], dict[int, float]]:
    """Add one second of one system to ``totals``; return its levels and frames per app."""
    busy = 0.0
    levels: dict[int, int] = {}
    frames_out: dict[int, float] = {}
    for idx, alloc in zip(running, decision.allocations):
        app = pool[idx]
        li = _level_index(app, alloc.level)
        lv = app.levels[li]
        page = 0.0
        if idx not in prev:
            page = 1000.0 * lv.memory_mb / config.paging_mb_per_s
        elif prev[idx] != li:
            old = app.levels[prev[idx]]
            measured = app.switch_time_ms(old.level, lv.level)
            page = measured if measured is not None else 1000.0 * abs(lv.memory_mb - old.memory_mb) / config.paging_mb_per_s
            totals.switches += 1
        stream = 1000.0 / app.goal_latency_ms
        f = min(stream, max(0.0, 1000.0 * alloc.share - page) / lv.latency_ms)
        busy += f * lv.latency_ms + page
        totals.paging_ms += page
        totals.frames += f
        totals.acc_sum += lv.accuracy
        totals.gain_sum += lv.accuracy - knee_acc[idx]
        totals.goal_met += f >= stream * (1 - 1e-9)
        if base_frames is not None:
            totals.ratio_sum += f / base_frames[idx] if base_frames[idx] > 0 else 1.0
        levels[idx] = li
        frames_out[idx] = f
    totals.app_seconds += len(running)
    totals.seconds += 1
    totals.busy_ms += busy
    totals.energy_mj += config.active_power_w * busy + config.idle_power_w * max(0.0, 1000.0 - busy)
    totals.peak_memory_mb = max(totals.peak_memory_mb, decision.memory_mb)
    totals.over_budget_s += decision.memory_mb > budget + 1e-9
    totals.cost_sum += decision.value
    return levels, frames_out


def _level_index(app: AppProfile, level: int) -> int:
    for i, lv in enumerate(app.levels):
        if lv.level == level:
            return i
    raise AssertionError(f"level {level} not in {app.name}")  # internal: decisions name real levels


def _knee_of_sweep(points: list[dict[str, Any]]) -> int:
    """Index of the sweep point maximising normalised accuracy gain + normalised speedup."""
    g = [p["accuracy_gain_pct"] for p in points]
    s = [p["frame_rate_speedup"] for p in points]

    def norm(xs: list[float]) -> list[float]:
        span = max(xs) - min(xs)
        return [(x - min(xs)) / span if span > 0 else 0.0 for x in xs]

    score = [a + b for a, b in zip(norm(g), norm(s))]
    return max(range(len(points)), key=lambda i: (score[i], -i))


def simulate(profiles: Sequence[AppProfile], config: SimulationConfig = SimulationConfig()) -> dict[str, Any]:
    """Run the simulation; return the summary (JSON-ready dict, see the module docstring).

    Args:
        profiles: one :class:`AppProfile` per model (their goals are replaced by the protocol's).
        config: the settings.

    Returns:
        ``{"config", "memory_budget_mb", "apps", "trace", "baseline", "sweep", "comparison",
        "paper", "decision_ms"}``.

    Raises:
        SimulationError: no profiles, or the budget cannot hold ``max_apps`` smallest levels.

    Example:
        >>> rows = [{"level": k, "accuracy": a, "macs": m, "memory_mb": m, "latency_ms": {"1": m}}
        ...         for k, (a, m) in enumerate([(0.70, 1), (0.80, 2), (0.84, 4)])]
        >>> cfg = SimulationConfig(runs=2, seconds=10, alphas=(0.0, 1.0), objectives=("total",))
        >>> out = simulate([AppProfile.from_levels("cam", rows)], cfg)
        >>> sorted(out["sweep"]["total"][0])[:3]
        ['accuracy_gain_pct', 'alpha', 'busy_share']
    """
    pool = build_pool(profiles, config)
    budget = config.memory_mb
    if budget is None:
        budget = config.memory_fraction * math.fsum(a.levels[-1].memory_mb for a in pool)
    worst = sorted((a.levels[0].memory_mb for a in pool), reverse=True)[: config.max_apps]
    if math.fsum(worst) > budget + 1e-9:
        raise SimulationError(
            f"`memory_mb`={budget:.4f} cannot hold {config.max_apps} apps at their smallest levels "
            f"({math.fsum(worst):.4f} MB). HINT: raise --memory-budget-mb or lower max_apps."
        )
    knee_idx = [knee_level(a) for a in pool]
    knee_acc = [a.levels[k].accuracy for a, k in zip(pool, knee_idx)]
    traces = [make_trace(config, r) for r in range(config.runs)]

    # the baseline: fixed knee models, equal shares (independent of alpha)
    knee = get_scheduler("knee")
    base = _Totals()
    base_frames_per_run: list[list[dict[int, float]]] = []
    for trace in traces:
        prev: dict[int, int] = {}
        per_second = []
        for running in trace:
            d = knee.schedule([pool[i] for i in running], memory_mb=budget, alpha=0.0)
            prev, frames = _account(base, pool, running, d, prev, knee_acc, config, budget, None)
            per_second.append(frames)
        base_frames_per_run.append(per_second)

    sweep: dict[str, list[dict[str, Any]]] = {}
    decision_s: list[float] = []
    for objective in config.objectives:
        name = config.scheduler_name(objective)
        points = []
        for alpha in config.alphas:
            sched = get_scheduler(name)
            memo: dict[tuple[int, ...], Decision] = {}
            stateless = not name.startswith("cached")
            tot = _Totals()
            for trace, base_frames in zip(traces, base_frames_per_run):
                prev = {}
                last_set, d = None, None
                for t, running in enumerate(trace):
                    if running != last_set:  # the scheduler runs on events, not every second
                        if stateless and running in memo:
                            d = memo[running]
                        else:
                            t0 = time.perf_counter()
                            d = sched.schedule([pool[i] for i in running], memory_mb=budget, alpha=alpha,
                                               unit=config.unit)
                            decision_s.append(time.perf_counter() - t0)
                            memo[running] = d
                        last_set = running
                    prev, _ = _account(tot, pool, running, d, prev, knee_acc, config, budget, base_frames[t])
            points.append({"alpha": alpha, **tot.report(base)})
        sweep[objective] = points

    comparison = {}
    for objective, points in sweep.items():
        faster = [p for p in points if p["frame_rate_speedup"] >= 1.0]
        accurate = [p for p in points if p["accuracy_gain_pct"] >= 0.0]
        k = points[_knee_of_sweep(points)]
        best_gain = max(faster, key=lambda p: p["accuracy_gain_pct"]) if faster else None
        best_speed = max(accurate, key=lambda p: p["frame_rate_speedup"]) if accurate else None
        comparison[objective] = {
            "accuracy_gain_pct_at_baseline_frame_rate": best_gain and best_gain["accuracy_gain_pct"],
            "alpha_of_accuracy_gain": best_gain and best_gain["alpha"],
            "frame_rate_speedup_at_baseline_accuracy": best_speed and best_speed["frame_rate_speedup"],
            "alpha_of_frame_rate_speedup": best_speed and best_speed["alpha"],
            "knee": {key: k[key] for key in ("alpha", "accuracy_gain_pct", "frame_rate_speedup", "energy_reduction")},
            "max_energy_reduction": max(p["energy_reduction"] for p in points),
        }

    counts = [len(s) for tr in traces for s in tr]
    running_time = [0] * config.pool_size
    for tr in traces:
        for s in tr:
            for i in s:
                running_time[i] += 1
    total_app_s = sum(running_time)
    return {
        "schema_version": SCHEMA_VERSION,
        "config": {**asdict(config), "alphas": list(config.alphas), "objectives": list(config.objectives)},
        "memory_budget_mb": budget,
        "apps": [
            {"name": a.name, "knee_level": a.levels[k].level, "knee_accuracy": a.levels[k].accuracy,
             "goal_accuracy": a.goal_accuracy, "goal_latency_ms": a.goal_latency_ms,
             "levels": [asdict(lv) for lv in a.levels], "measured_switch_times": bool(a.switch_ms)}
            for a, k in zip(pool, knee_idx)
        ],
        "trace": {
            "concurrency_share": {str(n): counts.count(n) / len(counts)
                                  for n in range(config.min_apps, config.max_apps + 1)},
            "app_running_share": {pool[i].name: running_time[i] / total_app_s for i in range(config.pool_size)},
        },
        "baseline": base.report(None),
        "sweep": sweep,
        "comparison": comparison,
        "paper": PAPER,
        "decision_ms": {
            "median": 1e3 * statistics.median(decision_s) if decision_s else None,
            "calls": len(decision_s),
            "note": "scheduler wall time per decision in this simulation (stateless schedulers are memoised "
                    "per running set, so only first decisions are timed); benchmarks/engine/scheduler.py measures it properly",
        },
    }


def plot(summary: dict[str, Any], path: str | Path) -> Path | None:
    """Accuracy gain vs frame-rate speedup over the alpha sweep, and energy reduction per alpha.

    Returns the PNG path, or ``None`` when matplotlib (an optional dependency) is not installed.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    from io import BytesIO

    from nestflex._io import atomic_write_bytes

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for objective, points in summary["sweep"].items():
        xs = [p["frame_rate_speedup"] for p in points]
        ys = [p["accuracy_gain_pct"] for p in points]
        ax1.plot(xs, ys, "o-", label=f"NestDNN {'MinTotalCost' if objective == 'total' else 'MinMaxCost'}")
        k = summary["comparison"][objective]["knee"]
        ax1.plot([k["frame_rate_speedup"]], [k["accuracy_gain_pct"]], "k*", ms=12)
        ax2.semilogx([max(p["alpha"], 1e-5) for p in points], [p["energy_reduction"] for p in points], "o-",
                     label=objective)
    ax1.plot([1.0], [0.0], "s", color="gold", ms=10, label="status quo (knee models)")
    ax1.axvline(1.0, ls=":", c="grey")
    ax1.axhline(0.0, ls=":", c="grey")
    ax1.set_xlabel("frame-rate speedup over baseline")
    ax1.set_ylabel("accuracy gain over baseline (points)")
    ax1.set_title("alpha sweep (star: knee)")
    ax1.legend(fontsize=8)
    ax2.axhline(1.0, ls=":", c="grey")
    ax2.set_xlabel("alpha (0 drawn at 1e-5)")
    ax2.set_ylabel("energy reduction (baseline J/frame / NestDNN)")
    ax2.legend(fontsize=8)
    synthetic = summary.get("synthetic")
    fig.suptitle("multi-tenant simulation" + (" (profiles measured on synthetic data)" if synthetic else ""))
    fig.tight_layout()
    buf = BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return atomic_write_bytes(path, buf.getvalue())


def synthetic_flag(path: Path) -> bool | None:
    """Whether the run that wrote this profile or bundle trained on synthetic data (None: unknown).
    A bundle's manifest says so in ``model.synthetic`` when the recipe exported it."""
    candidates = [path / "manifest.json", path, path.parent / "config.json", path.parent.parent / "summary.json", path.parent / "summary.json"]
    for c in candidates:
        try:
            doc = json.loads(c.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        found = _find_key(doc, "synthetic")
        if found is not None:
            return bool(found)
    return None


def _find_key(doc: Any, key: str, depth: int = 0) -> Any:
    if depth > 6:
        return None
    if isinstance(doc, dict):
        if key in doc and isinstance(doc[key], bool):
            return doc[key]
        for v in doc.values():
            r = _find_key(v, key, depth + 1)
            if r is not None:
                return r
    return None
