"""NestDNN scheduler: decision time, optimality gap vs the exact solver, cached vs full greedy.

Random seeded instances (``--instances``; apps 4-6, 5 levels each, accuracies 0.5-0.95, latencies
1-20 ms at 100 % compute, latency goals 10-60 ms, memory 1-50 MB per level, budget uniformly
between the smallest and the largest configuration, alpha drawn from {0.01, 0.1, 0.5, 1}):

* **decision time**: median wall time of one decision for 6 apps x 5 levels at a 1 % unit, per
  scheduler (``greedy_total``, ``greedy_max``, ``greedy_total_jump``, the cached variants
  resuming from their cache, and the exact solver), median over instances of the per-instance
  median of ``--repeats`` runs (:mod:`nestflex.deploy.timing`). Target <= 1 ms (SPINN reports 11 ms
  for its scheduler on a Jetson CPU);
* **optimality gap**: ``(C_greedy - C_exact) / C_exact`` per instance (instances with
  ``C_exact = 0`` count as gap 0 if the greedy also reaches 0), median and p95. Target <= 2 %
  median;
* **cached vs full**: the ratio of the two decision times in the same run, and on a stream of
  events (one app replaced per event, 10 events) the fraction of cached decisions that equal the
  full greedy's.

Writes ``--out/summary.json`` and ``--out/scheduler.png``. Timings on a shared machine; the
machine is recorded.

Example:
    python benchmarks/engine/scheduler.py --out runs/bench_scheduler
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: the repository root, for benchmarks.*
from benchmarks._common import add_out_args, resolve_out, write_run  # noqa: E402

from nestflex._io import write_json  # noqa: E402
from nestflex._machine import machine  # noqa: E402
from nestflex.deploy.scheduler import AppProfile, get_scheduler  # noqa: E402
from nestflex.deploy.timing import median_s  # noqa: E402

SCHEMA_VERSION = 1
TARGET_DECISION_MS = 1.0
TARGET_MEDIAN_GAP = 0.02
SPINN_JETSON_MS = 11.0
GREEDY = ("greedy_total", "greedy_max", "greedy_total_jump")
CACHED = {"greedy_total": "cached_total", "greedy_max": "cached_max", "greedy_total_jump": "cached_total_jump"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_out_args(p, "summary.json, scheduler.png and run.json")
    p.add_argument("--instances", type=int, default=40)
    p.add_argument("--repeats", type=int, default=21)
    p.add_argument("--levels", type=int, default=5)
    p.add_argument("--unit", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    resolve_out(args, __file__)
    return args


def instance(rng: random.Random, n: int, M: int) -> tuple[list[AppProfile], float, float]:
    apps = []
    for i in range(n):
        acc = sorted(rng.uniform(0.5, 0.95) for _ in range(M))
        lat = sorted(rng.uniform(1, 20) for _ in range(M))
        mem = sorted(rng.uniform(1, 50) for _ in range(M))
        rows = [{"level": k, "accuracy": acc[k], "latency_ms": {"1": lat[k]}, "memory_mb": mem[k]} for k in range(M)]
        apps.append(AppProfile.from_levels(f"app{i}", rows, max_latency_ms=rng.uniform(10, 60)))
    lo = sum(a.levels[0].memory_mb for a in apps)
    hi = sum(a.levels[-1].memory_mb for a in apps)
    return apps, lo + rng.uniform(0, 1) * (hi - lo), rng.choice([0.01, 0.1, 0.5, 1.0])


def gap(greedy: float, exact: float) -> float:
    if exact > 0:
        return (greedy - exact) / exact
    return 0.0 if greedy <= 1e-12 else float("inf")


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rng = random.Random(args.seed)
    times: dict[str, list[float]] = {n: [] for n in (*GREEDY, *CACHED.values(), "exact_total", "exact_max")}
    gaps: dict[str, list[float]] = {n: [] for n in GREEDY}
    for i in range(args.instances):
        # timing instances: 6 apps x M levels (the target's size); gaps on 4-6 apps
        apps, budget, alpha = instance(rng, 6 if i % 2 == 0 else rng.randint(4, 6), args.levels)
        kw = dict(memory_mb=budget, alpha=alpha, unit=args.unit)
        exact = {o: get_scheduler(f"exact_{o}").schedule(apps, **kw) for o in ("total", "max")}
        for name in GREEDY:
            d = get_scheduler(name).schedule(apps, **kw)
            gaps[name].append(gap(d.value, exact[d.objective].value))
        if len(apps) != 6:
            continue
        for name in GREEDY:
            s = get_scheduler(name)
            times[name].append(median_s(lambda: s.schedule(apps, **kw), args.repeats))
            c = get_scheduler(CACHED[name])
            c.schedule(apps, **kw)  # fills the cache; the timed calls resume from it

            def cached_call() -> None:
                c.refresh_every = 10**9  # time the resumed path only
                c.schedule(apps, **kw)

            times[CACHED[name]].append(median_s(cached_call, args.repeats))
        for o in ("total", "max"):
            s = get_scheduler(f"exact_{o}")
            times[f"exact_{o}"].append(median_s(lambda: s.schedule(apps, **kw), 3))

    # cached vs full on a stream of events: one app replaced at a time, from a pool of 8
    pool_rng = random.Random(args.seed + 1)
    pool, budget, _ = instance(pool_rng, 8, args.levels)
    budget *= 6 / 8  # the pool's budget was drawn for 8 apps
    budget = max(budget, sum(sorted(a.levels[0].memory_mb for a in pool)[-6:]))
    agree = {}
    for name in GREEDY:
        c, f = get_scheduler(CACHED[name]), get_scheduler(name)
        running = list(range(6))
        same = []
        for _ in range(10):
            out = pool_rng.choice(running)
            idle = [i for i in range(8) if i not in running]
            running = sorted([i for i in running if i != out] + [pool_rng.choice(idle)])
            apps = [pool[i] for i in running]
            dc = c.schedule(apps, memory_mb=budget, alpha=0.1, unit=args.unit)
            df = f.schedule(apps, memory_mb=budget, alpha=0.1, unit=args.unit)
            same.append({"cached": c.last_used_cache, "same": dc.allocations == df.allocations,
                         "value_ratio": dc.value / df.value if df.value > 0 else 1.0})
        resumed = [s for s in same if s["cached"]]
        agree[name] = {
            "events": len(same), "resumed_from_cache": len(resumed),
            "same_decision_share": sum(s["same"] for s in resumed) / len(resumed) if resumed else None,
            "median_value_ratio_cached_over_full": statistics.median(s["value_ratio"] for s in resumed) if resumed else None,
        }

    decision_ms = {n: 1e3 * statistics.median(t) for n, t in times.items() if t}
    gap_stats = {
        n: {"median": statistics.median(g), "p95": pct(g, 0.95), "max": max(g), "instances": len(g),
            "zero_gap_share": sum(x <= 1e-12 for x in g) / len(g)}
        for n, g in gaps.items()
    }
    summary = {
        "schema_version": SCHEMA_VERSION,
        "benchmark": "scheduler",
        "synthetic": False,
        "instances": "random seeded problems (not measured profiles): see the module docstring",
        "settings": vars(args) | {"out": str(args.out)},
        "machine": machine(),
        "decision_ms_6x5": decision_ms,
        "cached_speedup": {n: decision_ms[n] / decision_ms[CACHED[n]] for n in GREEDY},
        "optimality_gap": gap_stats,
        "cached_on_events": agree,
        "targets": {
            "decision_ms": TARGET_DECISION_MS, "median_gap": TARGET_MEDIAN_GAP, "spinn_jetson_ms": SPINN_JETSON_MS,
            "decision_met": {n: decision_ms[n] <= TARGET_DECISION_MS for n in GREEDY},
            "gap_met": {n: gap_stats[n]["median"] <= TARGET_MEDIAN_GAP for n in GREEDY},
        },
    }
    args.out.mkdir(parents=True, exist_ok=True)
    summary["plot"] = plot(summary, args.out / "scheduler.png")
    write_json(args.out / "summary.json", summary)
    write_run(args.out, __file__, argv)
    for n in GREEDY:
        g = gap_stats[n]
        print(f"{n:18s} {decision_ms[n]:.3f} ms (cached {decision_ms[CACHED[n]]:.3f} ms)  gap median "
              f"{100 * g['median']:.2f} %  p95 {100 * g['p95']:.2f} %")
    print(f"exact: total {decision_ms['exact_total']:.1f} ms, max {decision_ms['exact_max']:.1f} ms")
    print(f"summary: {args.out / 'summary.json'}")
    return 0


def plot(summary: dict, path: Path) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from nestflex._io import atomic_write_bytes
    from io import BytesIO

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    names = list(GREEDY)
    full = [summary["decision_ms_6x5"][n] for n in names]
    cached = [summary["decision_ms_6x5"][CACHED[n]] for n in names]
    xs = range(len(names))
    ax1.bar([x - 0.2 for x in xs], full, 0.4, label="full greedy")
    ax1.bar([x + 0.2 for x in xs], cached, 0.4, label="cached (resumed at 70 %)")
    ax1.axhline(TARGET_DECISION_MS, ls="--", c="k", label="target 1 ms")
    ax1.set_xticks(list(xs), names, fontsize=8)
    ax1.set_ylabel("median decision time (ms), 6 apps x 5 levels, 1 % unit")
    ax1.legend(fontsize=8)
    med = [100 * summary["optimality_gap"][n]["median"] for n in names]
    p95 = [100 * summary["optimality_gap"][n]["p95"] for n in names]
    ax2.bar([x - 0.2 for x in xs], med, 0.4, label="median")
    ax2.bar([x + 0.2 for x in xs], p95, 0.4, label="p95")
    ax2.axhline(100 * TARGET_MEDIAN_GAP, ls="--", c="k", label="target 2 % (median)")
    ax2.set_xticks(list(xs), names, fontsize=8)
    ax2.set_ylabel("optimality gap vs exact (%)")
    ax2.legend(fontsize=8)
    fig.suptitle(f"NestDNN scheduler on random instances ({summary['machine']['cpu']}, shared)")
    fig.tight_layout()
    buf = BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())
    return path.name


if __name__ == "__main__":
    sys.exit(main())
