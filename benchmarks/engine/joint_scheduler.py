"""The joint scheduler's decision time and optimality gap (issue 41, acceptance 2).

* **Apps from real bundles**: each ``--bundle`` gives one app's options
  (:func:`nestflex.deploy.scheduler.joint.joint_options`): every level on the device, plus split
  point x bitwidth x exit operating point of its largest level, from this machine's measured
  segment times (``measure_costs``), the frames' measured bytes (``measure_bytes`` on the bundle's
  samples), the bundle's exit calibration and split quantisation profile. ``--apps`` apps are
  drawn from the bundles in turn, each with a seeded goal rate (15, 30 or 60 frames/s).
* **Conditions**: a seeded grid of link bandwidths (the Norway 3G / FCC range, 0.5-100 Mbit/s),
  server capacities, device slowdowns and memory budgets (a fraction of the apps' largest
  configurations).
* **Decision time**: :class:`JointScheduler` with ``--apps`` apps (6 by default), median and p95
  over the conditions, each decision from scratch (a fresh scheduler: no warm start).
* **Optimality gap**: the heuristic against :class:`ExactJointScheduler` on ``--small-apps`` apps
  (3), both objectives; gap = (heuristic - exact) / max(exact, 0.01), the floor being one
  accuracy point so that a zero-cost optimum does not make a tiny difference infinite.

Writes ``--out/summary.json`` with the ``goals`` object.

    python benchmarks/engine/joint_scheduler.py --bundle runs/vgg_default/bundle.nfx --bundle runs/vgg_mnist/bundle.nfx \\
        --out docs/results/joint_scheduler/w05
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from nestflex._io import write_json
from nestflex._machine import machine
from nestflex.deploy import load
from nestflex.deploy.engine import operating_points
from nestflex.deploy.scheduler import AppProfile
from nestflex.deploy.scheduler.joint import (ExactJointScheduler, JointApp, JointResources, JointScheduler,
                                             joint_options)
from nestflex.deploy.scheduler.split import SplitScheduler
from nestflex.deploy.split import SERVER_ONLY
from nestflex.deploy.split.costs import accuracy_drops, measure_bytes, measure_costs

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: the repository root, for benchmarks.*
from benchmarks._common import add_out_args, resolve_out, write_run  # noqa: E402

BITS = (2, 4, 6, 8)


def app_options(path: str, server_speedup: float, log) -> dict[str, Any]:
    """One bundle's options and what they were made from."""
    bundle = load(path)
    levels = AppProfile.from_bundle(bundle).levels
    points, _, _ = operating_points(bundle, "exits") if "exits" in bundle.exit_sets else ([None], 0, None)
    start = time.perf_counter()
    costs = measure_costs(bundle, "exits" if "exits" in bundle.exit_sets else None, repeats=20)
    shipped = bundle.samples()
    samples = shipped[0][:32] if shipped is not None else np.random.default_rng(0).standard_normal(
        (32, *bundle.spec.input.shape)).astype(np.float32)
    frame_bytes = measure_bytes(bundle, samples, bits=[None, *BITS])
    drops = accuracy_drops(bundle)
    for b in BITS:  # the input of 8-bit pixels: 8 bits lose nothing, fewer are not profiled
        if b >= 8:
            drops[(SERVER_ONLY, b)] = 0.0
    sched = SplitScheduler(costs, frame_bytes, points, accuracy_drop=drops, bits=(None, *BITS),
                           server_speedup=server_speedup)
    options = joint_options(levels, split_rows=sched.static_rows())
    log(f"{path}: {len(levels)} levels, {len(points)} operating points, {len(options)} options "
        f"({time.perf_counter() - start:.1f} s to measure)")
    return {"bundle": path, "options": options, "levels": len(levels), "points": len(points)}


def conditions(n: int, seed: int) -> list[dict[str, float]]:
    rng = np.random.default_rng(seed)
    return [{"link_mbps": float(rng.choice([0.5, 1.0, 3.0, 5.0, 20.0, 100.0])),
             "server_capacity": float(rng.choice([0.25, 0.5, 1.0, 2.0])),
             "device_slowdown": float(rng.choice([1.0, 1.5, 2.5, 4.0])),
             "memory_fraction": float(rng.choice([0.5, 0.75, 1.0]))} for _ in range(n)]


def make_apps(sources: list[dict[str, Any]], n: int, seed: int) -> list[JointApp]:
    rng = np.random.default_rng(seed)
    return [JointApp(f"app{i}", sources[i % len(sources)]["options"], fps=float(rng.choice([15.0, 30.0, 60.0])))
            for i in range(n)]


def resources(apps: list[JointApp], c: dict[str, float]) -> JointResources:
    lo = sum(min(o.memory_mb for o in a.options) for a in apps)
    hi = sum(max(o.memory_mb for o in a.options) for a in apps)
    return JointResources(memory_mb=max(lo, c["memory_fraction"] * hi), link_mbps=c["link_mbps"],
                          server_capacity=c["server_capacity"], device_slowdown=c["device_slowdown"])


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bundle", action="append", required=True, help="a bundle (repeat for more)")
    add_out_args(p, "summary.json, log.txt and run.json")
    p.add_argument("--apps", type=int, default=6)
    p.add_argument("--small-apps", type=int, default=3)
    p.add_argument("--conditions", type=int, default=30)
    p.add_argument("--repeats", type=int, default=5, help="timed decisions per condition (median)")
    p.add_argument("--alpha", type=float, default=0.5)
    p.add_argument("--server-speedup", type=float, default=4.0)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    out = resolve_out(args, __file__)
    lines: list[str] = []

    def log(msg: str) -> None:
        print(msg, flush=True)
        lines.append(msg)

    t0 = time.perf_counter()
    sources = [app_options(b, args.server_speedup, log) for b in args.bundle]
    grid = conditions(args.conditions, args.seed)
    timing, fronts = [], []
    for i, c in enumerate(grid):
        apps = make_apps(sources, args.apps, args.seed + i)
        res = resources(apps, c)
        times = []
        for _ in range(args.repeats):
            d = JointScheduler("total").schedule(apps, res, alpha=args.alpha)
            times.append(d.decision_ms)
        timing.append(statistics.median(times))
        fronts.append(list(d.front_sizes))
    gaps: dict[str, list[float]] = {"total": [], "max": []}
    offloading = []
    for i, c in enumerate(grid):
        apps = make_apps(sources, args.small_apps, args.seed + 1000 + i)
        res = resources(apps, c)
        for objective in gaps:
            h = JointScheduler(objective).schedule(apps, res, alpha=args.alpha)
            e = ExactJointScheduler(objective, max_combinations=10**8).schedule(apps, res, alpha=args.alpha)
            gaps[objective].append((h.value - e.value) / max(e.value, 0.01))
            if objective == "total":
                offloading.append(sum(a.option.split is not None for a in h.allocations))
    all_gaps = gaps["total"] + gaps["max"]
    median_ms = statistics.median(timing)
    p95_ms = float(np.percentile(timing, 95))
    summary = {
        "benchmark": "joint_scheduler", "machine": machine(), "seconds_total": round(time.perf_counter() - t0, 1),
        "data_labels": {s["bundle"]: "the bundle's own samples and profiles" for s in sources},
        "args": {**vars(args), "out": str(out)},
        "sources": [{k: v for k, v in s.items() if k != "options"} | {"options": [o.label for o in s["options"]]}
                    for s in sources],
        "decision_ms": {"median": median_ms, "p95": p95_ms, "max": max(timing), "per_condition": timing},
        "front_sizes": fronts,
        "gaps": gaps,
        "small_instances_offloading_apps": offloading,
        "goals": {
            "decision_time": {
                "target": f"<= 5 ms median for {args.apps} apps on this CPU", "measured": round(median_ms, 3),
                "met": median_ms <= 5.0,
                "note": f"JointScheduler('total') from scratch, median over {args.conditions} seeded conditions of the "
                        f"median of {args.repeats} decisions; p95 {p95_ms:.3f} ms"},
            "optimality_gap": {
                "target": "<= 2% median against the exact solver on small instances",
                "measured": round(statistics.median(all_gaps), 5), "met": statistics.median(all_gaps) <= 0.02,
                "note": f"{args.small_apps} apps, {args.conditions} conditions x both objectives; gap = (heuristic - "
                        f"exact) / max(exact, 0.01); optimal in {sum(g <= 1e-9 for g in all_gaps)} of {len(all_gaps)}, "
                        f"worst {max(all_gaps):.4f}"},
        },
    }
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "summary.json", summary)
    (out / "log.txt").write_text("\n".join(lines) + "\n")
    write_run(out, __file__, argv)
    for k, g in summary["goals"].items():
        log(f"{k}: {g['measured']} ({g['target']}): {'met' if g['met'] else 'NOT met'}")
    return summary


if __name__ == "__main__":
    main(sys.argv[1:])
