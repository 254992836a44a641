"""The default recipe planned in measured time against MACs (issue 38 item 3), over seeds.

For each seed the recipe runs twice with the same accuracy goal (``--prune-max-drop``, the
recipe's default unless given after ``--``): ``--prune-cost macs`` (NestDNN's allocation, the
default) and ``--prune-cost latency`` (a per-layer onnxruntime table measured by the prune stage:
steps by time saved per accuracy risked, the measured fast widths, levels spaced in time). Both
runs share the seed's baseline (trained once, copied). Stages ``baseline,prune,grow,export``; then
each bundle is tuned here with the synthesized plan's onnxruntime backend at 1 thread, batch 1
(:func:`nestflex.deploy.tune.synthesize`), and every level of the seed's two runs is then timed
in that plan, the two runs' levels in alternation (a slow minute of the machine hits both alike).

Reported per seed and run: the seed model's time (the plan's level 0) and test accuracy, every
level's time and accuracy, whether every level is strictly faster than the next larger one, the
table's build time. ``summary.json`` is written after every seed (``complete`` false until the
last, and while fewer than the 3 seeds the acceptance asks for ran: a run of hours stopped
part-way keeps its finished seeds); its ``goals`` are issue 38's:
the latency-driven seed >= 1.2x faster than the MACs-driven one at a test accuracy within 0.5
points (medians over seeds), every level strictly ordered in time, the table built in <= 2 minutes.

With ``--jobs N`` the seeds' recipes run N at a time (each with cores/N torch threads), in two
rounds: every seed's MACs-driven run, then every seed's latency-driven run. Between the rounds the
latency table is measured once, with nothing else running, on the first seed's baseline (the
layers' shapes are the same for every seed; the weights do not enter it), and the latency-driven
runs plan with it (``--latency-table``): a table measured while other recipes train would price
widths by the load of the moment. The levels are timed once every recipe has finished, seed by
seed, with nothing else running. Only ``--jobs 1`` measures a table per seed in its prune stage.

    python benchmarks/recipe/latency_roadmap.py --run-name mine            # 3 seeds, ~2.5-3 h on 2 cores
    python benchmarks/recipe/latency_roadmap.py --run-name mine --jobs 3   # the same, seeds side by side
    python benchmarks/recipe/latency_roadmap.py --seeds 0 --out /tmp/lr -- --epochs 1 --prune-max-steps 2
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
from pathlib import Path
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: the repository root, for benchmarks.*
from benchmarks._common import add_out_args, machine, resolve_out, write_run  # noqa: E402
from benchmarks.recipe.recipe_seeds import run_seed  # noqa: E402
from nestflex._io import read_json, write_json  # noqa: E402

STAGES = "baseline,prune,grow,export"
COSTS = ("macs", "latency")
#: issue 38's acceptance on the default recipe
SPEEDUP, ACCURACY_POINTS, TABLE_SECONDS = 1.2, 0.5, 120.0
#: seeds the acceptance asks for: a summary over fewer says so (``complete`` false)
SEEDS_WANTED = 3


def time_bundles(bundles: dict[str, Path], repeats: int) -> dict[str, dict[str, list[float]]]:
    """Per run, each level's batch-1 time in the plan ``synthesize`` makes with onnxruntime at 1
    thread (``plan_ms``, each bundle tuned on its own), and the same levels of both runs timed again
    in alternation (``level_ms``, what the goals use): the tuner times one bundle after the other,
    and on this machine the same full-width graph took 0.364 ms in one tune and 0.422 ms in the
    next, more than the difference being measured."""
    from nestflex.deploy import CapacityRuntime, load
    from nestflex.deploy.timing import alternating_median_ms
    from nestflex.deploy.tune import synthesize

    out: dict[str, dict[str, list[float]]] = {}
    fns = {}
    for k, p in bundles.items():
        bundle = load(p)
        plan = synthesize(bundle, backends=["onnxruntime"], threads=[1], repeats=repeats)
        out[k] = {"plan_ms": [lp.latency_ms for lp in plan.levels]}
        x = np.zeros((1, *bundle.spec.input.shape), dtype=np.float32)
        for level in range(len(plan.levels)):
            rt = CapacityRuntime(bundle, level, plan=plan, keep="active")
            fns[(k, level)] = lambda rt=rt, x=x: rt(x)
    ms = alternating_median_ms(fns, repeats, warmup=3, min_ms=1.0)
    for k in bundles:
        out[k]["level_ms"] = [round(ms[(k, level)], 4) for level in range(len(out[k]["plan_ms"]))]
    return out


def run_recipe(seed: int, cost: str, root: Path, extra: list[str], threads: int | None = None,
               table: Path | None = None) -> dict[str, Any]:
    """One seed's recipe with one cost (reused where it already ran); the figures its row keeps."""
    out = root / f"seed{seed}" / cost
    base = root / f"seed{seed}" / COSTS[0] / "baseline"
    if cost != COSTS[0] and base.is_dir() and not (out / "baseline").exists():
        shutil.copytree(base, out / "baseline")  # the same baseline: its stage config matches, it is reused
    shared = table is not None and cost != "macs" and flag_value(extra, "--latency-table") is None
    flags = ["--prune-cost", cost, *(["--latency-table", str(table)] if shared else []), *extra]
    ran = run_seed(seed, out, STAGES, flags, threads=threads)
    s = ran["summary"]
    levels = s["grow"]["levels"]
    kept = out / "prune" / "latency_table.json"  # the table the prune stage planned with (a copy of --latency-table)
    return {"seconds": ran["seconds"], "seed_accuracy": s["pruning"]["accuracy"],
            "seed_macs": s["pruning"]["macs"], "baseline_accuracy": s["baseline"]["accuracy"],
            "level_accuracy": [r.get("accuracy") for r in levels], "level_macs": [r.get("macs") for r in levels],
            "steps": s["grow"]["steps"], "bundle": str(out / "bundle.nfx"),
            "table_seconds": read_json(kept)["meta"]["seconds"] if kept.is_file() else None}


def flag_value(extra: list[str], flag: str) -> str | None:
    """The value a recipe flag after ``--`` gives (``--flag V`` or ``--flag=V``; the last one wins), else ``None``."""
    value = None
    for i, x in enumerate(extra):
        if x == flag and i + 1 < len(extra):
            value = extra[i + 1]
        elif x.startswith(flag + "="):
            value = x.split("=", 1)[1]
    return value


def shared_table(root: Path, seed: int, extra: list[str]) -> Path:
    """The latency table the latency-driven runs of a ``--jobs`` sweep share: ``--latency-table`` when
    given after ``--``, else measured here (nothing else running) on ``seed``'s baseline at the
    recipe's ``--latency-threads``. Kept in ``root``, it is reused by a resumed sweep when it holds
    every layer of that baseline at those threads, and measured again otherwise (another model or
    width in the same ``--runs``)."""
    given = flag_value(extra, "--latency-table")
    if given is not None:
        return Path(given)
    import torch

    from nestflex.profiling import LatencyTable
    from nestflex.pruning import build_latency_table, latency_specs
    from nestflex.training import ImageClassifier

    threads = int(flag_value(extra, "--latency-threads") or 1)
    net = ImageClassifier.load_from_checkpoint(root / f"seed{seed}" / COSTS[0] / "baseline" / "model.ckpt",
                                               map_location="cpu", weights_only=True).model
    path = root / "latency_table.json"
    if path.is_file():
        table = LatencyTable.load(path)
        with torch.no_grad():
            keys = {spec.key for spec in latency_specs(net, net.input_shape)}
        if table.threads == threads and keys <= set(table.entries):
            return path
    table = build_latency_table(net, net.input_shape, threads=threads)
    table.save(path)
    print(f"latency table: {len(table.entries)} layer shapes in {table.meta['seconds']} s: {path}", flush=True)
    return path


def run_recipes(seeds: list[int], root: Path, extra: list[str], jobs: int) -> dict[int, dict[str, Any]]:
    """Every seed's two recipe runs: one after the other (``jobs`` 1), or ``jobs`` seeds at a time in
    two rounds with the shared table measured between them (see the module's docstring)."""
    if jobs <= 1:
        return {seed: {cost: run_recipe(seed, cost, root, extra) for cost in COSTS} for seed in seeds}
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    threads = max(1, cores // jobs)
    rows: dict[int, dict[str, Any]] = {seed: {} for seed in seeds}
    with ThreadPoolExecutor(jobs) as pool:  # threads wait on the recipe subprocesses
        for seed, row in zip(seeds, pool.map(lambda s: run_recipe(s, COSTS[0], root, extra, threads), seeds)):
            rows[seed][COSTS[0]] = row
        table = shared_table(root, seeds[0], extra)
        for seed, row in zip(seeds, pool.map(lambda s: run_recipe(s, COSTS[1], root, extra, threads, table), seeds)):
            rows[seed][COSTS[1]] = row
    return rows


def time_pair(seed: int, rows: dict[str, Any], repeats: int) -> dict[str, Any]:
    """Time both runs' levels of one seed (nothing else running) and compare their seeds."""
    rows = {cost: dict(rows[cost]) for cost in COSTS}
    times = time_bundles({c: Path(rows[c]["bundle"]) for c in COSTS}, repeats)
    for cost in COSTS:
        ms = times[cost]["level_ms"]
        rows[cost] |= {"level_ms": ms, "plan_ms": times[cost]["plan_ms"], "seed_ms": ms[0],
                       "ordered": all(a < b for a, b in zip(ms, ms[1:]))}
    return {"seed": seed, **rows, "seed_speedup": round(rows["macs"]["seed_ms"] / rows["latency"]["seed_ms"], 3),
            "accuracy_difference_points": round(100 * (rows["latency"]["seed_accuracy"]
                                                       - rows["macs"]["seed_accuracy"]), 2)}


def goals(rows: list[dict[str, Any]]) -> dict[str, Any]:
    speedup = round(statistics.median(r["seed_speedup"] for r in rows), 3)
    accuracy = round(statistics.median(r["accuracy_difference_points"] for r in rows), 2)
    tables = [r["latency"]["table_seconds"] for r in rows if r["latency"]["table_seconds"] is not None]
    return {
        "seed_speedup": {"target": f"latency-driven seed >= {SPEEDUP}x faster than the MACs-driven one in the "
                                   f"synthesized plan (median over seeds)",
                         "measured": speedup, "met": speedup >= SPEEDUP},
        "seed_accuracy": {"target": f"latency-driven seed's test accuracy within {ACCURACY_POINTS} points of the "
                                    f"MACs-driven one (median over seeds)",
                          "measured": accuracy, "met": accuracy >= -ACCURACY_POINTS},
        "levels_ordered": {"target": "every latency-driven level strictly faster than the next larger one",
                           "measured": {r["seed"]: r["latency"]["level_ms"] for r in rows},
                           "met": all(r["latency"]["ordered"] for r in rows)},
        "latency_table_seconds": {"target": f"the table built in <= {TABLE_SECONDS:g} s",
                                  "measured": max(tables) if tables else None,
                                  "met": bool(tables) and max(tables) <= TABLE_SECONDS},
    }


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", default="0,1,2", help="comma list of recipe seeds")
    p.add_argument("--repeats", type=int, default=30, help="timed calls per level when tuning (median)")
    p.add_argument("--jobs", type=int, default=1, help="seeds whose recipes run at once (each with cores/jobs "
                   "threads; levels are timed after all of them, alone)")
    p.add_argument("--runs", type=Path, default=None, help="where the recipe runs go (default: runs/latency_roadmap)")
    add_out_args(p)
    args = p.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    out = resolve_out(args, __file__)
    runs = args.runs or Path("runs") / "latency_roadmap"
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    for flag in ("--prune-cost", "--stages"):
        if any(x == flag or x.startswith(flag + "=") for x in extra):
            p.error(f"the recipe flags after -- set {flag}, which the sweep sets itself (both costs, stages "
                    f"{STAGES}). HINT: leave {flag} out")
    rows: list[dict[str, Any]] = []
    # --jobs 1: each seed is timed as soon as its runs finish; --jobs N: all recipes first (they share the CPU)
    ran = run_recipes(seeds, runs, extra, args.jobs) if args.jobs > 1 else {}
    for seed in seeds:
        rows.append(time_pair(seed, ran[seed] if seed in ran else run_recipes([seed], runs, extra, 1)[seed],
                              args.repeats))
        # after every seed: a run of hours stopped part-way keeps what it measured (run again, the
        # finished recipe stages are reused and only the timing is redone)
        summary = {"machine": machine(), "seeds": [r["seed"] for r in rows], "seeds_asked": seeds,
                   "seeds_wanted": SEEDS_WANTED, "complete": len(rows) == len(seeds) and len(rows) >= SEEDS_WANTED,
                   "jobs": args.jobs, "recipe_flags": extra, "rows": rows, "goals": goals(rows)}
        write_json(out / "summary.json", summary)
        write_run(out, __file__, argv)
    for gid, g in summary["goals"].items():
        print(f"goal {gid}: {'met' if g['met'] else 'NOT met'} ({g['measured']})")
    print(f"summary: {out / 'summary.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
