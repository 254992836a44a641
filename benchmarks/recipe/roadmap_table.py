"""Condense the pruning roadmaps of one or more seed sweeps, finished or cut off, into one table.

``recipe_seeds.py`` summarises runs that finished; a sweep stopped at a deadline (a lent
accelerator's time, say) leaves each run's ``prune/roadmap.json``, which the pruning callback
rewrites after every step. This reads those, per sweep and seed: the stopping status (``running``
when the run was cut off), the start and goal accuracy on the validation split, every kept step's
MACs fraction and validation accuracy, the number of rejected tries, and, for a run that finished,
its test figures from ``summary.json``.

    python benchmarks/recipe/roadmap_table.py --sweep steps12=/tmp/A --sweep steps10_x0.3=/tmp/C \\
        --note "H200, 15 runs at once, cut off at 490 s" --out docs/results/roadmap_table/prune_rule_h200
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from nestflex._io import read_json, write_json

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: the repository root, for benchmarks.*
from benchmarks._common import add_out_args, resolve_out, write_run  # noqa: E402


def run_row(run: Path) -> dict[str, Any] | None:
    """One run's roadmap (None if it never reached the prune stage)."""
    path = run / "prune" / "roadmap.json"
    if not path.exists():
        return None
    r = read_json(path)
    base = r["footprints"][0]["macs"]
    row: dict[str, Any] = {
        "status": r["status"], "start_val_accuracy": r["start_accuracy"], "goal_val_accuracy": r["goal"],
        "kept": [{"step": f["step"], "macs_fraction": round(f["macs"] / base, 4), "val_accuracy": f["accuracy"]}
                 for f in r["footprints"][1:]],
        "rejected_tries": len(r["rejected"]), "finetune": r.get("finetune"),
    }
    summary = run / "summary.json"
    if summary.exists() and r["status"] != "running":
        s = read_json(summary)
        p = s.get("pruning") or {}
        if p and s.get("baseline"):
            row.update(seed_macs_fraction=p["macs_fraction"], seed_test_accuracy=p["accuracy"],
                       baseline_test_accuracy=s["baseline"]["accuracy"],
                       seed_drop_points=round(100 * (s["baseline"]["accuracy"] - p["accuracy"]), 2))
    return row


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sweep", action="append", required=True, metavar="NAME=RUNS",
                   help="a sweep's runs folder (RUNS/seed_<n>/...) under a name; repeat for several")
    p.add_argument("--note", default="", help="how the sweeps were run (machine, flags, deadline)")
    add_out_args(p, "summary.json and run.json")
    a = p.parse_args(argv)
    resolve_out(a, __file__)
    sweeps: dict[str, Any] = {}
    for spec in a.sweep:
        name, sep, folder = spec.partition("=")
        if not sep or not name or not Path(folder).is_dir():
            p.error(f"--sweep is NAME=FOLDER with an existing folder, got {spec!r}")
        runs = sorted(Path(folder).glob("seed_*"), key=lambda d: int(d.name.split("_")[-1]))
        sweeps[name] = {d.name: row for d in runs if (row := run_row(d)) is not None}
    summary = {"benchmark": "roadmap_table", "note": a.note, "sweeps": sweeps}
    a.out.mkdir(parents=True, exist_ok=True)
    write_json(a.out / "summary.json", summary)
    write_run(a.out, __file__, argv)
    for name, runs in sweeps.items():
        for seed, r in runs.items():
            last = r["kept"][-1] if r["kept"] else {"step": 0, "macs_fraction": 1.0}
            print(f"{name:14s} {seed:7s} {r['status']:12s} step {last['step']:2d} {last['macs_fraction']:.2f} of the "
                  f"MACs, {r['rejected_tries']} rejected" + (f", test drop {r['seed_drop_points']}" if
                                                             "seed_drop_points" in r else ""))
    return summary


if __name__ == "__main__":
    main()
