"""Accuracy drop vs ISQuant bitwidth per split point, as a heat map (DynO Fig. 8).

Runs :func:`nestflex.profiling.profile_split_quantization` on the trained recipe model's
validation split and draws it with :func:`nestflex.profiling.plots.plot_split_quantization`:
the same profiler and plot the recipe's ``profile`` stage uses, here as a stand-alone
measurement with its own machine record.

Writes, under ``--out``: ``summary.json`` (per split the lowest bitwidth within 1, 2 and 5
points, the drop per bitwidth, and the full profile) and ``split_heatmap.png``.

Example:
    python benchmarks/split/split_heatmap.py --out runs/bench_split_heatmap --checkpoint runs/vgg_cifar/baseline/model.ckpt
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from nestflex._io import write_json

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: the repository root, for benchmarks.*
from benchmarks._common import add_model_args, load_model, machine, resolve_out, validation_loader, write_run  # noqa: E402

SCHEMA_VERSION = 1


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_model_args(p)
    p.add_argument("--size-samples", type=int, default=32, help="samples encoded one frame each for sizes")
    p.add_argument("--bits", default="2,3,4,5,6,7,8,16", help="comma list of ISQuant bitwidths (float is added)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (recorded)")
    args = p.parse_args(argv)
    resolve_out(args, __file__)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from nestflex.profiling import profile_split_quantization
    from nestflex.profiling.plots import plot_split_quantization

    torch.manual_seed(0)
    args.out.mkdir(parents=True, exist_ok=True)
    model, config, source = load_model(args.checkpoint, args.out, args.data_dir)
    loader, data_source, synthetic = validation_loader(config, args.data_dir)
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    profile = profile_split_quantization(model, loader, bitwidths=[int(b) for b in args.bits.split(",")],
                                         max_samples=args.samples, size_samples=args.size_samples)
    seconds = round(time.perf_counter() - start, 1)
    bits = [b for b in profile["bitwidths"] if b is not None]
    splits = {
        row["name"]: {
            "macs_fraction": row["macs_fraction"],
            "lowest_bits": row["lowest_bits"],
            "drop_points": {str(r["bits"]): r["drop_points"] for r in row["per_bits"] if r["bits"] is not None},
        }
        for row in profile["splits"]
    }
    summary = {
        "schema_version": SCHEMA_VERSION,
        "benchmark": "split_heatmap",
        "synthetic": synthetic,
        "data": data_source,
        "model_source": source,
        "model": {k: config.get(k) for k in ("model", "width", "epochs")},
        "samples": profile["samples"],
        "float_accuracy": profile["float_accuracy"],
        "bits": bits,
        "profile_seconds": seconds,
        "splits": splits,
        "machine": {**machine(), "torch_threads": args.threads},
        "note": "accuracy only depends on the data and the model; the profile's codec times come from a shared 2-core machine",
        "profile": profile,
    }
    write_json(args.out / "summary.json", summary)
    write_run(args.out, __file__, argv)
    plot_split_quantization(profile, args.out / "split_heatmap.png", synthetic=synthetic)
    within1 = [s["lowest_bits"]["1"] for s in splits.values()]
    print(f"{len(splits)} splits, float accuracy {profile['float_accuracy']:.4f} on {profile['samples']} samples; "
          f"lowest bits within 1 pt: {within1} ({seconds} s)")
    print(f"wrote {args.out / 'summary.json'}, split_heatmap.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
