"""Which widths make latency follow MACs on this CPU: VGG-16 at batch 1, per width and per nested level.

For the live multi-tenant benchmark the levels of a bundle must really differ in time, or no
scheduler can trade accuracy for frames. Small CNNs at batch 1 on a desktop CPU are overhead-bound
(a fixed cost per op), so a level with a third of the MACs takes far more than a third of the time.
This measures, for VGG-16 at ``--widths``, the batch-1 latency of the full network and of nested
levels made by keeping ``--fractions`` of every layer's channels (what a pruned/grown level looks
like), through the deploy runtime (``CapacityRuntime``) on an exported bundle, and reports each
level's time fraction next to its MACs fraction. Random weights: latency does not depend on them.

Writes ``--out/summary.json`` and ``--out/width_latency.png``.

Example:
    python benchmarks/capacity/width_latency.py --out runs/bench_width_latency
"""

from __future__ import annotations

from nestflex.deploy.runtime.capacity import CapacityRuntime
import argparse
import sys
import tempfile
from pathlib import Path

import torch

from nestflex._io import write_json
from nestflex._machine import machine
from nestflex.capacity.levels import LevelPlan
from nestflex.capacity.nested import Source, nest_
from nestflex.deploy import load
from nestflex.deploy.timing import alternating_median_ms
from nestflex.export import export_bundle
from nestflex.graph import trace
from nestflex.models import create_model

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: the repository root, for benchmarks.*
from benchmarks._common import add_out_args, resolve_out, write_run  # noqa: E402


def nested_vgg16(width: float, fractions: list[float]) -> torch.nn.Module:
    """VGG-16 at ``width`` nested into levels that keep ``fractions`` of every prunable group's channels
    (what pruned and grown levels look like; which channels does not matter for time)."""
    torch.manual_seed(0)
    net = create_model("vgg16", width=width).eval()
    groups = {g.name: g.width for g in trace(net).prunable_groups}
    widths = tuple({g: max(1, round(f * w)) for g, w in groups.items()} for f in fractions)
    plan = LevelPlan(tuple(range(len(fractions))), {g: list(range(w)) for g, w in groups.items()}, widths,
                     tuple(0 for _ in fractions))
    own = Source(net.state_dict())
    return nest_(net, plan, [own] * len(fractions)).eval()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--widths", type=float, nargs="+", default=[0.25, 0.5, 1.0])
    p.add_argument("--fractions", type=float, nargs="+", default=[0.3, 0.65, 1.0],
                   help="channel fractions of the levels (smallest first; the last must be 1)")
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--threads", type=int, default=2)
    add_out_args(p)
    args = p.parse_args(argv)
    out = resolve_out(args, __file__)
    torch.set_num_threads(args.threads)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    x = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    for width in args.widths:
        with tempfile.TemporaryDirectory() as d:
            net = nested_vgg16(width, args.fractions)
            bundle = load(export_bundle(Path(d) / "b.nfx", net, onnx=False)["bundle"])
            macs = [r["macs"] for r in bundle.levels]
            runtimes = [CapacityRuntime(bundle, k) for k in range(bundle.num_levels)]
            times = alternating_median_ms({str(k): (lambda rt=rt: rt(x)) for k, rt in enumerate(runtimes)},
                                          args.repeats, warmup=3)
        top = times[str(len(runtimes) - 1)]
        for k in range(len(runtimes)):
            rows.append({"width": width, "level": k, "macs": macs[k], "macs_fraction": macs[k] / macs[-1],
                         "latency_ms": times[str(k)], "time_fraction": times[str(k)] / top,
                         "time_over_macs": (times[str(k)] / top) / (macs[k] / macs[-1])})
            print(f"width {width:<5} level {k}  MACs {macs[k] / 1e6:8.1f} M ({macs[k] / macs[-1]:.2f})  "
                  f"{times[str(k)]:8.3f} ms ({times[str(k)] / top:.2f})", flush=True)
    summary = {"benchmark": "width_latency", "machine": machine(), "config": {**vars(args), "out": str(out)}, "rows": rows,
               "note": "batch 1, deploy runtime (eager op program), medians of alternating repeats, random weights"}
    write_json(out / "summary.json", summary)
    write_run(out, __file__, argv)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(4.5, 3.4))
    for width in args.widths:
        r = [row for row in rows if row["width"] == width]
        ax.plot([row["macs_fraction"] for row in r], [row["time_fraction"] for row in r], "o-", label=f"VGG-16 x{width:g}")
    ax.plot([0, 1], [0, 1], "k:", label="time = MACs")
    ax.set_xlabel("level MACs / largest level's")
    ax.set_ylabel("level time / largest level's (batch 1)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "width_latency.png", dpi=120)
    return 0


if __name__ == "__main__":
    sys.exit(main())
