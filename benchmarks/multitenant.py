"""Multi-tenant simulation (NestDNN §4.3) on real multi-capacity profiles of two or more models.

Runs :func:`nestflex.deploy.simulation.simulate` (protocol, knee and energy model: see that
module and docs/scheduler.md) on the given bundles (``--bundles``, through
``nestflex.deploy.load``) and/or profile files (``--profiles``; with neither, every
``runs/*/grow/profile.json`` and ``runs/*/recipe_run/grow/profile.json``), twice:

* ``measured``: the profiled CPU latencies (batch 1);
* ``macs``: latency proportional to MACs (a compute-bound device; tiny models at batch 1 on a
  desktop CPU are overhead-bound and their measured latency barely changes with the level).

and compares with the paper's three points (+4.2 % accuracy, 2.0x frame rate, 1.7x less energy).
App names are ``<model>-w<width>``, read from a bundle's ``manifest["model"]`` or the run's
``grow/config.json`` when present.

Writes ``--out/summary.json`` (``"synthetic"`` true when a profile was measured on the synthetic
dataset) and ``--out/<latency_model>.png``.

Example:
    python benchmarks/multitenant.py --out runs/bench_multitenant
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from nestflex._io import write_json
from nestflex._machine import machine
from nestflex.deploy.scheduler import AppProfile
from nestflex.deploy.simulation import PAPER, SimulationConfig, _synthetic_flag, plot, simulate

SCHEMA_VERSION = 1


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--profiles", nargs="+", type=Path, default=None)
    p.add_argument("--bundles", nargs="+", type=Path, default=[])
    p.add_argument("--runs", type=int, default=100)
    p.add_argument("--seconds", type=int, default=60)
    p.add_argument("--scheduler", default="greedy", choices=["greedy", "cached", "exact"])
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def discover() -> list[Path]:
    found = sorted(Path("runs").glob("*/grow/profile.json")) + sorted(Path("runs").glob("*/recipe_run/grow/profile.json"))
    return found


def app_name(path: Path) -> str:
    """``<model>-w<width>`` from the run's grow/config.json, else the run directory's name."""
    try:
        cfg = json.loads((path.parent / "config.json").read_text())
        base = cfg["prune"]["baseline"]
        return f"{base['model']}-w{base['width']:g}"
    except (OSError, ValueError, KeyError, TypeError):
        return path.parent.parent.name


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # discover local runs only when nothing was named: given bundles are the whole pool
    paths = args.profiles if args.profiles is not None else ([] if args.bundles else discover())
    apps = [AppProfile.from_bundle(b) for b in args.bundles]
    apps += [AppProfile.from_json(p, name=app_name(p)) for p in paths]
    names = [a.name for a in apps]
    if len(set(names)) != len(names):
        apps = [a.renamed(f"{a.name}-{i}") for i, a in enumerate(apps)]
    if len(apps) < 2:
        print(f"warning: only {len(apps)} profile(s) found; the benchmark is meant for >= 2 models", file=sys.stderr)
    synthetic = [_synthetic_flag(p) for p in [*args.bundles, *paths]]
    results = {}
    args.out.mkdir(parents=True, exist_ok=True)
    for model in ("measured", "macs"):
        cfg = SimulationConfig(runs=args.runs, seconds=args.seconds, scheduler=args.scheduler, seed=args.seed,
                               latency_model=model)
        s = simulate(apps, cfg)
        s["synthetic"] = any(x is True for x in synthetic)
        plot(s, args.out / f"{model}.png")
        results[model] = s
        for objective, c in s["comparison"].items():
            k = c["knee"]
            print(f"[{model}] {objective}: knee alpha={k['alpha']:g} accuracy {k['accuracy_gain_pct']:+.2f} pts "
                  f"fps x{k['frame_rate_speedup']:.3f} energy /{k['energy_reduction']:.3f}; best gain at >= baseline "
                  f"fps {c['accuracy_gain_pct_at_baseline_frame_rate']}; best fps at >= baseline accuracy "
                  f"{c['frame_rate_speedup_at_baseline_accuracy']}; max energy /{c['max_energy_reduction']:.3f}")
    summary = {
        "schema_version": SCHEMA_VERSION,
        "benchmark": "multitenant",
        "synthetic": any(x is True for x in synthetic),
        "sources": [{"path": str(p), "name": a.name, "synthetic": syn}
                    for p, a, syn in zip([*map(str, args.bundles), *map(str, paths)], apps, synthetic)],
        "machine": machine(),
        "paper": PAPER,
        "results": results,
        "plots": {m: f"{m}.png" for m in results},
    }
    write_json(args.out / "summary.json", summary)
    print(f"summary: {args.out / 'summary.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
