"""``FlexDNNExits``: search and plan FlexDNN exits on the trained network when ``trainer.fit`` ends.

The callback runs :func:`~nestflex.exits.flexdnn.flexdnn` on a frozen copy of the module's network
(the trained weights stay as they are) with the fit's own loaders: the training loader for the exits'
training and classifier refits, the validation loader for every search and plan decision. Unless
``calibration_fraction`` is 0, a seeded share of the validation images is held out of the
search and plan to fit the shipped thresholds (the recipe's protocol, docs/flexdnn.md). It then
writes, each file atomically, into ``dirpath``:

* ``spec.json``: the exits;
* ``report.json``: ranking, search, plan, calibration and operating points;
* ``model.safetensors``: the planned network's ``state_dict`` (absent when the plan keeps no exit).

:func:`~nestflex.exits.flexdnn.load_flex_network` rebuilds the network from ``spec.json`` and
``model.safetensors``, for a plain or a grown (nested) network alike: the exits of a grown
network sit on a plain copy of its largest level, and so does the rebuilt network.

Example::

    flex = FlexDNNExits(config={"epochs": 8}, val_samples=4000)  # exits need real training: docs/flexdnn.md
    module = ImageClassifier("vgg16", width=0.25)
    Trainer(callbacks=[flex]).fit(module, datamodule=dm)
    net = flex.result.network                      # or, in another process, from the files:
    net = load_flex_network(module.model, "flexdnn")  # <default_root_dir>/flexdnn
"""

from __future__ import annotations

import os
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import Callback
from pytorch_lightning.utilities import rank_zero_info
from torch import nn
from torch.utils.data import DataLoader, IterableDataset, Subset
from typing_extensions import override

from nestflex._io import atomic_write_bytes, write_json
from nestflex._trainer import fit_loader, network_attr
from nestflex.deploy.exits import ExitError
from nestflex.exits.flexdnn.pipeline import FlexDNNConfig, FlexDNNResult, flexdnn
from nestflex.exits.flexdnn.spec import SPEC_FILE, WEIGHTS_FILE, _plain_copy

__all__ = ["FlexDNNExits"]


def _indices(loader: DataLoader) -> list[int] | None:
    """The dataset indices ``loader`` visits (its sampler's, so a subset sampler is respected),
    each once, in a fixed order; ``None`` for an iterable dataset."""
    if isinstance(loader.dataset, IterableDataset) or loader.batch_sampler is None:
        return None
    return sorted({int(i) for batch in loader.batch_sampler for i in batch})


def _subset(loader: DataLoader, indices: list[int], shuffle: bool, seed: int) -> DataLoader:
    """A loader over ``indices`` of ``loader``'s dataset with its batch size, collate and workers."""
    size = loader.batch_size or getattr(loader.batch_sampler, "batch_size", None) or 1
    return DataLoader(Subset(loader.dataset, indices), batch_size=size, shuffle=shuffle,
                      generator=torch.Generator().manual_seed(seed) if shuffle else None,
                      collate_fn=loader.collate_fn, num_workers=loader.num_workers)


class FlexDNNExits(Callback):
    """Run FlexDNN on the trained network at ``on_fit_end`` and save the exits.

    Runs on rank zero and on CPU (Lightning has moved the module there by ``on_fit_end``), over
    the fit's whole loaders (``limit_*_batches`` do not apply) unless ``train_samples`` /
    ``val_samples`` cap them; the other ranks wait at a barrier.

    Args:
        dirpath: output directory (default: ``<trainer.default_root_dir>/flexdnn``).
        attr: attribute of the LightningModule that holds the trained classifier; default
            ``model`` (ImageClassifier's), else the module's one child with parameters.
        config: :class:`~nestflex.exits.flexdnn.FlexDNNConfig` fields (``None``: its defaults); a
            ``locations`` list (or one value) is accepted, since LightningCLI YAML has no tuples.
        calibration_fraction: share of the validation images held out of the search and plan to
            fit the shipped thresholds on; 0 plans and calibrates on all of them.
        train_samples: at most this many training images (a seeded draw; ``None``: all), as the
            recipe's ``--flex-train-samples``.
        val_samples: at most this many validation images (a seeded draw; ``None``: all), as the
            recipe's ``--flex-val-samples``; the calibration share is held out of them.

    Attributes:
        result: the :class:`~nestflex.exits.flexdnn.FlexDNNResult` (``None`` before the fit ends).

    Raises:
        ExitError: an unknown ``config`` field or a bad value (at construction), no network under
            ``attr`` (at setup); at the end of the fit, no (or several) validation loaders.

    Example::

        flex = FlexDNNExits(dirpath="runs/x/flexdnn", config={"epochs": 8}, val_samples=4000)
        Trainer(callbacks=[flex]).fit(module, datamodule=dm)
        flex.result.network                                     # the planned exits, in this process
        load_flex_network(module.model, "runs/x/flexdnn")       # the same network, in another one
    """

    def __init__(
        self,
        dirpath: str | os.PathLike | None = None,
        attr: str | None = None,
        config: dict[str, Any] | None = None,
        calibration_fraction: float = 0.5,
        train_samples: int | None = None,
        val_samples: int | None = None,
    ) -> None:
        super().__init__()
        known = {f.name for f in fields(FlexDNNConfig)}
        given = dict(config or {})
        unknown = sorted(set(given) - known)
        if unknown:
            raise ExitError(f"`config` has unknown FlexDNNConfig fields {unknown}. HINT: use some of {sorted(known)}")
        if "locations" in given and not isinstance(given["locations"], (list, tuple)):
            given["locations"] = (given["locations"],)  # one location; the config turns lists into tuples
        self.config = FlexDNNConfig(**given)  # checks every field now, rather than after training
        f = calibration_fraction
        if isinstance(f, bool) or not isinstance(f, (int, float)) or not 0.0 <= f < 1.0:
            raise ExitError(f"`calibration_fraction` must be in [0, 1), got {f!r}. HINT: 0.5 holds out half of the "
                            "validation images to fit the thresholds; 0 uses them all for both")
        for name, v in (("train_samples", train_samples), ("val_samples", val_samples)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ExitError(f"`{name}` must be a positive int or None (all), got {v!r}")
        self.dirpath, self.attr, self.calibration_fraction = dirpath, attr, float(f)
        self.train_samples, self.val_samples = train_samples, val_samples
        self.result: FlexDNNResult | None = None

    def output_dir(self, trainer: pl.Trainer) -> Path:
        """Where the files go: ``dirpath``, else ``<trainer.default_root_dir>/flexdnn``."""
        return Path(self.dirpath if self.dirpath is not None else Path(trainer.default_root_dir) / "flexdnn")

    def _network(self, pl_module: pl.LightningModule) -> nn.Module:
        attr = network_attr(pl_module, self.attr, ExitError, "FlexDNNExits")
        net = getattr(pl_module, attr)
        if hasattr(net, "exits") and hasattr(net, "backbone"):
            raise ExitError(f"`attr`={self.attr!r} holds a multi-exit network; FlexDNN adds exits to a plain "
                            f"classifier. HINT: point `attr` at the backbone, or train an ImageClassifier")
        return net

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "fit":
            self._network(pl_module)  # a wrong `attr` fails before training, not after

    def _splits(self, train: DataLoader, val: DataLoader) -> tuple[Any, Any, Any]:
        """Training, planning and calibration loaders: seeded draws, planning and calibration
        disjoint and both inside the validation loader's own images."""
        seed = self.config.seed
        gen = torch.Generator().manual_seed(seed)

        def draw(idx: list[int], n: int | None) -> list[int]:
            order = torch.randperm(len(idx), generator=gen)[: n if n is not None else len(idx)].tolist()
            return [idx[i] for i in order]

        t_idx, v_idx = _indices(train), _indices(val)
        if t_idx is not None and self.train_samples is not None:
            train = _subset(train, draw(t_idx, self.train_samples), shuffle=True, seed=seed)
        if v_idx is None:
            rank_zero_info("FlexDNNExits: an iterable validation dataset cannot be split or capped; planning and "
                           "calibrating on all of it")
            return train, val, None
        v_idx = draw(v_idx, self.val_samples)
        n_cal = int(round(len(v_idx) * self.calibration_fraction))
        folds = max(self.config.calibration_folds, 1)
        if self.calibration_fraction > 0 and (n_cal < folds or len(v_idx) - n_cal < 1):
            rank_zero_info(f"FlexDNNExits: {len(v_idx)} validation images are too few to hold "
                           f"{self.calibration_fraction} of them out for calibration ({folds} folds); planning and "
                           "calibrating on all of them")
            n_cal = 0
        plan = _subset(val, v_idx[: len(v_idx) - n_cal], shuffle=False, seed=seed)
        calibration = _subset(val, v_idx[len(v_idx) - n_cal:], shuffle=False, seed=seed) if n_cal else None
        return train, plan, calibration

    @override
    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.is_global_zero:
            self._run(trainer, pl_module)
        trainer.strategy.barrier("FlexDNNExits")  # the other ranks wait for the files

    def _run(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        net = self._network(pl_module)
        train, val = (fit_loader(trainer, w, ExitError, "FlexDNNExits") for w in ("train", "val"))
        if val is None or train is None:
            missing = "validation" if val is None else "training"
            raise ExitError(f"`FlexDNNExits` found no {missing} loader after fit (the exits are trained on the "
                            "training split and every search and plan decision is made on the validation split). "
                            "HINT: give trainer.fit val_dataloaders, or a DataModule with both splits")
        # a copy (flexdnn freezes its backbone; the module keeps its training state); of a grown
        # network, its largest level, which the bundle shares with the exits
        backbone = _plain_copy(net).cpu().eval()
        x = next(iter(val))[0]
        input_shape = tuple(x.shape[1:])
        with torch.no_grad():
            out = backbone(x[:1].cpu().float())
        if not isinstance(out, torch.Tensor) or out.ndim != 2:
            raise ExitError(f"`attr`={self.attr!r}: the network must return (N, classes) logits, got "
                            f"{type(out).__name__}. HINT: point `attr` at a plain classifier")
        train, plan, calibration = self._splits(train, val)
        self.result = flexdnn(backbone, train, plan, self.config, num_classes=int(out.shape[-1]),
                              input_shape=input_shape, calibration_batches=calibration)
        self._save(self.result, self.output_dir(trainer))

    @staticmethod
    def _save(result: FlexDNNResult, out: Path) -> None:
        from safetensors.torch import save

        out.mkdir(parents=True, exist_ok=True)
        spec, weights = out / SPEC_FILE, out / WEIGHTS_FILE
        # the spec goes last: a crash part-way leaves no spec beside weights it does not describe
        spec.unlink(missing_ok=True)
        if result.network is not None:
            atomic_write_bytes(weights, save({k: v.contiguous() for k, v in result.network.state_dict().items()}))
        else:
            weights.unlink(missing_ok=True)  # a previous run's exits do not belong to this spec
        write_json(out / "report.json", result.report)
        write_json(spec, result.spec)
        kept = result.report["plan"]["kept_locations"]
        rank_zero_info(f"FlexDNNExits: {len(kept)} exits kept ({', '.join(kept) or 'none'}); wrote {out}")
