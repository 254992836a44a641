"""What the recipes report: their ``summary.json`` entries, read from the files a stage wrote
(the roadmap, FlexDNN's report, the profiles), and the lines they print at the end.

The keys are documented in docs/recipes.md; the recipes call these after their Trainers ran.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def prune_summary(road: Any, test_accuracy: float, seconds: float) -> dict[str, Any]:
    """The prune stage's entry: the roadmap's seed against the vanilla model, and why it stopped."""
    seed, vanilla = road.seed, road.footprints[0]
    return {
        "roadmap": "prune/roadmap.json", "criterion": road.criterion, "status": road.status,
        "steps": len(road.footprints) - 1, "accuracy": round(float(test_accuracy), 4),
        "val_accuracy": seed.accuracy, "goal": road.goal, "params": seed.params, "macs": seed.macs,
        "macs_fraction": round(seed.macs / vanilla.macs, 4), "params_fraction": round(seed.params / vanilla.params, 4),
        "seed_checkpoint": "prune/seed.ckpt", "seconds": round(seconds, 1),
        "start_val_accuracy": road.start_accuracy, "rejected_steps": len(road.rejected),
        # the stopping reason is `status`; the noise entry sizes the goal's margin against the split
        "val_size": road.eval_samples, "noise": road.noise(), "finetune": road.finetune,
        **({"confirm": road.confirm} if road.confirm is not None else {}),  # --prune-confirm's verdicts
    }


def flex_summary(spec: dict[str, Any], report: dict[str, Any]) -> dict[str, Any]:
    """The flex stage's entry from FlexDNNExits' ``spec.json`` and ``report.json`` (before the test figures)."""
    plan, shipped = report["plan"], report.get("calibration", {})
    return {
        "kept_locations": plan["kept_locations"], "thresholds": spec["thresholds"], "confidence": spec["confidence"],
        "candidates": [c["location"] for c in report["candidates"]],
        "validation": {k: plan[k] for k in ("accuracy", "mean_macs", "mean_macs_fraction")},
        "calibration": {k: shipped[k] for k in ("split", "samples", "accuracy", "mean_macs", "mean_macs_fraction")
                        if k in shipped},
        "backbone_macs": report["backbone_macs"],
        "min_filters": {r["location"]: {k: r[k] for k in ("filters", "min_filters", "min_filters_split") if k in r}
                        for r in report["ranking"]},
        "operating_points": len(report.get("profile", {}).get("operating_points", [])),
        "seconds": report["seconds"], "spec": "flex/spec.json", "report": "flex/report.json",
    }


def profile_summary(split: dict[str, Any], prec: dict[str, Any]) -> dict[str, Any]:
    """The profile stage's entry: per split, the lowest bitwidth within 1 point and its compression;
    the per-layer precision assignment at the batch size it was optimised for."""
    splits = {}
    for row in split["splits"]:
        bits = row["lowest_bits"]["1"]
        ratio = next(r["ratio"] for r in row["per_bits"] if r["bits"] == bits)
        splits[row["name"]] = {"bits": bits, "compression_ratio": round(ratio, 2)}
    assign, bs = prec["assignment"], str(prec["optimised_batch_size"])
    precision = {
        "budget_points": assign["budget_points"], "batch_size": prec["optimised_batch_size"], "counts": assign["counts"],
        "float32_accuracy": prec["reference"]["accuracy"], "accuracy": assign["accuracy"],
        "drop_points": assign["drop_points"], "float32_latency_ms": round(prec["reference"]["latency_ms"][bs], 3),
        "latency_ms": round(assign["latency_ms"][bs], 3), "speedup": round(assign["speedup"][bs], 2),
        "samples": prec["samples"], "torch_threads": prec["machine"]["torch_threads"], "fallback": assign["fallback"],
        "profile": "profile/layer_precision.json",
    }
    return {"float_accuracy": split["float_accuracy"], "samples": split["samples"],
            "profile": "profile/split_quantization.json", "splits": splits, "precision": precision}


def print_summary(summary: dict[str, Any], out: Path) -> None:
    """The run's headline figures, one line per result."""
    tag = "  (synthetic data)" if summary["data"]["synthetic"] else ""
    if "baseline" in summary:
        s = summary["baseline"]
        print(f"  baseline  accuracy {s['accuracy']:.4f}  params {s['params']:,}  MACs {s['macs']:,}{tag}")
    if "pruning" in summary:
        s = summary["pruning"]
        print(f"  prune     seed ({s['criterion']}, {s['steps']} steps, {s['status']}) accuracy {s['accuracy']:.4f}  "
              f"params {s['params']:,}  MACs {s['macs']:,} ({s['macs_fraction']:.0%} of the baseline){tag}")
        if (s.get("noise") or {}).get("warning"):
            print(f"  prune     WARNING {s['noise']['warning']}")
    if "grow" in summary:
        g = summary["grow"]
        for lv in g["levels"]:
            print(f"  grow      level {lv['level']}  accuracy {lv['accuracy']:.4f}  params {lv['params']:,}  MACs "
                  f"{lv['macs']:,}  {lv['memory_mb']:.3f} MB  latency {lv['latency_ms']['1']:.2f} ms (batch 1){tag}")
        m = g["memory"]
        print(f"  grow      multi-capacity {m['multi_capacity_mb']:.3f} MB vs {m['independent_mb']:.3f} MB for "
              f"{len(g['levels'])} independent models ({m['ratio_to_largest']:.3f}x the largest level)")
    if "exits" in summary:
        e = summary["exits"]
        print(f"  exits     {len(e['layers'])} exits at {e['positions']} of the MACs; test accuracy per exit "
              f"{e['accuracy']}{tag}")
        ll = e["lossless"]
        print(f"  exits     lossless thresholds: accuracy {ll['accuracy']:.4f} at {ll['macs_fraction']:.2f} of the "
              f"backbone's MACs (backbone alone {e['backbone']['accuracy']:.4f}){tag}")
    if "flexdnn" in summary:
        f = summary["flexdnn"]
        print(f"  flex      plan {f['kept_locations']}: test accuracy {f['accuracy']:.4f} at {f['mean_macs_fraction']:.2f} "
              f"of the backbone's MACs (backbone alone {f['backbone_accuracy']:.4f}){tag}")
    if "quantization" in summary:
        for split, q in summary["quantization"]["splits"].items():
            print(f"  profile   {split:<18} lowest bits within 1 pt: {q['bits']}  ratio {q['compression_ratio']}x{tag}")
        pr = summary["quantization"].get("precision")
        if pr:
            counts = ", ".join(f"{n} {p}" for p, n in pr["counts"].items() if n)
            print(f"  precision layers {counts} within {pr['budget_points']:g} pt: measured drop {pr['drop_points']:.2f} pt, "
                  f"{pr['speedup']}x faster than float32 at batch {pr['batch_size']}{tag}")
    if "export" in summary:
        x = summary["export"]
        print(f"  export    {x['levels']} level(s), exits backbone {x['exits_backbone']}, "
              f"{x.get('flex_exits', 0)} FlexDNN exit(s) (backbone {x.get('flex_exits_backbone')}): {x['bytes']:,} bytes "
              f"({x['weights_bytes']:,} weights, {x['onnx_bytes']:,} ONNX; largest level {x['largest_level_bytes']:,})")
        print(f"bundle: {out / x['bundle']}")


def print_progressive_summary(summary: dict[str, Any]) -> None:
    """The progressive recipe's headline figures: training, then the exits."""
    tag = "  (synthetic data)" if summary["data"]["synthetic"] else ""
    if "training" in summary:
        t = summary["training"]
        print(
            f"  train     {t['epochs']} epochs on {t['train_samples']:,} images in {t['train_seconds']} s; "
            f"backbone MACs {t['backbone_macs']:,}, exit heads {sum(t['head_macs']):,}{tag}"
        )
    if "exits" in summary:
        e = summary["exits"]
        print(f"  exits     {e['layers']} at {e['positions']} of the MACs{tag}")
        print(f"  exits     test accuracy per exit {e['accuracy']} (final = backbone alone){tag}")
        if "within_1pt" in e:
            w = e["within_1pt"]
            print(
                f"  exits     within 1 pt (threshold {w['threshold']} chosen on validation): accuracy "
                f"{w['accuracy']:.4f} at {w['macs_fraction']:.2f} of the backbone's MACs{tag}"
            )
        else:
            print(
                f"  exits     no threshold keeps the {e['fallback']} policy within 1 pt of the final exit on validation"
            )
        ll = e["lossless"]
        print(
            f"  exits     lossless thresholds: accuracy {ll['accuracy']:.4f} at {ll['macs_fraction']:.2f} of the "
            f"backbone's MACs; overthinking rate {e['overthinking_rate']:.4f}{tag}"
        )
