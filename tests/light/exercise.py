"""Every device feature once, in one fresh process; prints the training-side modules it imported.

    python -m tests.light.exercise DIR      # DIR: make_bundles.py's output

Loads both bundles, runs every level, both exit sets (batched and one frame at a time), a split's
head and tail through the codec, the device engine with two apps and the CLI's inspect and bench
functions, then prints ``{"heavy": [...], "modules": N}``: the modules of :data:`HEAVY` that are in
``sys.modules``. ``test_no_torch.py`` runs it in a subprocess, so a lazy ``import torch`` anywhere
on these paths shows even in the full venv, where it would succeed.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

#: top-level packages the device side must not import (DESIGN invariant 6)
HEAVY = ("torch", "onnx", "lightning", "pytorch_lightning", "lightning_fabric", "timm", "torchmetrics",
         "torchvision", "matplotlib", "scipy", "sympy", "triton")


def heavy_modules() -> list[str]:
    """The modules of :data:`HEAVY` (and their submodules) imported so far."""
    return sorted(m for m in sys.modules if m.split(".")[0] in HEAVY)


def exercise(root: Path) -> None:
    import nestflex.deploy as nd
    from nestflex.cli import bench_bundle, inspect_table
    from nestflex.deploy.codec import decode, encode

    refs = np.load(root / "references.npz", allow_pickle=False)
    bundles = {n: nd.load(root / f"{n}.nfx") for n in ("shipped", "derived")}
    for name, bundle in bundles.items():
        x = refs[f"{name}.x"]
        rt = nd.CapacityRuntime(bundle, level=0)
        for k in range(bundle.num_levels):
            rt.set_level(k)
            rt(x)
        for key in bundle.exit_sets:
            prog = nd.ProgressiveRuntime(bundle, rt, exit_set=key)
            prog(x)
            prog(x[:1])
            prog.all_exits(x)
        split = bundle.splits[len(bundle.splits) // 2]["name"]
        srt = nd.SplitRuntime(bundle, split, "exits")
        head = srt.head(x, 1.0)
        srt.combine(head, srt.tail(decode(encode(list(head.crossing), 4)), 1.0))
        inspect_table(bundle)
        bench_bundle(bundle, repeats=1)
    with nd.Engine("greedy_total") as engine:
        for name, bundle in bundles.items():
            engine.add_app(name, bundle, profile_repeats=1)
        for name in bundles:
            engine.infer(name, refs[f"{name}.x"][0], timeout=30)


if __name__ == "__main__":
    exercise(Path(sys.argv[1]))
    print(json.dumps({"heavy": heavy_modules(), "modules": len(sys.modules)}))
