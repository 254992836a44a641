"""``FlexDNNExits``: search and plan FlexDNN exits on the trained network when ``trainer.fit`` ends.

The callback runs :func:`~nestflex.exits.flexdnn` on a frozen copy of the module's network (the
trained weights stay as they are) with the fit's own loaders: the training loader for the exits'
training and classifier refits, the validation loader for every search and plan decision. Unless
``calibration_fraction`` is 0, a seeded share of the validation images is held out of the
search and plan to fit the shipped thresholds (the recipe's protocol, docs/flexdnn.md). It then
writes, each file atomically, into ``dirpath``:

* ``spec.json``: the exits (:func:`~nestflex.exits.build_flex_network` rebuilds them);
* ``report.json``: ranking, search, plan, calibration and operating points;
* ``model.safetensors``: the planned network's ``state_dict`` (absent when the plan keeps no exit).

Example::

    trainer = Trainer(callbacks=[FlexDNNExits(config={"epochs": 4})])
    trainer.fit(ImageClassifier("vgg16", width=0.25), datamodule)
    net = build_flex_network(backbone, read_json("flexdnn/spec.json"))
    net.load_state_dict(safetensors.torch.load_file("flexdnn/model.safetensors"))
"""

from __future__ import annotations

import copy
import os
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import Callback
from pytorch_lightning.utilities import rank_zero_info
from torch import nn
from torch.utils.data import DataLoader, Subset
from typing_extensions import override

from nestflex._io import write_json
from nestflex.deploy.exits import ExitError
from nestflex.exits.flexdnn import FlexDNNConfig, FlexDNNResult, flexdnn

__all__ = ["FlexDNNExits"]


def _loader(trainer: pl.Trainer, which: str) -> Any:
    """The fit's ``train``/``val`` loader: the DataModule's, else the one passed to ``fit``."""
    dm = getattr(trainer, "datamodule", None)
    if dm is not None and hasattr(dm, f"{which}_dataloader"):
        return getattr(dm, f"{which}_dataloader")()
    loader = trainer.train_dataloader if which == "train" else trainer.val_dataloaders
    if isinstance(loader, (list, tuple)):
        loader = loader[0] if loader else None
    return loader


class FlexDNNExits(Callback):
    """Run FlexDNN on the trained network at ``on_fit_end`` (rank zero) and save the exits.

    Args:
        dirpath: output directory (default: ``<trainer.default_root_dir>/flexdnn``).
        attr: attribute of the LightningModule that holds the network (ImageClassifier: ``model``).
        config: :class:`~nestflex.exits.FlexDNNConfig` fields (``None``: its defaults); a
            ``locations`` list is accepted (LightningCLI YAML has no tuples).
        calibration_fraction: share of the validation images held out of the search and plan to
            fit the shipped thresholds on; 0 plans and calibrates on all of them.

    Attributes:
        result: the :class:`~nestflex.exits.FlexDNNResult` (``None`` before the fit ends).

    Raises:
        ExitError: an unknown ``config`` field or a bad value (at construction); at the end of
            the fit, no network under ``attr`` or no validation loader.
    """

    def __init__(
        self,
        dirpath: str | os.PathLike | None = None,
        attr: str = "model",
        config: dict[str, Any] | None = None,
        calibration_fraction: float = 0.5,
    ) -> None:
        super().__init__()
        known = {f.name for f in fields(FlexDNNConfig)}
        given = dict(config or {})
        unknown = sorted(set(given) - known)
        if unknown:
            raise ExitError(f"`config` has unknown FlexDNNConfig fields {unknown}. HINT: use some of {sorted(known)}")
        if "locations" in given:
            given["locations"] = tuple(given["locations"])
        self.config = FlexDNNConfig(**given)  # its own checks, now rather than after training
        f = calibration_fraction
        if isinstance(f, bool) or not isinstance(f, (int, float)) or not 0.0 <= f < 1.0:
            raise ExitError(f"`calibration_fraction` must be in [0, 1), got {f!r}. HINT: 0.5 holds out half of the "
                            "validation images to fit the thresholds; 0 uses them all for both")
        self.dirpath, self.attr, self.calibration_fraction = dirpath, attr, float(f)
        self.result: FlexDNNResult | None = None

    def output_dir(self, trainer: pl.Trainer) -> Path:
        return Path(self.dirpath if self.dirpath is not None else Path(trainer.default_root_dir) / "flexdnn")

    def _splits(self, val: Any) -> tuple[Any, Any]:
        """Planning and calibration loaders: one seeded draw of the validation images, disjoint."""
        dataset = getattr(val, "dataset", None)
        if self.calibration_fraction == 0 or dataset is None:
            return val, None
        n = len(dataset)
        n_cal = int(round(n * self.calibration_fraction))
        folds = max(self.config.calibration_folds, 1)
        if n_cal < folds or n - n_cal < 1:
            rank_zero_info(f"FlexDNNExits: {n} validation images are too few to hold {self.calibration_fraction} "
                           f"of them out for calibration ({folds} folds); planning and calibrating on all of them")
            return val, None
        order = torch.randperm(n, generator=torch.Generator().manual_seed(self.config.seed)).tolist()
        size = val.batch_size or 1
        return (DataLoader(Subset(dataset, order[: n - n_cal]), batch_size=size),
                DataLoader(Subset(dataset, order[n - n_cal:]), batch_size=size))

    @override
    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.is_global_zero:
            return
        net = getattr(pl_module, self.attr, None)
        if not isinstance(net, nn.Module):
            raise ExitError(f"`attr`={self.attr!r}: {type(pl_module).__name__} has no nn.Module attribute "
                            f"{self.attr!r}. HINT: pass the attribute that holds the trained classifier")
        train, val = _loader(trainer, "train"), _loader(trainer, "val")
        if val is None:
            raise ExitError("`FlexDNNExits` needs a validation loader (every search and plan decision is made on "
                            "it). HINT: give trainer.fit a val_dataloaders argument or a DataModule with one")
        backbone = copy.deepcopy(net).cpu().eval()  # flexdnn freezes its backbone; the module keeps training state
        x = next(iter(val))[0]
        input_shape = tuple(x.shape[1:])
        with torch.no_grad():
            num_classes = int(backbone(x[:1].cpu().float()).shape[-1])
        plan, calibration = self._splits(val)
        self.result = flexdnn(backbone, train, plan, self.config, num_classes=num_classes, input_shape=input_shape,
                              calibration_batches=calibration)
        self._save(self.result, self.output_dir(trainer))

    @staticmethod
    def _save(result: FlexDNNResult, out: Path) -> None:
        from safetensors.torch import save_file

        out.mkdir(parents=True, exist_ok=True)
        weights = out / "model.safetensors"
        if result.network is not None:
            tmp = out / "model.safetensors.tmp"  # written beside, then renamed: never half a file
            save_file({k: v.contiguous() for k, v in result.network.state_dict().items()}, str(tmp))
            tmp.replace(weights)
        elif weights.exists():
            weights.unlink()  # a previous run's exits do not belong to this spec
        write_json(out / "report.json", result.report)
        write_json(out / "spec.json", result.spec)
        kept = result.report["plan"]["kept_locations"]
        rank_zero_info(f"FlexDNNExits: {len(kept)} exits kept ({', '.join(kept) or 'none'}); wrote {out}")
