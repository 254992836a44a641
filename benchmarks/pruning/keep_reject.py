"""How often does a keep/reject rule get a pruning step wrong? Threshold vs paired, by simulation.

FilterPruning's accuracy-goal mode keeps a step when its retrained validation accuracy is at
least ``start - max_drop`` (``decision="threshold"``), or unless the one-sided upper confidence
bound of the paired difference (step - start, same images) is below ``-max_drop``
(``decision="paired"``, :func:`nestflex.pruning.paired_decision`). Both verdicts are read from
a finite split. This script simulates the per-sample correctness of a start and a step model on
``--n`` validation images and counts, over ``--reps`` seeded repetitions,

- false rejects: the step's *true* accuracy meets the goal (true drop <= ``max_drop``), rejected;
- false keeps: its true accuracy is below the goal (by 0.25, 0.5, 1 point), kept.

No saved per-sample predictions are committed, so the pairs are generated: each image is
drawn independently from the four (start right?, step right?) cells with the start accuracy,
the step's true drop and the share of images the two models disagree on fixed (the defaults
are the default recipe's seed on its 5,000-image split, docs/results/prune_noise/default: start
87.26%, 6.68% of the images discordant). A second scenario uses start 88% and 95% agreement.
Each verdict is one evaluation: recovery epochs and retries are not simulated.

    python benchmarks/pruning/keep_reject.py --out docs/results/keep_reject/default

Writes ``summary.json`` (rates per rule and true drop, and ``goals``) and ``run.json``.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: the repository root, for benchmarks.*
from benchmarks._common import add_out_args, resolve_out, write_run  # noqa: E402

from nestflex._io import write_json  # noqa: E402
from nestflex.pruning import decide_step, paired_decision  # noqa: E402

#: true drop minus the allowed drop, in points: <= 0 meets the goal, > 0 is below it
OFFSETS = (-1.0, -0.5, -0.25, 0.0, 0.25, 0.5, 1.0)
#: (name, start accuracy, share of images the two models disagree on)
SCENARIOS = (("prune_noise_default", 0.8726, 0.0668), ("start88_agree95", 0.88, 0.05))


def cells(acc_start: float, drop: float, disagree: float) -> np.ndarray:
    """Probabilities of the (start, step) correctness cells (1,1), (1,0), (0,1), (0,0) of one
    image, for a step ``drop`` below the start with ``disagree`` of the images discordant."""
    lost, won = (disagree + drop) / 2, (disagree - drop) / 2
    p = np.array([acc_start - lost, lost, won, 1.0 - acc_start - won])
    if (p < 0).any():
        raise ValueError(f"no joint distribution with start {acc_start}, drop {drop}, disagreement {disagree}")
    return p


def verdicts(rng: np.random.Generator, n: int, reps: int, p: np.ndarray, max_drop: float,
             confidence: float) -> dict[str, float]:
    """Reject rates of both rules over ``reps`` simulated splits of ``n`` images."""
    rejected = {"threshold": 0, "paired": 0}
    for counts in rng.multinomial(n, p, size=reps):
        # the rules see only per-image pairs; the order of images does not matter to either
        start = np.repeat([True, True, False, False], counts)
        step = np.repeat([True, False, True, False], counts)
        acc_start, acc_step = start.mean(), step.mean()
        goal = round(max(acc_start - max_drop, 0.0), 6)  # as FilterPruning sets it from the measured start
        rejected["threshold"] += decide_step(acc_step, goal, 1.0, 0, backoff=0).action != "keep"
        rejected["paired"] += paired_decision(start, step, max_drop, confidence).broken
    return {rule: k / reps for rule, k in rejected.items()}


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=5000, help="validation images")
    p.add_argument("--reps", type=int, default=20000, help="simulated splits per (scenario, true drop)")
    p.add_argument("--max-drop", type=float, default=0.01, help="the allowed drop (0.01: one point)")
    p.add_argument("--confidence", type=float, default=0.9, help="the paired rule's one-sided confidence")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--check-seeds", type=int, default=2,
                   help="more seeds that re-measure the paired rule's false rejects at the goal (the first scenario)")
    p.add_argument("--check-reps", type=int, default=60000, help="simulated splits per check seed")
    add_out_args(p, "summary.json and run.json")
    args = p.parse_args(argv)
    out = resolve_out(args, __file__)
    t0 = time.perf_counter()
    scenarios = {}
    for i, (name, acc_start, disagree) in enumerate(SCENARIOS):
        rows = []
        for j, offset in enumerate(OFFSETS):
            drop = args.max_drop + offset / 100
            rng = np.random.default_rng([args.seed, i, j])
            rates = verdicts(rng, args.n, args.reps, cells(acc_start, drop, disagree), args.max_drop, args.confidence)
            meets = offset <= 0
            rows.append({"offset_points": offset, "true_drop": round(drop, 6), "meets_goal": meets,
                         "reject_rate": rates,
                         # the error each rule makes at this drop: rejecting a step that meets the goal, or keeping one that does not
                         "error_rate": {r: v if meets else 1.0 - v for r, v in rates.items()}})
        scenarios[name] = {"start_accuracy": acc_start, "disagree": disagree, "rows": rows}
    main_rows = {r["offset_points"]: r for r in scenarios[SCENARIOS[0][0]]["rows"]}
    at_goal = main_rows[0.0]["error_rate"]["paired"]
    # binomial standard error of a rate measured over `reps` splits
    rate_se = math.sqrt(at_goal * (1 - at_goal) / args.reps)
    name, acc_start, disagree = SCENARIOS[0]
    checks = {str(args.seed + k): round(verdicts(np.random.default_rng([args.seed + k, 0, OFFSETS.index(0.0)]),
                                                 args.n, args.check_reps, cells(acc_start, args.max_drop, disagree),
                                                 args.max_drop, args.confidence)["paired"], 4)
              for k in range(1, args.check_seeds + 1)}
    goals = {
        "false_reject_at_goal": {
            "target": f"<= {1 - args.confidence:.2f} (paired rule, true drop exactly at the goal)",
            "measured": round(at_goal, 4), "met": at_goal <= round(1 - args.confidence, 10)},
        "paired_false_reject_below_threshold_rule": {
            "target": "paired false-reject rate at the goal < the threshold rule's",
            "measured": {r: round(v, 4) for r, v in main_rows[0.0]["error_rate"].items()},
            "met": at_goal < main_rows[0.0]["error_rate"]["threshold"]},
    }
    summary = {
        "question": "How often does each keep/reject rule get a step wrong, near the goal?",
        "n": args.n, "reps": args.reps, "max_drop": args.max_drop, "confidence": args.confidence, "seed": args.seed,
        "rate_se_at_goal": round(rate_se, 4),
        # the same point re-measured under other seeds with --check-reps splits: where the rate really sits
        "paired_false_reject_at_goal_check": {"reps": args.check_reps, "by_seed": checks},
        "false_reject": {r: {str(o): round(main_rows[o]["error_rate"][r], 4) for o in OFFSETS if o <= 0}
                         for r in ("threshold", "paired")},
        "false_keep": {r: {str(o): round(main_rows[o]["error_rate"][r], 4) for o in OFFSETS if o > 0}
                       for r in ("threshold", "paired")},
        "scenarios": scenarios, "goals": goals,
        "note": "per-image pairs drawn iid from the four correctness cells at the stated start accuracy, "
                "true drop and disagreement; one evaluation per verdict (no recovery epochs or retries); "
                "offsets are the true drop minus the allowed drop, in points",
        "seconds": round(time.perf_counter() - t0, 1),
    }
    write_json(out / "summary.json", summary)
    write_run(out, __file__, argv)
    print(f"false reject at the goal: threshold {main_rows[0.0]['error_rate']['threshold']:.3f}, paired "
          f"{at_goal:.3f} (se {rate_se:.3f}); false keep 0.5 / 1 point below: threshold "
          f"{main_rows[0.5]['error_rate']['threshold']:.3f} / {main_rows[1.0]['error_rate']['threshold']:.3f}, paired "
          f"{main_rows[0.5]['error_rate']['paired']:.3f} / {main_rows[1.0]['error_rate']['paired']:.3f}; "
          f"{summary['seconds']} s -> {out}")
    return summary


if __name__ == "__main__":
    main()
