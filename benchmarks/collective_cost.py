#!/usr/bin/env python
"""What collective ranking costs for one layer of 64 and of 256 filters, vs the naive algorithm.

The naive algorithm (FlexDNN as written) fine-tunes one exit per candidate per step:
``N + (N - 1) + ... + 2`` exit fits per layer. Its cost is *estimated* as that count times the
median time of one exit fit of the same kind at full width (a closed-form ridge solve: the
cheapest possible fine-tune; an SGD fine-tune would cost more). The closed-form ranking is
timed directly. Features are synthetic pooled responses (cost does not depend on their values).

    python benchmarks/collective_cost.py --out runs/bench_collective_cost
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import median_seconds  # noqa: E402

from nestflex._io import write_json  # noqa: E402
from nestflex._machine import machine  # noqa: E402
from nestflex.pruning import collective_ranking  # noqa: E402
from nestflex.pruning.collective import _RidgePath  # noqa: E402


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", default="runs/bench_collective_cost")
    p.add_argument("--fit", type=int, default=1000, help="fit samples")
    p.add_argument("--val", type=int, default=1000, help="validation samples")
    p.add_argument("--pool", type=int, default=2, help="pooled values per filter = pool^2")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    d = args.pool**2
    rows = []
    for n in (64, 256):
        g = torch.Generator().manual_seed(n)
        fx, fy = torch.randn(args.fit, n, d, generator=g, dtype=torch.float64), torch.randint(0, 10, (args.fit,), generator=g)
        vx, vy = torch.randn(args.val, n, d, generator=g, dtype=torch.float64), torch.randint(0, 10, (args.val,), generator=g)
        t_rank = median_seconds(lambda: collective_ranking(fx, fy, vx, vy, stop_fraction=0.0), args.repeats)
        t_fit = median_seconds(lambda: _RidgePath(fx, fy, vx, vy, 10, 1e-3).accuracy(), args.repeats)
        fits = sum(range(2, n + 1))
        rows.append({"filters": n, "features": n * d, "ranking_seconds": round(t_rank, 4),
                     "one_exit_fit_seconds": round(t_fit, 5), "naive_fits": fits,
                     "naive_estimate_seconds": round(fits * t_fit, 2),
                     "speedup_vs_naive_estimate": round(fits * t_fit / t_rank, 1)})
        print(rows[-1])
    summary = {"samples": {"fit": args.fit, "val": args.val}, "pool": args.pool, "layers": rows,
               "note": "naive = fits x one closed-form exit fit at full width (a lower bound for SGD fine-tuning)",
               "machine": machine(), "repeats": args.repeats}
    out = Path(args.out)
    write_json(out / "summary.json", summary)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5))
    xs = range(len(rows))
    ax.bar([x - 0.2 for x in xs], [r["ranking_seconds"] for r in rows], 0.4, label="collective (closed form)")
    ax.bar([x + 0.2 for x in xs], [r["naive_estimate_seconds"] for r in rows], 0.4, label="naive estimate")
    ax.set_xticks(list(xs), [f"{r['filters']} filters" for r in rows])
    ax.set_yscale("log")
    ax.set_ylabel("seconds per layer")
    ax.set_title("collective ranking cost (synthetic features)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "collective_cost.png", dpi=120)
    return summary


if __name__ == "__main__":
    main()
