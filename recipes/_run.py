"""Resume and caching for the recipes, kept out of their way, plus their plots.

Each stage owns ``--out/<stage>/`` and a ``config.json`` saying what produced it. A stage whose
config matches what is asked reuses its files; one killed mid-way resumes from its rolling
``last.ckpt``; another config starts afresh (its old directory is removed, so a roadmap is never
continued under other settings). Nothing here trains: the recipes build their Trainers with the
public nestflex callbacks, as a user does.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path
from typing import Any, Sequence

from nestflex._io import read_json, write_json


class StageDir:
    """One stage's directory: its config, what it wrote, and how to resume it."""

    def __init__(self, root: Path, name: str, config: dict[str, Any]) -> None:
        self.root, self.name, self.config = Path(root), name, config
        self.dir = self.root / name
        path = self.dir / "config.json"
        self.same = path.exists() and read_json(path) == config
        self.reused = False

    def done(self, *files: str) -> bool:
        """The stage ran to the end with this config: reuse it."""
        if self.same and all((self.dir / f).exists() for f in files):
            print(f"{self.name}: reusing {self.dir / files[0]} (same configuration)")
            self.reused = True
            return True
        return False

    def record_seconds(self, seconds: float) -> float:
        """The stage's wall time: this call's, saved beside its outputs, or, for a reused stage, the
        time it took when it ran (so a resumed or extended run still reports every stage's cost)."""
        path = self.dir / "seconds.json"
        if self.reused and path.exists():
            return read_json(path)["seconds"]
        if not self.reused:
            write_json(path, {"seconds": round(seconds, 1)})
        return round(seconds, 1)

    def begin(self) -> Path | None:
        """Start (or resume) the stage; returns the checkpoint to resume from, if any."""
        resume = self.dir / "last.ckpt"
        resume = resume if self.same and resume.exists() else None
        if not self.same and self.dir.exists():
            shutil.rmtree(self.dir)
        write_json(self.dir / "config.json", self.config)
        if resume:
            print(f"{self.name}: resuming from {resume}")
        return resume

    def trainer(self, args: argparse.Namespace, callbacks: Sequence[Any], max_epochs: int, resume: Path | None,
                **kwargs: Any):
        """A Trainer logging to ``logs/<stage>`` with a rolling ``last.ckpt`` (what a killed run resumes)."""
        import pytorch_lightning as pl
        from pytorch_lightning.callbacks import ModelCheckpoint
        from pytorch_lightning.loggers import CSVLogger

        logs = self.root / "logs"
        # Lightning's CSVLogger empties an existing version directory, so a resumed run logs to a new
        # one and the curves are stitched from all of them: resuming never loses logged epochs.
        version = f"{self.name}-resume{len(list(logs.glob(f'{self.name}-resume*'))) + 1}" if resume else self.name
        if not resume:
            for old in logs.glob(f"{self.name}-resume*"):
                shutil.rmtree(old)  # logs of an abandoned configuration
        return pl.Trainer(
            max_epochs=max_epochs, accelerator=args.accelerator, devices=devices(args),
            logger=CSVLogger(self.root, name="logs", version=version),
            callbacks=[*callbacks, ModelCheckpoint(dirpath=self.dir, filename="last", save_top_k=1,
                                                   enable_version_counter=False)],
            default_root_dir=self.root, enable_model_summary=False, **kwargs)

    def read(self, name: str) -> Any:
        return read_json(self.dir / name)

    def write(self, name: str, value: Any) -> None:
        write_json(self.dir / name, value)


def devices(args: argparse.Namespace) -> int | str:
    return int(args.devices) if args.devices.isdigit() else args.devices


def callback_trainer(args: argparse.Namespace, callbacks: Sequence[Any]):
    """A Trainer that trains nothing and runs ``callbacks``' end-of-fit work on a trained module
    (FlexDNNExits, BundleExporter): what a user does to add exits or a bundle to a finished run."""
    import pytorch_lightning as pl

    return pl.Trainer(max_epochs=0, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                      callbacks=list(callbacks))


def plot_curves(csv_paths: list[Path], png: Path, synthetic: bool) -> None:
    """Accuracy per epoch from Lightning CSV logs; later files (resumed runs) win per epoch."""
    import csv

    plt = _pyplot()
    val: dict[int, float] = {}
    train: dict[int, float] = {}
    for csv_path in csv_paths:
        with open(csv_path) as f:
            for row in csv.DictReader(f):
                if row.get("val_acc"):
                    val[int(row["epoch"])] = float(row["val_acc"])
                if row.get("train_acc"):
                    train[int(row["epoch"])] = float(row["train_acc"])
    if not val and not train:
        return
    train, val = dict(sorted(train.items())), dict(sorted(val.items()))
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.plot([e + 1 for e in train], list(train.values()), "o-", label="train")
    ax.plot([e + 1 for e in val], list(val.values()), "s-", label="validation")
    ax.set(xlabel="epoch", ylabel="top-1 accuracy", title="baseline" + (" (synthetic data)" if synthetic else ""))
    _save(fig, ax, png)


def plot_roadmap(road, png: Path, synthetic: bool) -> None:
    """Validation accuracy vs MACs of every footprint; the goal as a dashed line."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5, 3.5))
    fps = road.footprints
    line, = ax.plot([f.macs / 1e6 for f in fps], [f.accuracy for f in fps], "o-", label=f"{road.criterion} roadmap")
    ax.plot(fps[-1].macs / 1e6, fps[-1].accuracy, "*", ms=14, color=line.get_color())
    for r in road.rejected:
        ax.plot(r.macs / 1e6, r.accuracy, "x", ms=9, color=line.get_color())
    ax.axhline(road.goal, ls="--", lw=0.8, color=line.get_color())
    ax.set(xlabel="MACs per image (millions)", ylabel="validation top-1")
    ax.set_title("pruning roadmap (star: seed, x: rejected steps)" + (" (synthetic data)" if synthetic else ""),
                 fontsize=9)
    _save(fig, ax, png)


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, ax, png: Path) -> None:
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=120)
    _pyplot().close(fig)


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
