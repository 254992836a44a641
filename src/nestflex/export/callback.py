"""``BundleExporter``: write a deployment bundle when ``trainer.fit`` ends."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping, Sequence

import pytorch_lightning as pl
from pytorch_lightning.callbacks import Callback
from pytorch_lightning.utilities import rank_zero_info, rank_zero_warn
import torch
from torch import nn
from typing_extensions import override

from nestflex._io import read_json
from nestflex._trainer import fit_loader, infer_input_shape, network_attr
from nestflex.export._program import ExportError
from nestflex.export.bundle import BUNDLE_SUFFIX, export_bundle
from nestflex.graph import input_shape_of

__all__ = ["BundleExporter", "bundle_arguments"]


def bundle_arguments(module: nn.Module, datamodule: Any = None, attr: str | None = "model") -> dict[str, Any]:
    """What :func:`export_bundle` needs from a LightningModule and its DataModule.

    The network is ``getattr(module, attr)`` (``None``: ``model``, else the module's one child
    with parameters); a :class:`~nestflex.exits.MultiExitNetwork` gives
    its backbone as the model and itself as the exits. The input shape is the network's own when
    it states one (:func:`nestflex.graph.input_shape_of`). Normalisation and classes come from
    the DataModule's ``mean``/``std``/``classes``/``input_scale`` when it has them.

    Raises:
        ExportError: ``module`` has no attribute ``attr`` holding an ``nn.Module``; a network
            traced at another per-sample shape than the DataModule's ``input_shape``.
    """
    net = getattr(module, network_attr(module, attr, ExportError, "BundleExporter"))
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
    if getattr(datamodule, "input_scale", None) is not None:  # nestflex's DataModules: 1/255
        kwargs["input_scale"] = float(datamodule.input_scale)
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


def _first_samples(batches: Any, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The first ``n`` (input, label) pairs of ``batches`` (or all of them, when fewer)."""
    xs, ys, have = [], [], 0
    for batch in batches:
        if not (isinstance(batch, (tuple, list)) and len(batch) >= 2):
            raise ExportError("BundleExporter: validation batches must be (inputs, labels) to ship samples. HINT: "
                              "pass samples=0")
        x, y = batch[0][: n - have], batch[1][: n - have]
        xs.append(x.detach().cpu())
        ys.append(y.detach().cpu())
        have += x.shape[0]
        if have >= n:
            break
    return torch.cat(xs), torch.cat(ys)


def _json_arg(arg: str, value: Any) -> Any:
    """A dict/list given inline, or read from a JSON file path."""
    if value is None or isinstance(value, (dict, list)):
        return value
    path = Path(value)
    if not path.is_file():
        raise ExportError(f"`{arg}`={str(value)!r} is not a file. HINT: pass the JSON file the producing stage wrote, "
                          f"or the dict itself")
    return read_json(path)


class BundleExporter(Callback):
    """Export the complete deployment bundle at ``on_fit_end`` (rank zero).

    The network is the module's ``attr``; everything else the bundle holds comes from the other
    nestflex callbacks of the same ``Trainer`` or from the files earlier runs wrote:

    * **levels**: a grown (nested) network is exported with all its levels, each profiled on the
      validation loader (accuracy, params, MACs, memory, batch-1 latency) unless ``levels`` gives
      the rows (e.g. the grow stage's test-split profile);
    * **progressive exits**: a :class:`~nestflex.exits.MultiExitNetwork` under ``attr`` (a
      :class:`~nestflex.exits.MultiExitClassifier`), or ``exits`` (the network, or a
      MultiExitClassifier checkpoint); calibrated on the validation loader unless
      ``calibration`` is given;
    * **FlexDNN exits**: a :class:`~nestflex.exits.flexdnn.FlexDNNExits` of the same Trainer (placed
      before this callback), or ``flex`` (its output directory); on a grown network they sit on
      the largest level and share its weights;
    * **profiles**: ``split_profile`` and ``precision_profile`` (the profilers' JSON, or paths).

    Args:
        dirpath: directory of the bundle (default: ``<trainer.default_root_dir>``).
        filename: bundle directory name (``.nfx`` appended when missing).
        attr: attribute of the LightningModule that holds the network; default ``model``
            (nestflex's modules), else the module's one child with parameters.
        input_shape: per-sample input shape; default: inferred from the module and the data
            (:func:`nestflex._trainer.infer_input_shape`).
        onnx: also write ONNX graphs.
        thresholds: per early exit, stored with the exits; ``None``: the calibration's lossless
            thresholds, which then ship with the policy they were fitted for (``confidence`` and
            ``fallback`` below then only set the calibration's sweep).
        confidence: the exit policy's confidence measure (see :func:`export_bundle`).
        fallback: the exit policy's fallback, ``most_confident`` or ``final``.
        exits: the progressive exits: a MultiExitNetwork, its LightningModule or a
            MultiExitClassifier checkpoint; ``None``: the module's own, when it is one.
        calibration: their calibration (:func:`~nestflex.exits.calibrate`'s report, or its JSON
            file); ``None``: calibrated here on the validation loader.
        flex: a :class:`~nestflex.exits.flexdnn.FlexDNNExits` output directory; ``None``: the
            FlexDNNExits of this Trainer, if any.
        levels: per-level profile rows (or their JSON file); ``None``: profiled here on the
            validation loader for a grown network.
        split_profile: the split quantisation profile (a dict or its JSON file).
        precision_profile: the per-layer precision profile (a dict or its JSON file).
        model_info: provenance stored as the manifest's ``model``; ``None``: the module's
            ``model_name`` and the DataModule's name.
        switching: measured level switches (``switching_table`` rows, or a JSON file of them), which
            the scheduler's simulation charges for a level change.
        model: the network whose levels the bundle holds, when it is not the module's ``attr``:
            e.g. the grown network while a :class:`~nestflex.exits.MultiExitClassifier` trains
            exits on its largest level (those exits then share its weights).
        profile_repeats: timed runs per level latency when levels are profiled here.
        samples: ship the first this many validation examples with their labels
            (``samples.safetensors``) for tuning on the device: int8 calibration and the accuracy
            check of execution plans (``nestflex tune``); 0: none. 512 CIFAR images are 6.3 MB.

    Attributes:
        result: the sizes :func:`export_bundle` returned (``None`` before the export).

    Raises:
        ExportError: bad arguments (at construction); a producing callback placed after this one
            (at setup); a missing file, or exits/levels that do not fit the network (at export).

    Example::

        # grow the levels and plan FlexDNN exits on the largest one
        Trainer(callbacks=[FreezeAndGrow("runs/x/pruning/roadmap.json"), FlexDNNExits(dirpath="runs/x/flexdnn")]
                ).fit(grown, datamodule=dm)
        # train progressive exits on the largest level; the bundle collects everything
        exits = MultiExitClassifier(backbone=extract_level(grown.model, 4), mode="exits_only")
        Trainer(callbacks=[OverthinkingSchedule(), BundleExporter(dirpath="runs/x", model=grown.model,
                                                                  flex="runs/x/flexdnn")]).fit(exits, datamodule=dm)
    """

    def __init__(
        self,
        dirpath: str | os.PathLike | None = None,
        filename: str = "model.nfx",
        attr: str | None = None,
        input_shape: Sequence[int] | None = None,
        onnx: bool = True,
        thresholds: float | Sequence[float] | None = None,
        confidence: str = "max_prob",
        fallback: str = "most_confident",
        exits: nn.Module | str | os.PathLike | None = None,
        calibration: Mapping[str, Any] | str | os.PathLike | None = None,
        flex: str | os.PathLike | None = None,
        levels: Sequence[Mapping[str, Any]] | str | os.PathLike | None = None,
        split_profile: Mapping[str, Any] | str | os.PathLike | None = None,
        precision_profile: Mapping[str, Any] | str | os.PathLike | None = None,
        model_info: Mapping[str, Any] | None = None,
        profile_repeats: int = 10,
        model: nn.Module | None = None,
        switching: Sequence[Mapping[str, Any]] | str | os.PathLike | None = None,
        samples: int = 512,
    ) -> None:
        super().__init__()
        from nestflex.deploy.exits import FALLBACKS, list_confidences

        if not isinstance(filename, str) or not filename.strip() or "/" in filename:
            raise ExportError(f"`filename` must be a plain directory name such as 'model{BUNDLE_SUFFIX}', got {filename!r}")
        if confidence not in list_confidences():
            raise ExportError(f"`confidence` must be one of {', '.join(list_confidences())}, got {confidence!r}")
        if fallback not in FALLBACKS:
            raise ExportError(f"`fallback` must be one of {', '.join(FALLBACKS)}, got {fallback!r}")
        if isinstance(profile_repeats, bool) or not isinstance(profile_repeats, int) or profile_repeats < 1:
            raise ExportError(f"`profile_repeats` must be an int >= 1, got {profile_repeats!r}")
        if isinstance(samples, bool) or not isinstance(samples, int) or samples < 0:
            raise ExportError(f"`samples` must be an int >= 0 (validation examples shipped for tuning; 0: none), got "
                              f"{samples!r}")
        if flex is not None and not Path(flex).is_dir():
            raise ExportError(f"`flex`={str(flex)!r} is not a directory. HINT: pass FlexDNNExits' output directory "
                              f"(spec.json, model.safetensors, report.json)")
        if exits is not None and not isinstance(exits, nn.Module) and not Path(exits).is_file():
            raise ExportError(f"`exits`={str(exits)!r} is neither a MultiExitNetwork nor a checkpoint file. HINT: pass "
                              f"the trained network (module.model) or the MultiExitClassifier checkpoint")
        self.dirpath = dirpath
        self.filename = filename if filename.endswith(BUNDLE_SUFFIX) else filename + BUNDLE_SUFFIX
        self.attr, self.onnx = attr, onnx
        self.input_shape = tuple(int(s) for s in input_shape) if input_shape is not None else None
        self.thresholds, self.confidence, self.fallback = thresholds, confidence, fallback
        self.exits, self.flex = exits, flex
        # JSON read now: a wrong path fails before training, not after it
        self.calibration = _json_arg("calibration", calibration)
        self.levels = _json_arg("levels", levels)
        self.switching = _json_arg("switching", switching)
        self.split_profile = _json_arg("split_profile", split_profile)
        self.precision_profile = _json_arg("precision_profile", precision_profile)
        self.model_info, self.profile_repeats, self.samples = model_info, profile_repeats, samples
        if model is not None and not isinstance(model, nn.Module):
            raise ExportError(f"`model` must be an nn.Module (the grown or plain network), got {type(model).__name__}")
        self.model = model
        self.result: dict[str, Any] | None = None

    def bundle_path(self, trainer: pl.Trainer) -> Path:
        return Path(self.dirpath if self.dirpath is not None else trainer.default_root_dir) / self.filename

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        from nestflex.capacity.callback import FreezeAndGrow
        from nestflex.exits.flexdnn.callback import FlexDNNExits

        mine = trainer.callbacks.index(self)
        late = [type(cb).__name__ for cb in trainer.callbacks[mine + 1:] if isinstance(cb, (FlexDNNExits, FreezeAndGrow))]
        if late:
            raise ExportError(f"BundleExporter comes before {', '.join(late)} in the Trainer's callbacks, so it would "
                              f"export before they finish. HINT: put BundleExporter last")

    @override
    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.is_global_zero:
            return
        device = next(pl_module.parameters()).device
        pl_module.cpu()  # the bundle holds CPU tensors; the module goes back where it was
        try:
            kwargs = self.collect(trainer, pl_module)
            self.result = export_bundle(self.bundle_path(trainer), onnx=self.onnx, **kwargs)
        finally:
            pl_module.to(device)
        rank_zero_info(f"BundleExporter: wrote {self.result['bundle']} ({self.result['bytes']:,} bytes)")

    def collect(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> dict[str, Any]:
        """The :func:`export_bundle` arguments for this run (pure routing to the producers)."""
        from nestflex.capacity import extract_level, is_nested, num_levels
        from nestflex.capacity.profile import profile_levels
        from nestflex.graph import checked_batches

        datamodule = getattr(trainer, "datamodule", None)
        kwargs = bundle_arguments(pl_module, datamodule, self.attr)
        if self.model is not None:  # e.g. the grown network, while the module trains its exits
            kwargs["model"] = self.model.cpu()
        kwargs["input_shape"] = infer_input_shape(trainer, pl_module, self.input_shape or kwargs.get("input_shape"),
                                                  "BundleExporter", network=kwargs["model"])
        model, shape = kwargs["model"], kwargs["input_shape"]
        val = fit_loader(trainer, "val", ExportError, "BundleExporter")
        nested = is_nested(model)
        largest = extract_level(model, num_levels(model) - 1) if nested else model
        if nested:
            kwargs["switching"] = self.switching
            if self.levels is not None:
                kwargs["levels"] = self.levels
            else:
                rows = profile_levels(model, val, batch_sizes=(1,), repeats=self.profile_repeats, input_shape=shape)
                kwargs["levels"] = rows
        exits = kwargs.get("exits") if self.exits is None else _exit_network(self.exits)
        if exits is not None:
            kwargs["exits"] = exits
            calibration = self.calibration
            if calibration is None:
                if val is None:
                    raise ExportError("BundleExporter needs a validation loader to calibrate the exits. HINT: give "
                                      "trainer.fit val_dataloaders, or pass `calibration=`")
                from nestflex.exits import calibrate

                calibration = calibrate(exits, checked_batches(val, shape, "BundleExporter"),
                                        confidence=self.confidence, fallback=self.fallback)
            kwargs["calibration"] = calibration
        policy = {"thresholds": self.thresholds, "confidence": self.confidence, "fallback": self.fallback}
        if kwargs.get("calibration") is not None and self.thresholds is None:
            # the lossless thresholds hold under their own policy: export_bundle ships it
            policy.update(confidence=None, fallback=None)
        kwargs.update(policy)
        kwargs.update(self._flex(trainer, largest))
        kwargs["split_profile"], kwargs["precision_profile"] = self.split_profile, self.precision_profile
        info = dict(self.model_info or {})
        if not info:
            name = getattr(getattr(pl_module, "hparams", {}), "get", lambda *_: None)("model_name")
            info = {"name": name or type(largest).__name__}
            if datamodule is not None and getattr(datamodule, "name", None):
                info.update(data=datamodule.name, synthetic=bool(getattr(datamodule, "synthetic", False)))
        kwargs["model_info"] = info
        if self.samples:
            if val is None:
                rank_zero_warn("BundleExporter: no validation loader, so the bundle ships no samples (`nestflex tune` "
                               "needs them for int8). HINT: give trainer.fit val_dataloaders, or samples=0")
            else:
                kwargs["samples"] = _first_samples(checked_batches(val, shape, "BundleExporter"), self.samples)
        return kwargs

    def _flex(self, trainer: pl.Trainer, largest: nn.Module) -> dict[str, Any]:
        """FlexDNN's planned exits: from a FlexDNNExits of this run, else from ``flex``'s files."""
        from nestflex.exits.flexdnn.callback import FlexDNNExits

        if self.flex is None:
            ran = [cb for cb in trainer.callbacks if isinstance(cb, FlexDNNExits)]
            result = ran[0].result if ran else None
            if result is None or result.network is None:
                return {}
            return {"flex_exits": result.network, "flex_spec": result.spec, "flex_report": result.report}
        from nestflex.exits import ExitError, load_flex_network

        root = Path(self.flex)
        missing = [f for f in ("spec.json", "report.json") if not (root / f).is_file()]
        if missing:
            raise ExportError(f"`flex`={str(root)!r} lacks {', '.join(missing)}. HINT: pass FlexDNNExits' output "
                              f"directory after its run finished")
        spec, report = read_json(root / "spec.json"), read_json(root / "report.json")
        if not spec.get("exits"):
            return {}  # the plan kept no exit: the backbone alone is cheapest
        try:
            net = load_flex_network(largest, root)
        except ExitError as e:
            raise ExportError(f"`flex`: {e}") from None
        return {"flex_exits": net, "flex_spec": spec, "flex_report": report}


def _exit_network(exits: nn.Module | str | os.PathLike) -> nn.Module:
    """A MultiExitNetwork given as itself, its LightningModule, or a MultiExitClassifier checkpoint."""
    if isinstance(exits, nn.Module):
        net = getattr(exits, "model", exits) if not hasattr(exits, "exits") else exits
    else:
        from nestflex.exits import MultiExitClassifier

        net = MultiExitClassifier.load_from_checkpoint(exits, map_location="cpu", weights_only=True).model
    if not (hasattr(net, "backbone") and hasattr(net, "exits")):
        raise ExportError(f"`exits` must be a MultiExitNetwork (or a MultiExitClassifier), got {type(net).__name__}")
    return net.cpu()
