"""The engine's joint planner (issue 41 items 2-3): each app's configurations as
:class:`~nestflex.deploy.scheduler.joint.JointOption` rows, and one
:class:`~nestflex.deploy.scheduler.joint.JointScheduler` decision for all apps.

An app's options (built once, when it joins, from what the engine measured on this device):

* every capacity level on the device (its measured batch-1 time and resident bytes);
* at the largest level of an app with a local exit set, every exit operating point (FlexDNN's
  thresholds) instead of the level alone;
* for an app with a tail server, every split point x bitwidth x operating point of the
  ``exits`` set (and its device-only rows) from the split scheduler's static rows
  (:meth:`~nestflex.deploy.scheduler.split.SplitScheduler.static_rows`): segment times measured
  here (:func:`~nestflex.deploy.split.costs.measure_costs`), request bytes measured on the bundle's
  samples, the quantisation profile's accuracy drops. Their accuracy is put on the levels' scale
  the way the engine's exit points are (the largest level's accuracy moved by the row's gain or
  loss against the exit set's final exit). Their memory is level 0's bytes (the capacity runtime
  waits there while the app offloads) plus the sessions the offloader's split runtime opens to run
  it: the head's and the continuation's (the tail's open only to run a device-only row; a failed
  request with no exit to answer from runs the frame on the capacity runtime instead). A runtime
  no app runs is dropped.
  Each one that sends comes with the local continuation and without it (``:direct``): the
  continuation's earlier answers and local fallback cost device time on every frame sent, which
  a loaded device may not have.

At each plan the online profiler's slowdown over the CPU share scales every device time, the
network profiler's bandwidth is the link's capacity and its server slowdown the server's; when
:class:`~nestflex.deploy._engine_split.LinkState` says the link is down, no option sends. Each app's
compute share is its share of the device demand the decision predicts (the joint model's
processor sharing), which the engine's fair queue enforces.

Private to :mod:`nestflex.deploy.engine`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from nestflex.deploy._engine_apps import MB, App
from nestflex.deploy.scheduler.joint import JointApp, JointDecision, JointOption, JointResources, JointScheduler
from nestflex.deploy.split.offload import SplitConfig

__all__ = ["RunSpec", "measure_split", "joint_app", "plan_joint", "capacity_levels", "JOINT_NAMES"]

#: scheduler names the engine plans with the joint scheduler
JOINT_NAMES = {"joint_total": "total", "joint_max": "max"}

#: a device time under which an app is not given a smaller share: a server-only split still packs
#: and sends on the device, and a zero share would starve it in the fair queue
MIN_DEVICE_MS = 0.5


@dataclass(frozen=True)
class RunSpec:
    """How the engine runs one option: the capacity level, the local exit operating point (``None``:
    none), and the offloader's configuration (``None``: the engine's own runtimes)."""

    level: int
    point: int | None = None
    config: SplitConfig | None = None


def measure_split(app: App, *, bits: Sequence[int], repeats: int, server_speedup: float) -> tuple[list, list, Any]:
    """The split scheduler's static rows of ``app`` (its ``split`` set), the operating points they
    index and the exit set's final-exit calibration accuracy, measured on this device now.

    Each row that sends is charged what a request costs the device beyond the head, measured here
    per split point (:func:`_request_overhead`: packing, the client's submit, the local continuation
    to the next exit while the request is in flight) times the share of frames sent: about a
    millisecond a request on this machine, several times a small split's head, which the segment
    times alone leave out. ``direct_ms`` is the same row without the local continuation (packing
    and submit only: about half of that at the server-only split here, see :class:`~nestflex.deploy.scheduler.joint.JointOption`).

    Each row also gets ``runtime_bytes`` and ``direct_bytes``: what the offloader's split runtime
    for its split point holds to run it, with the local continuation and without it
    (:meth:`~nestflex.deploy.split.runtime.SplitRuntime.device_bytes`, sessions' graph sizes, as
    the engine counts a level's), read from the runtimes built here; a device-only row runs in the
    first split point's runtime (:meth:`Offloader.runtime`), every session of it open."""
    from nestflex.deploy.operating_points import operating_points
    from nestflex.deploy.scheduler.split import SplitScheduler
    from nestflex.deploy.split.costs import accuracy_drops, measure_bytes, measure_costs

    bundle, s = app.bundle, app.split
    exit_set = s.offloader.exit_set
    points, ref = ([None], None)
    if exit_set is not None:
        points, _, ref = operating_points(bundle, exit_set)
    costs = measure_costs(bundle, exit_set, repeats=repeats)
    shipped = bundle.samples()
    samples = (np.asarray(shipped[0][:16], dtype=np.float32) if shipped is not None else
               np.random.default_rng(0).standard_normal((16, *bundle.input_spec["shape"]), dtype=np.float32))
    frame_bytes = measure_bytes(bundle, samples, bits=[None, *bits])
    sched = SplitScheduler(costs, frame_bytes, points, accuracy_drop=accuracy_drops(bundle),
                           base_accuracy=app.level_accuracy(app.top) if exit_set is None else None,
                           bits=(None, *bits), server_speedup=server_speedup)
    rows = sched.static_rows()
    overhead = _request_overhead(app, samples[:1], {r["split"] for r in rows if r["split"] is not None}, repeats)
    for r in rows:
        if r["split"] is not None:
            with_local, direct = overhead.get(r["split"], (0.0, 0.0))
            r["device_ms"], r["direct_ms"] = (r["device_ms"] + with_local * r["sent"], r["device_ms"] + direct * r["sent"])
        # every runtime a row runs in was built above (the overhead's, or the offloader's first): a lookup.
        # A device-only row opens every session; one that sends, the head's (and the continuation's)
        rt = s.offloader.runtime(r["split"])
        r["runtime_bytes"], r["direct_bytes"] = ((rt.own_bytes, rt.own_bytes) if r["split"] is None
                                                 else (rt.device_bytes(True), rt.device_bytes(False)))
    return rows, points, ref


def _request_overhead(app: App, x: np.ndarray, splits: set[str], repeats: int) -> dict[str, tuple[float, float]]:
    """Per split point, the device's ms for one request beyond the head (no early exit taken: every
    frame sent), the server answering or not, with the local continuation and without it; 0 where
    nothing could be measured."""
    import time

    s = app.split
    off, before = s.offloader, s.offloader.config
    out: dict[str, tuple[float, float]] = {}
    try:
        for split in sorted(splits):
            rt = off.runtime(split)
            never = tuple([1.0] * (rt.num_exits - 1)) if off.exit_set is not None else None
            both = []
            for local in (True, False):
                off.set_config(SplitConfig(split, bits=8, thresholds=never, deadline_ms=s.deadline_ms,
                                           continue_locally=local))
                head, full = [], []
                for _ in range(max(5, repeats)):
                    t0 = time.perf_counter()
                    rt.head(x, never)
                    t1 = time.perf_counter()
                    f = off._start(x, t1)
                    answer, cont = off._finish_here(f)
                    full.append(1e3 * (time.perf_counter() - t1))
                    head.append(1e3 * (t1 - t0))
                    if answer is None:
                        off._finish_remote(f, cont)
                # the fastest of each: the cost itself, not the scheduling noise of a shared CPU on top
                both.append(max(0.0, min(full) - min(head)))
            # the continuation's share can only add to a request: a noisy pair keeps the order
            out[split] = (max(both), min(both))
    finally:
        off.set_config(before)
    return out


#: options already built, by what they are built from: apps of one bundle measured once share one
#: options tuple, so the scheduler's Pareto front (cached by the tuple) is cut once, not per app
_BUILT: dict[tuple, tuple[tuple[JointOption, ...], dict[JointOption, RunSpec], dict[tuple, JointApp]]] = {}


def joint_app(app: App) -> tuple[JointApp, dict[JointOption, RunSpec]]:
    """``app``'s options for the joint scheduler and how each one runs (see the module's docstring)."""
    s = app.split
    key = (str(app.bundle.path), app.exit_key, tuple(app.level_ms), tuple(app.level_mem), app.exits_bytes,
           tuple(app.exit_ms), None if s is None else (id(s.rows), s.deadline_ms))
    hit = _BUILT.get(key)
    if hit is None:
        if len(_BUILT) >= 64:
            _BUILT.clear()
        opts = _options(app)
        hit = _BUILT[key] = (tuple(opts), opts, {})
    # the JointApp too: building one checks each of its (hundreds of) options, on every re-plan
    made = hit[2].get((app.name, app.fps, app.min_accuracy))
    if made is None:
        if len(hit[2]) >= 64:  # apps come and go under new names in a long-running process
            hit[2].clear()
        made = hit[2][(app.name, app.fps, app.min_accuracy)] = JointApp(app.name, hit[0], fps=app.fps,
                                                                        min_accuracy=app.min_accuracy)
    return made, hit[1]


def _options(app: App) -> dict[JointOption, RunSpec]:
    top, opts = app.top, {}
    for k in range(top + 1):
        if k == top and app.exit_key is not None and app.points:
            for i in range(len(app.points)):
                opts.setdefault(JointOption(level=top, accuracy=app.point_accuracy(i), device_ms=app.point_ms(i),
                                            memory_mb=app.level_bytes(top) / MB, point=i), RunSpec(top, i))
        else:
            opts.setdefault(JointOption(level=k, accuracy=app.level_accuracy(k), device_ms=app.level_ms[k],
                                        memory_mb=app.level_bytes(k) / MB), RunSpec(k))
    s = app.split
    if s is not None:
        base = app.level_accuracy(top)
        for r in s.rows:
            if r["accuracy"] is None:  # a bitwidth the quantisation profile did not measure
                continue
            if r["split"] is not None and r["sent"] <= 0:
                # every frame leaves before the split: the device-only row of that point, which
                # (unlike this one) stays valid while the link is down
                continue
            acc = r["accuracy"] if s.accuracy_ref is None else base + r["accuracy"] - s.accuracy_ref
            sends = r["split"] is not None
            thresholds = None if r["point"] is None else tuple(s.points[r["point"]].thresholds)
            # the offloader's split runtime holds its own sessions beside the capacity runtime, charged
            # at level 0: the engine moves it there while the app offloads when the budget needs it
            # a row that sends comes twice: with the local continuation (SPINN's, the Offloader's
            # default) and without it (cheaper on the device; the scheduler weighs the two)
            for local in ((True, False) if sends else (True,)):
                memory = (app.level_bytes(0) + r["runtime_bytes" if local else "direct_bytes"]) / MB
                option = JointOption(level=top, accuracy=min(1.0, max(0.0, float(acc))),
                                     device_ms=float(r["device_ms"] if local else r["direct_ms"]),
                                     memory_mb=memory, point=r["point"], split=r["split"],
                                     bits=r["bits"] if sends else None, sent=float(r["sent"]) if sends else 0.0,
                                     bytes=float(r["bytes"]) if sends else 0.0,
                                     server_ms=float(r["server_ms"]) if sends else 0.0, continue_locally=local)
                config = SplitConfig(r["split"], bits=r["bits"], thresholds=thresholds, deadline_ms=s.deadline_ms,
                                     continue_locally=local)
                opts.setdefault(option, RunSpec(top, None, config))
    return opts


def plan_joint(scheduler: JointScheduler, apps: Sequence[App], *, scale: float, memory_mb: float, link_mbps: float,
               server_capacity: float, server_slowdown: float, alpha: float
               ) -> tuple[JointDecision, dict[str, RunSpec], dict[str, float]]:
    """One decision for ``apps`` (each with ``app.joint`` from :func:`joint_app`): the decision, how
    each app runs, and each app's compute share."""
    res = JointResources(memory_mb=memory_mb, link_mbps=link_mbps, server_capacity=server_capacity,
                         device_slowdown=scale, server_slowdown=server_slowdown)
    decision = scheduler.schedule([a.joint[0] for a in apps], res, alpha=alpha)
    specs = {a.name: a.joint[1][al.option] for a, al in zip(apps, decision.allocations)}
    demand = {a.name: a.fps * max(al.option.device_ms, MIN_DEVICE_MS) for a, al in zip(apps, decision.allocations)}
    total = sum(demand.values())
    return decision, specs, {n: d / total for n, d in demand.items()}


def capacity_levels(apps: Sequence[App], decision: JointDecision, specs: dict[str, RunSpec],
                    memory_mb: float | None) -> dict[str, int]:
    """The level each app's capacity runtime holds under ``decision``: its option's level for an app
    on the device; for an app that offloads (it runs in its split runtime) the level it is at, so
    that going back and forth between a split and the device rebuilds no session, unless that
    holds more than the decision charged and the budget allows: then level 0, which the decision
    charged (the largest first, until it fits)."""
    levels = {a.name: a.level if specs[a.name].config is not None else specs[a.name].level for a in apps}
    if memory_mb is None:
        return levels
    away = sorted((a for a in apps if specs[a.name].config is not None),
                  key=lambda a: a.level_bytes(0) - a.level_bytes(a.level))  # the most held above level 0 first
    held = decision.memory_mb * MB + sum(a.level_bytes(a.level) - a.level_bytes(0) for a in away)
    for a in away:
        if held <= memory_mb * MB:
            break
        held -= a.level_bytes(a.level) - a.level_bytes(0)
        levels[a.name] = 0
    return levels
