"""``BundleExporter``: write a deployment bundle when ``trainer.fit`` ends."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence

import pytorch_lightning as pl
from pytorch_lightning.callbacks import Callback
from pytorch_lightning.utilities import rank_zero_info
from torch import nn
from typing_extensions import override

from nestflex.export._program import ExportError
from nestflex.export.bundle import BUNDLE_SUFFIX, export_bundle
from nestflex.graph import DEFAULT_INPUT_SHAPE, input_shape_of

__all__ = ["BundleExporter", "bundle_arguments"]


def bundle_arguments(module: nn.Module, datamodule: Any = None, attr: str = "model") -> dict[str, Any]:
    """What :func:`export_bundle` needs from a LightningModule and its DataModule.

    The network is ``getattr(module, attr)``; a :class:`~nestflex.exits.MultiExitNetwork` gives
    its backbone as the model and itself as the exits. The input shape is the network's own when
    it states one (:func:`nestflex.graph.input_shape_of`). Normalisation and classes come from
    the DataModule's ``mean``/``std``/``classes`` when it has them.

    Raises:
        ExportError: ``module`` has no attribute ``attr`` holding an ``nn.Module``; a network
            traced at another per-sample shape than the DataModule's ``input_shape``.
    """
    net = getattr(module, attr, None)
    if not isinstance(net, nn.Module):
        raise ExportError(f"`attr`={attr!r}: {type(module).__name__} has no nn.Module attribute {attr!r}. HINT: pass "
                          f"the name of the attribute that holds the network (ImageClassifier and "
                          f"MultiExitClassifier use 'model')")
    kwargs: dict[str, Any] = {}
    if hasattr(net, "backbone") and hasattr(net, "exits") and hasattr(net, "points"):
        kwargs.update(model=net.backbone, exits=net, input_shape=tuple(net.input_shape))
    else:
        kwargs["model"] = net
        if getattr(net, "input_shape", None) is not None:  # e.g. ImageClassifier's network (input_shape_of)
            kwargs["input_shape"] = input_shape_of(net)
    for name in ("mean", "std", "classes"):
        value = getattr(datamodule, name, None)
        if value is not None:
            kwargs[name] = list(value)
    data_shape = getattr(datamodule, "input_shape", None)
    if data_shape is not None:
        data_shape = tuple(int(s) for s in data_shape)
        if kwargs.setdefault("input_shape", data_shape) != data_shape:
            raise ExportError(
                f"the network is traced at per-sample input_shape {kwargs['input_shape']}, but the DataModule's "
                f"samples are {data_shape}: the bundle would declare an input the model was not trained on. "
                f"HINT: build the module with `input_shape=datamodule.input_shape`"
            )
    return kwargs


class BundleExporter(Callback):
    """Export the trained network as a nestflex bundle at ``on_fit_end`` (rank zero).

    Args:
        dirpath: directory of the bundle (default: ``<trainer.default_root_dir>``).
        filename: bundle directory name (``.nfx`` appended when missing).
        attr: attribute of the LightningModule that holds the network.
        input_shape: per-sample input shape; default: the network's own (a MultiExitNetwork's,
            or an ``input_shape`` attribute as ImageClassifier's network has), else the
            DataModule's ``input_shape``, else ``(3, 32, 32)``.
        onnx: also write ONNX graphs.
        thresholds, confidence, fallback: exit policy stored with exits (see :func:`export_bundle`).

    Attributes:
        result: the sizes :func:`export_bundle` returned (``None`` before the export).

    Raises:
        ExportError: an empty ``filename`` or an unknown ``confidence``/``fallback`` (at construction).

    Example::

        trainer = Trainer(callbacks=[BundleExporter(dirpath="runs/x", filename="model.nfx")])
    """

    def __init__(
        self,
        dirpath: str | os.PathLike | None = None,
        filename: str = "model.nfx",
        attr: str = "model",
        input_shape: Sequence[int] | None = None,
        onnx: bool = True,
        thresholds: float | Sequence[float] | None = None,
        confidence: str = "max_prob",
        fallback: str = "most_confident",
    ) -> None:
        super().__init__()
        from nestflex.deploy.exits import FALLBACKS, list_confidences

        if not isinstance(filename, str) or not filename.strip() or "/" in filename:
            raise ExportError(f"`filename` must be a plain directory name such as 'model{BUNDLE_SUFFIX}', got {filename!r}")
        if confidence not in list_confidences():
            raise ExportError(f"`confidence` must be one of {', '.join(list_confidences())}, got {confidence!r}")
        if fallback not in FALLBACKS:
            raise ExportError(f"`fallback` must be one of {', '.join(FALLBACKS)}, got {fallback!r}")
        self.dirpath = dirpath
        self.filename = filename if filename.endswith(BUNDLE_SUFFIX) else filename + BUNDLE_SUFFIX
        self.attr, self.onnx = attr, onnx
        self.input_shape = tuple(int(s) for s in input_shape) if input_shape is not None else None
        self.thresholds, self.confidence, self.fallback = thresholds, confidence, fallback
        self.result: dict[str, Any] | None = None

    def bundle_path(self, trainer: pl.Trainer) -> Path:
        return Path(self.dirpath if self.dirpath is not None else trainer.default_root_dir) / self.filename

    @override
    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.is_global_zero:
            return
        kwargs = bundle_arguments(pl_module, getattr(trainer, "datamodule", None), self.attr)
        kwargs.setdefault("input_shape", self.input_shape or DEFAULT_INPUT_SHAPE)
        device = next(pl_module.parameters()).device
        pl_module.cpu()  # the bundle holds CPU tensors; the module goes back where it was
        try:
            self.result = export_bundle(self.bundle_path(trainer), onnx=self.onnx, thresholds=self.thresholds,
                                        confidence=self.confidence, fallback=self.fallback, **kwargs)
        finally:
            pl_module.to(device)
        rank_zero_info(f"BundleExporter: wrote {self.result['bundle']} ({self.result['bytes']:,} bytes)")
