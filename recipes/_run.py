"""Resume and caching for the recipes, kept out of their way, plus their plots.

Each stage owns ``--out/<stage>/`` and a ``config.json`` saying what produced it. A stage whose
config matches what is asked reuses its files; one killed mid-way resumes from its rolling
``last.ckpt``; another config starts afresh (its old directory is removed, so a roadmap is never
continued under other settings). :class:`Run` is what the stages share (the options, the data,
the modules earlier stages left) and :func:`run_stages` runs them in order, writing
``summary.json`` after each. Nothing here trains: the recipes build their Trainers with the
public nestflex callbacks, as a user does.
"""

from __future__ import annotations

import copy
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

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

    def trainer(self, cfg: Any, callbacks: Sequence[Any], max_epochs: int, resume: Path | None, **kwargs: Any):
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
            max_epochs=max_epochs, accelerator=cfg.accelerator, devices=devices(cfg),
            logger=CSVLogger(self.root, name="logs", version=version),
            callbacks=[*callbacks, ModelCheckpoint(dirpath=self.dir, filename="last", save_top_k=1,
                                                   enable_version_counter=False)],
            default_root_dir=self.root, enable_model_summary=False, **kwargs)

    def cached(self, name: str, config: dict[str, Any], compute: Callable[[], Any]) -> Any:
        """The JSON file ``name`` in the stage directory, made by ``compute()`` under ``config`` (kept in
        ``<stem>_config.json`` beside it): reused while that config matches, recomputed otherwise."""
        path = self.dir / name
        config_path = path.with_name(f"{path.stem}_config.json")
        if path.exists() and config_path.exists() and read_json(config_path) == config:
            print(f"{self.name}: reusing {path} (same configuration)")
        else:
            write_json(path, compute())
            write_json(config_path, config)
        return read_json(path)

    def read(self, name: str) -> Any:
        return read_json(self.dir / name)

    def write(self, name: str, value: Any) -> None:
        write_json(self.dir / name, value)


def devices(cfg: Any) -> int | str:
    """``--devices`` as Lightning takes it: a count, or a string such as ``0,1`` or ``auto``."""
    return int(cfg.devices) if cfg.devices.isdigit() else cfg.devices


def callback_trainer(callbacks: Sequence[Any]):
    """A Trainer that trains nothing and runs ``callbacks``' end-of-fit work on a trained module
    (FlexDNNExits, BundleExporter): what a user does to add exits or a bundle to a finished run."""
    import pytorch_lightning as pl

    return pl.Trainer(max_epochs=0, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                      callbacks=list(callbacks))


class Run:
    """What the stages of one invocation share: the options, the data, the summary so far, and the
    modules earlier stages left (reloaded from ``--out`` when they ran in an earlier invocation)."""

    def __init__(self, cfg: Any, dm: Any, data: dict[str, Any], summary: dict[str, Any]) -> None:
        self.cfg, self.dm, self.data, self.summary, self.out = cfg, dm, data, summary, Path(cfg.out)
        self.modules: dict[str, Any] = {}
        self.opened: StageDir | None = None  # the stage directory the running stage opened

    def stage(self, name: str, config: dict[str, Any]) -> StageDir:
        self.opened = StageDir(self.out, name, config)
        return self.opened

    def config(self, name: str) -> Any:
        return read_json(self.out / name / "config.json")

    def baseline(self):
        """The baseline stage's ImageClassifier (this run's, or its checkpoint in ``--out``)."""
        from nestflex.training import ImageClassifier

        if "baseline" not in self.modules:
            ckpt = self.out / "baseline" / "model.ckpt"
            if not ckpt.exists():
                raise SystemExit(f"--stages: the baseline checkpoint {ckpt} does not exist. "
                                 f"HINT: run with --stages baseline first (or --stages all)")
            self.modules["baseline"] = ImageClassifier.load_from_checkpoint(ckpt, map_location="cpu", weights_only=True)
        return self.modules["baseline"]

    def grown(self):
        """The grow stage's multi-capacity module (this run's, or rebuilt from ``--out``); ``None`` without one."""
        import torch

        from nestflex.callbacks import FreezeAndGrow
        from nestflex.capacity import set_level
        from nestflex.training import ImageClassifier

        if "grow" not in self.modules:
            out = self.out / "grow"
            if not all((out / f).exists() for f in ("model.ckpt", "result.json", "config.json")):
                return None
            config = read_json(out / "config.json")
            module = ImageClassifier(**dict(self.baseline().hparams))
            FreezeAndGrow(self.out / "prune" / "roadmap.json", levels=config["levels"]).build(module)
            module.load_state_dict(torch.load(out / "model.ckpt", map_location="cpu", weights_only=True)["state_dict"])
            set_level(module, config["levels"] - 1)
            self.modules["grow"] = module
        return self.modules["grow"]

    def exit_backbone(self) -> tuple[Any, Any]:
        """Where exits go, as recorded in their configs, and the module holding it: the grown model's
        largest level when grow ran (the bundle then stores the backbone once), else the baseline."""
        grown = self.grown()
        if grown is None:
            return "baseline", self.baseline()
        return {"grow": self.config("grow"), "level": "largest"}, grown

    def roadmap(self, levels: int) -> tuple[Path, int]:
        """The prune stage's roadmap and how many levels to grow on it: ``levels``, or fewer (said)
        when the roadmap has fewer footprints."""
        from nestflex.pruning import Roadmap

        path = self.out / "prune" / "roadmap.json"
        if not path.exists() or not (self.out / "prune" / "result.json").exists():
            raise SystemExit(f"--stages: the roadmap {path} does not exist. HINT: run with --stages prune first")
        grown = min(levels, len(Roadmap.load(path).footprints))
        if grown < levels:
            print(f"grow: the roadmap has {grown} footprints; growing {grown} levels, not --grow-levels {levels}")
        if grown < 2:
            raise SystemExit("grow: the roadmap has a single footprint (nothing was pruned); nothing to grow")
        return path, grown

    def bundle_parts(self, source: Any) -> dict[str, Any]:
        """What the earlier stages left in ``--out`` for a bundle on ``source``'s backbone, as
        BundleExporter's arguments; exits trained on another backbone are left out."""
        out = self.out
        grow = read_json(out / "grow" / "profile.json") if source != "baseline" else {}
        exits = out / "exits" / "model.ckpt" if (out / "exits" / "calibration.json").exists() else None
        if exits is not None and read_json(out / "exits" / "config.json")["backbone"] != source:
            print(f"export: skipping {exits} (trained on another backbone). HINT: rerun --stages exits")
            exits = None
        flex = out / "flex"
        if not (flex / "config.json").exists() or read_json(flex / "config.json")["backbone"] != source:
            flex = None
        split, precision = (out / "profile" / f"{name}.json" for name in ("split_quantization", "layer_precision"))
        return {"exits": exits, "calibration": out / "exits" / "calibration.json" if exits else None, "flex": flex,
                "levels": grow.get("levels"), "switching": grow.get("switching"),
                "split_profile": split if split.exists() else None,
                "precision_profile": precision if precision.exists() else None}

def largest_level(module: Any):
    """A plain copy of the module's network (its largest level when grown): exits train on it and
    later stages still need the module as it was."""
    from nestflex.capacity import extract_level, num_levels

    net = module.model.cpu()
    return extract_level(net, num_levels(net) - 1) if num_levels(net) else copy.deepcopy(net)


def data_module(cfg: Any, **overrides: Any):
    """The DataModule the options ask for, and the line saying which data it is and why."""
    from nestflex.data import resolve_data

    d = cfg.data
    kwargs = {"download": d.download, "batch_size": d.batch_size, "num_workers": d.num_workers,
              "max_train_samples": d.max_train_samples, "val_size": d.val_size, "seed": cfg.seed,
              "train_size": d.synthetic_train_size, "test_size": d.synthetic_test_size} | overrides
    return resolve_data(d.kind, d.dir, **kwargs)


def open_run(cfg: Any, **data_overrides: Any) -> Run:
    """``--out`` created, the data resolved (and said), and the summary an earlier run left there."""
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    dm, message = data_module(cfg, **data_overrides)
    print(message)
    summary_path = out / "summary.json"
    summary: dict[str, Any] = read_json(summary_path) if summary_path.exists() else {}
    data = {"name": dm.name, "synthetic": bool(dm.synthetic), "seed": cfg.seed, "source": message}
    if dm.synthetic:
        data.update(train_size=dm.train_size, test_size=dm.test_size)
    summary["data"] = data
    return Run(cfg, dm, data, summary)


def run_stages(run: Run, stages: Mapping[str, Callable[[Run], dict[str, Any]]], names: Sequence[str],
               summary_keys: Mapping[str, str], timing: bool = True) -> dict[str, Any]:
    """Run ``names`` in order; each stage returns ``{"summary": ..., "top": {...}}``, filed in the
    summary under its ``summary_keys`` name (default: its own), written after every stage so a
    crash later keeps what is done. ``timing``: also record wall seconds per stage."""
    summary, path = run.summary, run.out / "summary.json"
    # wall seconds per stage: what it took when it ran (a reused stage keeps its earlier time and is
    # listed in `reused`); `seconds` is this invocation's wall time
    times: dict[str, Any] = {"stages": {}, "seconds": 0.0, "reused": []}
    start = time.perf_counter()
    for i, name in enumerate(names, 1):
        if timing:
            print(f"== stage {i}/{len(names)}: {name}")
        t0, run.opened = time.perf_counter(), None
        result = stages[name](run)
        summary[summary_keys.get(name, name)] = result["summary"]
        summary.update(result.get("top", {}))  # keys a stage also puts at the top level (grow: levels, memory)
        if timing:
            seconds = time.perf_counter() - t0
            times["stages"][name] = run.opened.record_seconds(seconds) if run.opened else round(seconds, 1)
            if run.opened is not None and run.opened.reused:
                times["reused"].append(name)
            times["seconds"] = round(time.perf_counter() - start, 1)
            summary["timing"] = times
        write_json(path, summary)
        if timing:
            print(f"== stage {name} done in {seconds:.0f} s ({times['seconds']:.0f} s so far)")
    print(f"summary: {path}")
    return summary


def plot_curves(logs: Path, stage: str, png: Path, synthetic: bool) -> None:
    """Accuracy per epoch from a stage's Lightning CSV logs (``logs/<stage>*/metrics.csv``); later
    files (resumed runs) win per epoch."""
    import csv

    csv_paths = sorted(logs.glob(f"{stage}*/metrics.csv"), key=lambda p: p.stat().st_mtime)
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
