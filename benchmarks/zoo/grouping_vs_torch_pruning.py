"""Cross-check nestflex's coupled channel groups against Torch-Pruning's DependencyGraph.

Torch-Pruning is not a nestflex dependency; this benchmark is how we evaluated it before writing
the grouping ourselves (docs/architecture.md). For each model it compares the sets of producer
layers (convs/linears whose output channels form a group), leaving depthwise convs out (Torch-
Pruning lists them as producers of their input's group; nestflex gives them the role
``depthwise``), and times both builds (median of ``--repeats``).

    pip install torch-pruning==1.6.1
    python benchmarks/zoo/grouping_vs_torch_pruning.py --out runs/bench_grouping

Writes ``summary.json`` and ``build_time.png`` under ``--out``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from nestflex._io import write_json
from nestflex._machine import machine
from nestflex.deploy.timing import median_s
from nestflex.graph import trace
from nestflex.models import create_model

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: the repository root, for benchmarks.*
from benchmarks._common import add_out_args, resolve_out, write_run  # noqa: E402

MODELS = ["vgg16", "resnet56", "timm:resnet18", "timm:mobilenetv2_100"]


def _torch_pruning_groups(tp, model: torch.nn.Module) -> set[frozenset[str]]:
    names = {id(m): n for n, m in model.named_modules()}
    graph = tp.DependencyGraph().build_dependency(model, example_inputs=torch.randn(1, 3, 32, 32))
    out_handlers = (tp.prune_conv_out_channels, tp.prune_linear_out_channels)
    groups = set()
    # the classifier's outputs are the model output: never a group (nestflex locks it too)
    last = [m for m in model.modules() if isinstance(m, torch.nn.Linear)][-1]
    for group in graph.get_all_groups(ignored_layers=[last]):
        producers = {names[id(dep.target.module)] for dep, _ in group if dep.handler in out_handlers}
        groups.add(frozenset(producers))
    return groups


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_out_args(p)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args(argv)
    resolve_out(args, __file__)
    import torch_pruning as tp

    def drop_depthwise(groups):
        return {frozenset(n for n in g if "conv_dw" not in n) for g in groups}

    rows = []
    for name in MODELS:
        model = create_model(name).eval()
        ours = drop_depthwise(frozenset(g.producers) for g in trace(model).prunable_groups)
        theirs = drop_depthwise(_torch_pruning_groups(tp, model))
        rows.append({
            "model": name,
            "nestflex_groups": len(ours),
            "torch_pruning_groups": len(theirs),
            "identical": ours == theirs,
            "only_nestflex": sorted(sorted(g) for g in ours - theirs),
            "only_torch_pruning": sorted(sorted(g) for g in theirs - ours),
            "nestflex_seconds": median_s(lambda: trace(model), args.repeats),
            "torch_pruning_seconds": median_s(lambda: _torch_pruning_groups(tp, model), args.repeats),
        })
        print(rows[-1]["model"], rows[-1]["nestflex_groups"], rows[-1]["torch_pruning_groups"], rows[-1]["identical"])
    out = args.out
    write_json(out / "summary.json", {
        "benchmark": "grouping_vs_torch_pruning",
        "torch_pruning": tp.__version__ if hasattr(tp, "__version__") else "unknown",
        "machine": machine(),
        "note": "nestflex_seconds includes fx tracing, shape propagation, MACs and split points",
        "rows": rows,
    })
    write_run(out, __file__, argv)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.2))
    xs = range(len(rows))
    ax.bar([x - 0.2 for x in xs], [r["nestflex_seconds"] * 1e3 for r in rows], 0.4, label="nestflex trace()")
    ax.bar([x + 0.2 for x in xs], [r["torch_pruning_seconds"] * 1e3 for r in rows], 0.4, label="Torch-Pruning DG")
    ax.set_xticks(list(xs), [f"{r['model']}\n{'same groups' if r['identical'] else 'DIFFERENT'}" for r in rows], fontsize=7)
    ax.set_ylabel("build time (ms, median)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "build_time.png", dpi=120)
    print(f"wrote {out / 'summary.json'}")


if __name__ == "__main__":
    main()
