"""The engine's decisions as pure functions of its apps: what the scheduler is told about each app
(:func:`app_profiles`), the status quo's memory enforcement (:func:`enforce_memory`) and the exit
operating point an app runs at for the compute it gets (:func:`choose_point`, FlexDNN's runtime
adaptation). :class:`~nestflex.deploy.engine.Engine` calls them and applies what they return.
"""

from __future__ import annotations

from typing import Sequence

from nestflex.deploy._engine_apps import MB, App
from nestflex.deploy.scheduler import AppProfile

__all__ = ["app_profiles", "enforce_memory", "choose_point", "budget_message"]


def app_profiles(apps: Sequence[App], scale: float) -> list[AppProfile]:
    """The scheduler's view of each app: one row per level with its accuracy, its measured latency
    times ``scale`` (the device's slowdown over the CPU share), its bytes and MACs; the largest
    level of an app with an exit set runs with its exits at their shipped (lossless) thresholds."""
    out = []
    for a in apps:
        rows = []
        for k, r in enumerate(a.bundle.levels):
            ms = a.level_ms[k]
            if k == a.top and a.exit_key is not None:
                ms = a.point_ms(a.lossless)  # the largest level runs with its exits
            rows.append({"level": k, "accuracy": a.level_accuracy(k), "latency_ms": max(ms * scale, 1e-6),
                         "memory_mb": a.level_bytes(k) / MB, "macs": int(r.get("macs") or 0)})
        out.append(AppProfile.from_levels(a.name, rows, min_accuracy=a.min_accuracy, max_latency_ms=a.period_ms))
    return out


def enforce_memory(apps: Sequence[App], levels: dict[str, int], memory_mb: float | None) -> bool:
    """Demote the lowest-priority, then largest, app one level at a time (in ``levels``) until the
    plan fits ``memory_mb`` (schedulers such as the status quo do not plan memory). Returns whether
    it fits: every app fits at level 0 once the engine has refused budgets below that."""
    if memory_mb is None:
        return True
    budget = memory_mb * MB
    while sum(a.level_bytes(levels[a.name]) for a in apps) > budget:
        movable = [a for a in apps if levels[a.name] > 0]
        if not movable:
            return False
        a = min(movable, key=lambda a: (a.priority, -a.level_bytes(levels[a.name]), a.name))
        levels[a.name] -= 1
    return True


def choose_point(app: App, scale: float, adapt: bool) -> int:
    """FlexDNN's runtime adaptation: the most accurate operating point whose predicted time fits
    the app's compute per frame; the cheapest when none fits; the shipped (lossless) thresholds
    when ``adapt`` is false."""
    if not adapt:
        return app.lossless
    budget = app.share * app.period_ms
    fits = [i for i in range(len(app.points)) if app.point_ms(i) * scale <= budget]
    if not fits:
        return min(range(len(app.points)), key=app.point_ms)
    return max(fits, key=lambda i: (app.point_accuracy(i), -app.point_ms(i)))


def budget_message(memory_mb: float, apps: Sequence[App]) -> str:
    """Why ``memory_mb`` is refused: what every app needs at its smallest level."""
    rows = ", ".join(f"{a.name} {a.level_bytes(0) / MB:.3f} MB" for a in apps)
    return (f"`memory_mb`={memory_mb} is below what every app needs at its smallest level together "
            f"({sum(a.level_bytes(0) for a in apps) / MB:.3f} MB: {rows}). HINT: raise the budget or remove an app")
