"""Multi-tenant simulation (NestDNN §4.3) on real multi-capacity profiles of two or more models.

Runs :func:`_simulation.simulate` (``benchmarks/engine/_simulation.py``: protocol, knee and energy
model; see that module and docs/scheduler.md) on the given bundles (``--bundles``, through
``nestflex.deploy.load``) and/or profile files (``--profiles``; with neither, every
``runs/*/grow/profile.json`` and ``runs/*/recipe_run/grow/profile.json``), once per latency
model (``--latency-model``, both by default):

* ``measured``: the profiled CPU latencies (batch 1);
* ``macs``: latency proportional to MACs (a compute-bound device; tiny models at batch 1 on a
  desktop CPU are overhead-bound and their measured latency barely changes with the level).

and compares with the paper's three points (+4.2 % accuracy, 2.0x frame rate, 1.7x less energy).
App names are ``<model>-w<width>``, read from a bundle's ``manifest["model"]`` or the run's
``grow/config.json`` when present (``--names`` overrides them). The other options set the
simulation (:class:`_simulation.SimulationConfig`); their defaults are the paper's protocol.

Writes ``--out/summary.json`` (``"synthetic"`` true when a profile was measured on the synthetic
dataset) and ``--out/<latency_model>.png``. Bad input prints one ``error:`` line and exits 2.

Example:
    python benchmarks/engine/multitenant.py --out runs/bench_multitenant
    python benchmarks/engine/multitenant.py --bundles a.nfx b.nfx --latency-model macs --scheduler cached --out runs/sim
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: the repository root, for benchmarks.*
from benchmarks._common import add_out_args, resolve_out, write_run  # noqa: E402
from benchmarks.engine._simulation import (  # noqa: E402
    DEFAULT_ALPHAS,
    PAPER,
    SimulationConfig,
    SimulationError,
    plot,
    simulate,
    synthetic_flag,
)

from nestflex._io import write_json  # noqa: E402
from nestflex._machine import machine  # noqa: E402
from nestflex.deploy.scheduler import OBJECTIVES, AppProfile  # noqa: E402
from nestflex.errors import NestflexError  # noqa: E402

LATENCY_MODELS = ("measured", "macs")

SCHEMA_VERSION = 1


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_out_args(p, "summary.json, run.json and <latency model>.png")
    p.add_argument("--profiles", nargs="+", type=Path, default=None, metavar="JSON",
                   help="grow/profile.json or recipe summary.json files with a \"levels\" list")
    p.add_argument("--bundles", nargs="+", type=Path, default=[], metavar="PATH", help="bundles (nestflex.deploy.load)")
    p.add_argument("--names", nargs="+", default=None, help="app names, one per bundle/profile (bundles first)")
    p.add_argument("--runs", type=int, default=100)
    p.add_argument("--seconds", type=int, default=60)
    p.add_argument("--scheduler", default="greedy", choices=["greedy", "cached", "exact", "greedy_jump"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--latency-model", nargs="+", default=list(LATENCY_MODELS), choices=list(LATENCY_MODELS),
                   help="measured latencies and/or latency proportional to MACs (a compute-bound device)")
    p.add_argument("--alpha", type=float, nargs="+", default=list(DEFAULT_ALPHAS), help="alpha values to sweep")
    p.add_argument("--objectives", nargs="+", default=list(OBJECTIVES), choices=list(OBJECTIVES))
    p.add_argument("--memory-budget-mb", type=float, default=None,
                   help="memory budget; default 0.75 x the pool's largest levels summed")
    p.add_argument("--goal-factor", type=float, default=3.0, help="L_max = goal factor x knee latency")
    p.add_argument("--batch-size", type=int, default=1, help="profiled latency to use")
    p.add_argument("--unit", type=float, default=0.01, help="scheduler compute unit")
    p.add_argument("--idle-power-w", type=float, default=0.0)
    args = p.parse_args(argv)
    resolve_out(args, __file__)
    return args


def discover() -> list[Path]:
    found = sorted(Path("runs").glob("*/grow/profile.json")) + sorted(Path("runs").glob("*/recipe_run/grow/profile.json"))
    return found


def app_name(path: Path) -> str | None:
    """``<model>-w<width>`` from the run's grow/config.json; ``None`` (the profile's own default:
    the run directory's name) without one."""
    try:
        cfg = json.loads((path.parent / "config.json").read_text())
        base = cfg["prune"]["baseline"]
        return f"{base['model']}-w{base['width']:g}"
    except (OSError, ValueError, KeyError, TypeError):
        return None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        run(args)
    except NestflexError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    write_run(args.out, __file__, argv)
    print(f"summary: {args.out / 'summary.json'}")
    return 0


def run(args: argparse.Namespace) -> dict:
    """Load the apps, simulate once per latency model, write the plots and ``summary.json``."""
    # discover local runs only when nothing was named: given bundles are the whole pool
    paths = args.profiles if args.profiles is not None else ([] if args.bundles else discover())
    sources = [*args.bundles, *paths]
    if args.names is not None and len(args.names) != len(sources):
        raise SimulationError(
            f"`--names` has {len(args.names)} names for {len(sources)} bundles/profiles. HINT: one name each."
        )
    names = args.names or [None] * len(sources)
    apps = [AppProfile.from_bundle(b, name=n, batch_size=args.batch_size) for b, n in zip(args.bundles, names)]
    apps += [AppProfile.from_json(p, name=n or app_name(p), batch_size=args.batch_size)
             for p, n in zip(paths, names[len(args.bundles):])]
    if len({a.name for a in apps}) != len(apps):
        apps = [a.renamed(f"{a.name}-{i}") for i, a in enumerate(apps)]
    if len(apps) < 2:
        print(f"warning: only {len(apps)} profile(s) found; the benchmark is meant for >= 2 models", file=sys.stderr)
    synthetic = [synthetic_flag(Path(p)) for p in sources]
    results = {}
    for model in args.latency_model:
        cfg = SimulationConfig(
            runs=args.runs, seconds=args.seconds, scheduler=args.scheduler, seed=args.seed, latency_model=model,
            alphas=tuple(args.alpha), objectives=tuple(args.objectives), memory_mb=args.memory_budget_mb,
            goal_factor=args.goal_factor, batch_size=args.batch_size, unit=args.unit, idle_power_w=args.idle_power_w,
        )
        s = simulate(apps, cfg)
        s["synthetic"] = any(x is True for x in synthetic)
        results[model] = s
    args.out.mkdir(parents=True, exist_ok=True)
    for model, s in results.items():
        plot(s, args.out / f"{model}.png")
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
                    for p, a, syn in zip(map(str, sources), apps, synthetic)],
        "machine": machine(),
        "paper": PAPER,
        "results": results,
        "plots": {m: f"{m}.png" for m in results},
    }
    write_json(args.out / "summary.json", summary)
    return summary


if __name__ == "__main__":
    sys.exit(main())
