#!/usr/bin/env python
"""What collective ranking costs for one layer of 64 and of 256 filters, vs the naive algorithm.

The naive algorithm (FlexDNN as written) fits one exit per candidate per step: at the step with
``m`` filters alive it fits ``m`` exits of ``m - 1`` filters each, ``N + (N - 1) + ... + 2`` fits
per layer. Its cost is *estimated* as the sum over steps of ``m`` times the median time of one
exit fit at that width, each fit being the cheapest possible fine-tune: standardise, solve the
ridge normal equations, score on validation (no inverse, no downdate bookkeeping; an SGD
fine-tune would cost more). Fit times are measured at a few widths and interpolated linearly in
between. The closed-form ranking is timed directly, alternating with the fits so that a change in
machine load hits both alike. Features are synthetic pooled responses (cost does not depend on
their values). Run with one torch thread (``OMP_NUM_THREADS=1``) for the figures in the docs.

    OMP_NUM_THREADS=1 python benchmarks/exits/collective_cost.py --out runs/bench_collective_cost
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from nestflex._io import write_json
from nestflex._machine import machine
from nestflex.deploy.timing import alternating_median_s
from nestflex.pruning import collective_ranking

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: the repository root, for benchmarks.*
from benchmarks._common import add_out_args, resolve_out, write_run  # noqa: E402


def one_exit_fit(fx, fy, vx, vy, num_classes: int = 10, ridge: float = 1e-3) -> float:
    """One exit fitted from scratch, as the naive algorithm fits each candidate: validation accuracy."""
    n = fx.shape[0]
    mean, std = fx.mean(0, keepdim=True), fx.std(0, keepdim=True, unbiased=False).clamp_min(1e-6)
    x = torch.cat([((fx - mean) / std).reshape(n, -1), torch.ones(n, 1, dtype=fx.dtype)], 1)
    xv = torch.cat([((vx - mean) / std).reshape(vx.shape[0], -1), torch.ones(vx.shape[0], 1, dtype=fx.dtype)], 1)
    a = x.T @ x + ridge * n * torch.eye(x.shape[1], dtype=fx.dtype)
    w = torch.linalg.solve(a, x.T @ torch.nn.functional.one_hot(fy, num_classes).to(fx.dtype))
    return float(((xv @ w).argmax(1) == vy).double().mean())


def naive_estimate(fit_seconds: dict[int, float], n: int) -> float:
    """Seconds of the naive algorithm on ``n`` filters: ``sum_m m * t(m - 1)``, ``t`` interpolated
    linearly between the widths (filter counts) in ``fit_seconds``."""
    widths = sorted(fit_seconds)

    def t(k: int) -> float:
        for a, b in zip(widths, widths[1:]):
            if a <= k <= b:
                return fit_seconds[a] + (k - a) / (b - a) * (fit_seconds[b] - fit_seconds[a])
        raise ValueError(f"width {k} outside the timed range {widths[0]}..{widths[-1]}")

    return sum(m * t(m - 1) for m in range(2, n + 1))


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__)
    add_out_args(p)
    p.add_argument("--fit", type=int, default=1000, help="fit samples")
    p.add_argument("--val", type=int, default=1000, help="validation samples")
    p.add_argument("--pool", type=int, default=2, help="pooled values per filter = pool^2")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--widths", type=int, default=9, help="filter counts at which one exit fit is timed")
    args = p.parse_args(argv)
    resolve_out(args, __file__)
    d = args.pool**2
    rows = []
    for n in (64, 256):
        g = torch.Generator().manual_seed(n)
        fx, fy = torch.randn(args.fit, n, d, generator=g, dtype=torch.float64), torch.randint(0, 10, (args.fit,), generator=g)
        vx, vy = torch.randn(args.val, n, d, generator=g, dtype=torch.float64), torch.randint(0, 10, (args.val,), generator=g)
        # widths 1 .. n - 1, denser where fits are cheap (geometric), every one distinct
        widths = sorted({max(1, round((n - 1) ** (i / (args.widths - 1)))) for i in range(args.widths)} | {n - 1})
        fns = {"ranking": lambda: collective_ranking(fx, fy, vx, vy, stop_fraction=0.0)}
        for k in widths:
            fns[k] = lambda k=k: one_exit_fit(fx[:, :k], fy, vx[:, :k], vy)
        med = alternating_median_s(fns, args.repeats)
        t_rank, fit_seconds = med.pop("ranking"), med
        naive = naive_estimate(fit_seconds, n)
        rows.append({"filters": n, "features": n * d, "ranking_seconds": round(t_rank, 4),
                     "exit_fit_seconds": {str(k): round(v, 6) for k, v in fit_seconds.items()},
                     "naive_fits": sum(range(2, n + 1)),
                     "naive_estimate_seconds": round(naive, 2),
                     "speedup_vs_naive_estimate": round(naive / t_rank, 1)})
        print(rows[-1])
    summary = {"samples": {"fit": args.fit, "val": args.val}, "pool": args.pool, "layers": rows,
               "note": "naive = sum over steps of m fits of m - 1 filters, each a closed-form ridge fit timed at "
                       "that width (interpolated between timed widths): a lower bound for SGD fine-tuning",
               "machine": machine(), "repeats": args.repeats}
    out = args.out
    write_json(out / "summary.json", summary)
    write_run(out, __file__, argv)
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
