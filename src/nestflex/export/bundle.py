"""Write a nestflex bundle: :func:`export_bundle`.

The bundle layout and the manifest are defined by the deploy side: the manifest is a
:class:`nestflex.deploy.bundle.manifest.Manifest` built here from typed records and written with
``to_json()``; before it is written it is read back with ``Manifest.from_json`` and the weights
file's header, the same call :func:`nestflex.deploy.load` makes, so a bundle that this writer
finishes is one the runtime reads (docs/deploy.md lists the keys). The bundle is built in a
temporary directory next to the target and moved into place with ``os.replace``, so a crash
leaves the previous bundle (or none), never a half-written one.
"""

from __future__ import annotations

import contextlib
import glob
import io
import json
import os
import re
import shutil
import tempfile
import time
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch
from torch import nn

from nestflex import __version__
from nestflex._io import atomic_write_bytes, write_json
from nestflex.capacity.nested import extract_level, is_nested, nested_modules, num_levels
from nestflex.deploy.bundle import program_records
from nestflex.deploy.bundle.capacity_records import Capacity, LevelRow
from nestflex.deploy.bundle.exit_records import ExitHead, ExitPlan, ExitSet, OperatingPoint
from nestflex.deploy.bundle.file_records import FileEntry, OnnxFile, SampleSet, TensorInfo, Weights
from nestflex.deploy.bundle.input_records import InputSpec
from nestflex.deploy.bundle.manifest import Manifest, Producer
from nestflex.deploy.bundle.quantization_records import PrecisionPlan, SplitQuantization
from nestflex.deploy.bundle.safetensors_header import read_safetensors_header
from nestflex.deploy.bundle.split_records import SplitPoint
from nestflex.deploy.bundle.loader import EXIT_SETS, file_digest
from nestflex.deploy.exits import FALLBACKS, check_thresholds, list_confidences
from nestflex.deploy.bundle.constants import FORMAT, MANIFEST, SAMPLES, SCHEMA_VERSION, WEIGHTS
from nestflex.deploy.bundle.errors import BundleError
from nestflex.deploy.bundle.manifest import manifest_digest
from nestflex.export._program import ExportError, Program, build_program
from nestflex.graph import trace

__all__ = ["ExportError", "export_bundle", "BUNDLE_SUFFIX"]

#: suffix of bundle directories, by convention
BUNDLE_SUFFIX = ".nfx"
_ONNX_OPSET = 17
#: per exit set: head tensor prefix, own-backbone tensor prefix, ONNX file prefix
_SET_NAMES = {"exits": ("exits.", "progressive.backbone.", ""),
              "flex_exits": ("flex_exits.", "flex.backbone.", "flex_")}


def _state_bytes(tensors: Mapping[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())


def _shared_backbone(exits: nn.Module, largest: nn.Module) -> bool:
    """Whether the exits' backbone holds exactly the largest level's tensors (same names, values)."""
    mine = {k: v for k, v in exits.backbone.state_dict().items() if not k.endswith("num_batches_tracked")}
    theirs = {k: v for k, v in largest.state_dict().items() if not k.endswith("num_batches_tracked")}
    return mine.keys() == theirs.keys() and all(
        mine[k].shape == theirs[k].shape and torch.equal(mine[k].cpu(), theirs[k].cpu()) for k in mine
    )


def _export_onnx(module: nn.Module, example: tuple[torch.Tensor, ...], path: Path, inputs: list[str],
                 outputs: list[str]) -> None:
    from torch import onnx  # training side only: the runtime never needs the exporter

    path.parent.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation notice, once per file
        # the TorchScript exporter: the dynamo one needs onnxscript, which the train extra does not pin
        onnx.export(module, example, buf, input_names=inputs, output_names=outputs, opset_version=_ONNX_OPSET,
                    dynamic_axes={n: {0: "batch"} for n in [*inputs, *outputs]}, dynamo=False)
    path.write_bytes(buf.getvalue())


def _plain_level_row(model: nn.Module, input_shape: tuple[int, ...]) -> dict[str, Any]:
    graph = trace(model, input_shape)
    return {"level": 0, "accuracy": None, "params": graph.params(), "macs": graph.macs(),
            "memory_mb": round(_state_bytes(model.state_dict()) / 1e6, 4), "latency_ms": None}


def _splits(graph, split_profile: Mapping[str, Any] | None) -> list[SplitPoint]:
    rows = {r["name"]: (i, r) for i, r in enumerate((split_profile or {}).get("splits", []))}
    out = []
    for s in graph.split_points:
        quantization = None
        if s.name in rows:
            i, row = rows[s.name]
            quantization = _record(SplitQuantization.from_profile, row, path=f"split_profile.splits[{i}]")
        out.append(SplitPoint(
            name=s.name, node=s.node, tensors=tuple((n, tuple(shape)) for n, shape in s.tensors), numel=s.numel,
            float32_bytes=s.numel * 4, macs_before=s.macs_before, macs_fraction=round(s.macs_fraction, 6),
            quantization=quantization))
    return out


def _record(read, obj: Any, **kwargs: Any) -> Any:
    """``read(obj, **kwargs)`` (a schema ``from_json``), its BundleError re-raised as an ExportError."""
    try:
        return read(obj, **kwargs)
    except BundleError as e:
        raise ExportError(f"{e} HINT: fix the argument; the bundle would not load with it") from None


def _json_value(arg: str, value: Any) -> Any:
    """``value`` as plain JSON (``None`` stays ``None``), or an ExportError naming ``arg``."""
    if value is None:
        return None
    try:
        return json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError) as e:
        raise ExportError(f"`{arg}` must hold JSON values only (str, number, bool, list, dict), got {value!r:.200}: "
                          f"{e}. HINT: convert tensors with .tolist()") from None


def export_bundle(
    path: str | os.PathLike,
    model: nn.Module,
    *,
    exits: nn.Module | None = None,
    levels: Sequence[Mapping[str, Any]] | None = None,
    input_shape: Sequence[int] = (3, 32, 32),
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
    input_scale: float | None = None,
    classes: Sequence[str] | None = None,
    thresholds: float | Sequence[float] | None = None,
    confidence: str | None = None,
    fallback: str | None = None,
    calibration: Mapping[str, Any] | None = None,
    split_profile: Mapping[str, Any] | None = None,
    precision_profile: Mapping[str, Any] | None = None,
    flex_exits: nn.Module | None = None,
    flex_spec: Mapping[str, Any] | None = None,
    flex_report: Mapping[str, Any] | None = None,
    model_info: Mapping[str, Any] | None = None,
    switching: Sequence[Mapping[str, Any]] | None = None,
    samples: tuple[torch.Tensor, torch.Tensor] | None = None,
    samples_split: str = "validation",
    onnx: bool = True,
    overwrite: bool = True,
) -> dict[str, Any]:
    """Write ``model`` (multi-capacity or plain) and optionally its exits as one bundle directory.

    Args:
        path: the bundle directory to write (``*.nfx`` by convention).
        model: a multi-capacity network (:func:`~nestflex.capacity.nest_`) or a plain one (one level).
        exits: a :class:`~nestflex.exits.MultiExitNetwork`. If its backbone equals the largest level
            (same tensors, e.g. heads trained ``exits_only`` on ``extract_level(model, K-1)``), only
            the heads are stored and its exit set (kind ``progressive``) says ``backbone: "shared"``;
            otherwise its backbone is stored as its own component (``"own"``).
        levels: per-level profile rows (:func:`~nestflex.capacity.profile.profile_levels`); if
            ``None``, params/MACs/memory are computed and accuracy/latency left ``None``. Each row
            is checked as the runtime will read it (:class:`~nestflex.deploy.bundle.capacity_records.LevelRow`:
            accuracy a fraction in [0, 1] or ``None``, finite numbers).
        input_shape: per-sample input shape.
        mean: per-channel mean the caller subtracts (recorded, not applied); with ``std``.
        std: per-channel standard deviation the caller divides by (recorded, not applied).
        input_scale: factor from the raw input to the range ``mean``/``std`` apply to (``1/255`` for
            8-bit images, as nestflex's DataModules read them); ``None`` when the data's own
            transforms define it. Recorded in ``input.scale`` and described in ``input.note``.
        classes: class names.
        thresholds: one per early exit (default: the lossless thresholds of ``calibration``, else 1.0).
        confidence: the confidence measure of the exit policy (:mod:`nestflex.deploy.exits`);
            default: the one ``calibration`` measured, else ``max_prob``.
        fallback: where a sample that passes no threshold is answered (``most_confident`` or
            ``final``). Default: the policy the shipped thresholds were fitted for: with the
            thresholds of ``calibration``, its lossless fallback (``final`` for
            :func:`~nestflex.exits.calibrate`'s); with your own ``thresholds``, ``calibration``'s
            sweep fallback (``most_confident`` by default); without a calibration,
            ``most_confident``.
        calibration: the exits calibration (:func:`~nestflex.exits.calibrate` output), shipped in
            ``profiles/exit_calibration.json``. Its lossless thresholds are lossless only under
            their own policy: a ``confidence`` or ``fallback`` that differs from it is refused
            unless ``thresholds`` are given too.
        split_profile: the split quantisation profile (the profiling stage's JSON), shipped in
            ``profiles/`` and read into the split points' records.
        precision_profile: the per-layer precision profile (JSON), shipped in ``profiles/``.
        flex_exits: FlexDNN's planned network (:func:`~nestflex.exits.flexdnn.flexdnn`,
            :func:`~nestflex.exits.flexdnn.load_flex_network`), a ``MultiExitNetwork`` of
            ``FilterSubsetExit`` heads: written as the exit set of kind ``flexdnn``, in the same
            layout as the ``progressive`` one (shared or own backbone, decided the same way).
        flex_spec: its spec (``FlexDNNResult.spec``, ``flex/spec.json``); required with
            ``flex_exits``: its ``thresholds``, ``confidence`` and ``fallback`` are the set's policy.
        flex_report: optional ``FlexDNNResult.report`` (``flex/report.json``): the plan and the
            operating points go into the manifest, with the spec in ``profiles/flexdnn_plan.json``.
        model_info: optional provenance, stored as ``manifest["model"]`` (JSON values only), e.g.
            ``{"name": "vgg16", "width": 0.25, "data": "synthetic", "synthetic": True}``: schedulers
            name apps after ``name`` and reports label figures from ``synthetic`` data as such.
        switching: optional measured level switches (the ``switching`` rows of
            :func:`~nestflex.capacity.profile.switching_table`), stored as ``manifest["switching"]``;
            the scheduler's simulation charges their ``nested_ms`` for a level change.
        samples: optional labelled inputs ``(inputs, labels)``, shipped in ``samples.safetensors``
            for tuning on the device: ``nestflex tune`` calibrates int8 execution on the first
            half and checks every candidate configuration's accuracy on the second. Inputs are
            prepared as the model takes them (``(N, *input_shape)``), labels class indices
            (``(N,)``). A few hundred suffice (512 float32 CIFAR images are 6.3 MB).
        samples_split: where ``samples`` come from, recorded in the manifest (use held-out data).
        onnx: also write ONNX graphs (levels, backbone stages, exit heads).
        overwrite: replace an existing bundle at ``path``.

    Returns:
        sizes: ``bundle``, ``bytes`` (all files), ``weights_bytes``, ``onnx_bytes``,
        ``metadata_bytes`` (manifest and profiles), ``samples_bytes`` (0 without ``samples``),
        ``largest_level_bytes``, ``exit_heads_bytes``,
        ``exits_backbone``, ``flex_exit_heads_bytes``, ``flex_exits_backbone``,
        ``flex_backbone_bytes`` (FlexDNN's own backbone, 0 when shared), ``flex_exits`` (early exits
        in the FlexDNN set, 0 without one) and ``files``.

    Raises:
        ExportError: bad arguments (also a level row, profile or plan the bundle schema refuses), a
            ``confidence`` or ``fallback`` other than the one ``calibration``'s thresholds were
            fitted for (without ``thresholds``), an existing bundle with ``overwrite=False``, or a
            layer the bundle program cannot express.

    Examples:
        >>> from nestflex.models import create_model
        >>> import tempfile, nestflex.deploy
        >>> d = tempfile.mkdtemp()
        >>> info = export_bundle(f"{d}/m.nfx", create_model("vgg11", width=0.125).eval(), onnx=False)
        >>> nestflex.deploy.load(info["bundle"]).num_levels
        1
    """
    target = Path(path)
    input_shape = tuple(int(s) for s in input_shape)
    if target.exists() and not overwrite:
        raise ExportError(f"`path` {str(target)!r} already exists. HINT: pass overwrite=True or choose another path")
    if target.exists() and not (target / MANIFEST).exists():
        raise ExportError(f"`path` {str(target)!r} exists and is not a bundle; refusing to replace it. HINT: choose "
                          f"another path (bundles are directories ending in {BUNDLE_SUFFIX})")
    if (mean is None) != (std is None) or (mean is not None and (len(mean) != input_shape[0] or len(std) != input_shape[0])):
        raise ExportError(f"`mean` and `std` must both be given with one value per input channel ({input_shape[0]}), "
                          f"got {mean!r} and {std!r}")
    if input_scale is not None and (isinstance(input_scale, bool) or not isinstance(input_scale, (int, float))
                                    or not 0 < input_scale < float("inf")):
        raise ExportError(f"`input_scale` must be a finite number > 0 or None, got {input_scale!r}. HINT: 1/255 for "
                          f"8-bit images scaled to [0, 1] before mean/std")
    if confidence is not None and confidence not in list_confidences():
        raise ExportError(f"`confidence` must be a registered name ({', '.join(list_confidences())}), got {confidence!r}")
    if fallback is not None and fallback not in FALLBACKS:
        raise ExportError(f"`fallback` must be one of {', '.join(FALLBACKS)}, got {fallback!r}")
    thresholds, confidence, fallback = _exit_policy(thresholds, confidence, fallback, calibration)
    if confidence not in list_confidences():  # taken from `calibration`: a measure passed as a function
        raise ExportError(f"`calibration` was measured with the confidence {confidence!r}, which is not a registered "
                          f"measure, so the runtime could not compute it. HINT: register it with "
                          f"nestflex.exits.register_confidence(name) and calibrate with its name")

    for arg, net in (("exits", exits), ("flex_exits", flex_exits)):
        if net is not None and is_nested(getattr(net, "backbone", net)):
            raise ExportError(
                f"`{arg}` sits on a nested (multi-capacity) backbone; the bundle stores exits on plain networks. HINT: "
                f"build the exits on `extract_level(model, num_levels(model) - 1)` (FlexDNNExits does so for a grown "
                f"network): sharing the largest level, the bundle stores its weights once"
            )
    model_info, switching = _json_value("model_info", model_info), _json_value("switching", switching)
    samples = _samples(samples, input_shape, len(classes) if classes is not None else None)
    flex_policy = _flex_policy(flex_exits, flex_spec, flex_report)

    nets = [m for m in (model, exits, flex_exits) if m is not None]
    was_training = [m.training for m in nets]
    for m in nets:
        m.eval()  # eval mode: BatchNorm running statistics, dropout (ranked dropout too) is identity
    try:
        return _write(target, model, exits, levels, input_shape, mean, std, classes, thresholds, confidence, fallback,
                      calibration, split_profile, precision_profile, onnx, flex_exits, flex_policy,
                      provenance={"model": model_info, "switching": switching}, input_scale=input_scale,
                      samples=samples, samples_split=samples_split)
    finally:
        for m, was in zip(nets, was_training):
            m.train(was)


def _exit_policy(
    thresholds: float | Sequence[float] | None,
    confidence: str | None,
    fallback: str | None,
    calibration: Mapping[str, Any] | None,
) -> tuple[float | Sequence[float], str, str]:
    """The exit policy a bundle ships: thresholds with the confidence and fallback they hold under.

    Lossless thresholds (:func:`~nestflex.exits.calibrate`'s ``lossless``) lose no accuracy
    against the final exit only under the policy they were fitted with: a bundle that paired
    them with another fallback would be silently lossy. So without ``thresholds``, the
    calibration's policy is taken, and another one given explicitly is refused.

    Args:
        thresholds: one per early exit, or one for all; ``None``: ``calibration``'s lossless
            thresholds (1.0, no early exit, without a calibration).
        confidence: the confidence measure; ``None``: ``calibration``'s, else ``max_prob``.
        fallback: ``most_confident`` or ``final``; ``None``: the one the thresholds were fitted
            for (``calibration``'s lossless fallback, or its sweep's for thresholds of your own),
            else ``most_confident``.
        calibration: :func:`~nestflex.exits.calibrate`'s report, or ``None``.

    Returns:
        ``(thresholds, confidence, fallback)``.

    Raises:
        ExportError: ``confidence`` or ``fallback`` given, without ``thresholds``, and different
            from the policy of ``calibration``'s lossless thresholds.

    Examples:
        >>> report = {"confidence": "max_prob", "fallback": "most_confident",
        ...           "lossless": {"thresholds": [0.9, 0.8], "fallback": "final"}}
        >>> _exit_policy(None, None, None, report)
        ([0.9, 0.8], 'max_prob', 'final')
        >>> _exit_policy([0.5, 0.5], None, None, report)
        ([0.5, 0.5], 'max_prob', 'most_confident')
    """
    cal = dict(calibration or {})
    lossless = dict(cal.get("lossless") or {})
    measured = cal.get("confidence")
    if thresholds is not None or "thresholds" not in lossless:  # thresholds of the user's own (or none at all)
        return (1.0 if thresholds is None else thresholds, confidence or measured or "max_prob",
                fallback or cal.get("fallback") or "most_confident")
    fitted = {"confidence": measured, "fallback": lossless.get("fallback")}
    for arg, given in (("confidence", confidence), ("fallback", fallback)):
        if given is not None and fitted[arg] is not None and given != fitted[arg]:
            raise ExportError(
                f"`{arg}`={given!r}, but the thresholds come from `calibration`, whose lossless thresholds were "
                f"fitted for {arg}={fitted[arg]!r}: with {given!r} the bundle would lose accuracy against the final "
                f"exit without saying so. HINT: leave `{arg}` out (the bundle then ships {fitted[arg]!r}), pass "
                f"`thresholds=` too to ship a policy of your own, or recalibrate for {given!r}")
    return (lossless["thresholds"], confidence or measured or "max_prob",
            fallback or fitted["fallback"] or "most_confident")


def _samples(samples: Any, input_shape: tuple[int, ...], num_classes: int | None):
    """``samples`` as contiguous (float32 inputs, int64 labels), checked; ``None`` stays ``None``."""
    if samples is None:
        return None
    if not (isinstance(samples, (tuple, list)) and len(samples) == 2
            and all(isinstance(t, torch.Tensor) for t in samples)):
        raise ExportError(f"`samples` must be a pair of tensors (inputs, labels), got {type(samples).__name__}. HINT: "
                          f"samples=(x, y) with x of shape (N, {', '.join(map(str, input_shape))})")
    x, y = samples
    if tuple(x.shape[1:]) != input_shape or x.shape[0] < 1 or not x.is_floating_point():
        raise ExportError(f"`samples` inputs must be a float tensor of shape (N >= 1, {', '.join(map(str, input_shape))}) "
                          f"(the model's input_shape), got {x.dtype} {tuple(x.shape)}")
    if tuple(y.shape) != (x.shape[0],) or y.is_floating_point() or y.is_complex():
        raise ExportError(f"`samples` labels must be an integer tensor of shape ({x.shape[0]},), one class index per "
                          f"input, got {y.dtype} {tuple(y.shape)}")
    if not torch.isfinite(x).all():
        raise ExportError("`samples` inputs hold NaN or inf values. HINT: pass the prepared inputs the model takes")
    if int(y.min()) < 0 or (num_classes is not None and int(y.max()) >= num_classes):
        raise ExportError(f"`samples` labels must be class indices in [0, {num_classes if num_classes else 'C'}), "
                          f"got values in [{int(y.min())}, {int(y.max())}]")
    return x.detach().to("cpu", torch.float32).contiguous(), y.detach().to("cpu", torch.int64).contiguous()


def _input_note(scale: float | None, normalised: bool) -> str:
    """How a caller prepares one sample, in words (the manifest's ``input.note``)."""
    steps = " - mean) / std" if normalised else ""
    if scale is not None:
        raw = f"raw * {scale:.6g}"
        return f"the caller normalises: x = ({raw}{steps}" if normalised else f"the caller scales: x = {raw}"
    if normalised:
        return ("the caller normalises: x = (v - mean) / std, where v is the input as the training data's own "
                "transforms produced it before normalisation")
    return "the caller feeds the input as the training data's own transforms produced it"


def _flex_policy(flex_exits, spec, report) -> dict[str, Any] | None:
    """The FlexDNN set's policy and plan from its spec/report, checked against the network."""
    if flex_exits is None:
        if spec is not None or report is not None:
            raise ExportError("`flex_spec`/`flex_report` were given without `flex_exits`. HINT: pass the FlexDNN "
                              "network too (build_flex_network(backbone, spec) with its state dict loaded)")
        return None
    if spec is None:
        raise ExportError("`flex_exits` needs `flex_spec` (the FlexDNN spec: thresholds, confidence, fallback). "
                          "HINT: pass FlexDNNResult.spec, or read_json('flex/spec.json') of the recipe")
    planned = len(spec.get("exits") or [])
    have = len(getattr(flex_exits, "exits", []))
    if planned != have:
        raise ExportError(f"`flex_spec` plans {planned} exits but `flex_exits` has {have}. HINT: pass the spec the "
                          f"network was built from (build_flex_network(backbone, spec))")
    for key, valid in (("confidence", list_confidences()), ("fallback", FALLBACKS)):
        if spec.get(key, "final") not in valid:
            raise ExportError(f"`flex_spec[{key!r}]` must be one of {', '.join(valid)}, got {spec.get(key)!r}")
    policy: dict[str, Any] = {"thresholds": spec.get("thresholds"), "confidence": spec["confidence"],
                              "fallback": spec.get("fallback", "final"), "spec": dict(spec)}
    if report is not None:
        plan = report.get("plan", {})
        policy["plan"] = {"split": "validation", **{k: plan.get(k) for k in (
            "kept_locations", "thresholds", "accuracy", "mean_macs", "mean_macs_fraction")}}
        policy["operating_points"] = list(report.get("profile", {}).get("operating_points", []))
        cal = report.get("calibration")
        if cal:  # where the shipped thresholds and the operating points were measured
            policy["calibration"] = {k: cal.get(k) for k in (
                "split", "samples", "folds", "accuracy", "mean_macs_fraction") if k in cal}
    return policy


def _write(target: Path, model, exits, levels, input_shape, mean, std, classes, thresholds, confidence, fallback,
           calibration, split_profile, precision_profile, onnx, flex_exits, flex_policy,
           provenance: Mapping[str, Any], input_scale: float | None = None,
           samples: tuple[torch.Tensor, torch.Tensor] | None = None, samples_split: str = "validation") -> dict[str, Any]:
    nested = is_nested(model)
    K = num_levels(model) if nested else 1
    largest = extract_level(model, K - 1) if nested else model
    largest.eval()
    backbone = build_program(largest, "backbone.", nested=model if nested else None, num_levels=K)
    tensors: dict[str, torch.Tensor] = dict(backbone.tensors)
    level_bytes = [sum(_region_bytes(backbone, n, k) for n in backbone.tensors) for k in range(K)]

    rows = [dict(r) for r in levels] if levels is not None else None
    if rows is None:
        if nested:
            from nestflex.capacity.profile import profile_levels

            rows = profile_levels(model, None, batch_sizes=(), repeats=1, input_shape=input_shape)
            for r in rows:
                r["latency_ms"] = None
        else:
            rows = [_plain_level_row(model, input_shape)]
    if len(rows) != K or [r.get("level") for r in rows] != list(range(K)):
        raise ExportError(f"`levels` must hold one profile row per level 0..{K - 1} in order, got levels "
                          f"{[r.get('level') for r in rows]}. HINT: pass profile_levels(model, ...) of this model")
    widths = [{} for _ in range(K)]
    if nested:
        for name, m in nested_modules(model):
            if not hasattr(m, "levels"):  # convs and linears: their output width per level
                for k in range(K):
                    widths[k][name] = int(m.nest_out[k])
    else:
        for name, m in model.named_modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                widths[0][name] = int(m.weight.shape[0])
    level_rows = tuple(_record(LevelRow.from_json, {**r, "widths": widths[k], "weight_bytes": level_bytes[k]},
                               path=f"levels[{k}]", index=k) for k, r in enumerate(rows))
    capacity = Capacity(
        nested=nested, num_levels=K, level_bytes=tuple(level_bytes), largest_level_bytes=level_bytes[-1],
        program=program_records.Program.from_json(backbone.nodes, path="capacity.program"),
        regions={n: tuple(None if r is None else tuple(r) for r in per) for n, per in backbone.regions.items()})

    graph = trace(largest, input_shape)
    exit_sets: list[ExitSet] = []
    heads_bytes = flex_heads_bytes = 0
    if exits is not None:
        entry, head_tensors = _exit_set("exits", exits, largest, K, thresholds, confidence, fallback,
                                        calibration=None if calibration is None else _calibration_summary(calibration))
        heads_bytes = _state_bytes({k: v for k, v in head_tensors.items() if k.startswith("exits.")})
        tensors.update(head_tensors)
        exit_sets.append(entry)
    if flex_exits is not None:
        points = flex_policy.get("operating_points")
        entry, head_tensors = _exit_set(
            "flex_exits", flex_exits, largest, K, flex_policy["thresholds"], flex_policy["confidence"],
            flex_policy["fallback"], profile="profiles/flexdnn_plan.json", calibration=flex_policy.get("calibration"),
            plan=None if "plan" not in flex_policy else _record(ExitPlan.from_json, flex_policy["plan"],
                                                                path="flex_report.plan"),
            operating_points=None if points is None else tuple(
                _record(OperatingPoint.from_json, pt, path=f"flex_report.profile.operating_points[{i}]")
                for i, pt in enumerate(points)))
        flex_heads_bytes = _state_bytes({k: v for k, v in head_tensors.items() if k.startswith("flex_exits.")})
        tensors.update(head_tensors)
        exit_sets.append(entry)

    spec = Manifest(
        producer=Producer("nestflex", __version__, torch.__version__),
        input=InputSpec(shape=input_shape, dtype="float32", layout="NCHW",
                          mean=tuple(map(float, mean)) if mean is not None else None,
                          std=tuple(map(float, std)) if std is not None else None,
                          note=_input_note(input_scale, mean is not None),
                          scale=None if input_scale is None else float(input_scale)),
        num_classes=int(graph.gm(torch.zeros(1, *input_shape)).shape[-1]) if classes is None else len(classes),
        classes=tuple(str(c) for c in classes) if classes is not None else None,
        levels=level_rows,
        model=provenance["model"],  # "model", "switching": plain JSON, checked by export_bundle
        switching=None if provenance["switching"] is None else tuple(provenance["switching"]),
        capacity=capacity,
        exit_sets=tuple(exit_sets),
        splits=tuple(_splits(graph, split_profile)),
        precision=None if precision_profile is None else _record(
            PrecisionPlan.from_profile, precision_profile, file="profiles/layer_precision.json"),
        weights=Weights({n: TensorInfo(tuple(t.shape), str(t.dtype).removeprefix("torch."))
                           for n, t in tensors.items()}),
        samples=None if samples is None else SampleSet(SAMPLES, int(samples[0].shape[0]), str(samples_split)),
        created_unix=int(time.time()),
    )
    if samples is not None and int(samples[1].max()) >= spec.num_classes:
        raise ExportError(f"`samples` labels must be class indices in [0, {spec.num_classes - 1}], got "
                          f"{int(samples[1].max())}. HINT: pass the labels the model was trained on")

    target.parent.mkdir(parents=True, exist_ok=True)
    # the pid in the name lets a later export tell a dead writer's leftovers from a live one's
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.{os.getpid()}.", suffix=".tmp"))
    _WRITING.add(tmp)
    try:
        from safetensors.torch import save_file

        save_file(tensors, str(tmp / WEIGHTS), metadata={"format": FORMAT, "schema_version": str(SCHEMA_VERSION)})
        if samples is not None:
            save_file({"inputs": samples[0], "labels": samples[1]}, str(tmp / SAMPLES), metadata={"format": FORMAT})
        flex_plan = None if flex_policy is None else {
            "spec": flex_policy["spec"],
            **{k: flex_policy[k] for k in ("plan", "operating_points", "calibration") if k in flex_policy}}
        profiles = {}
        for name, obj in (("split_quantization", split_profile), ("layer_precision", precision_profile),
                          ("exit_calibration", calibration), ("flexdnn_plan", flex_plan)):
            if obj is not None:
                write_json(tmp / "profiles" / f"{name}.json", obj)
                profiles[name] = f"profiles/{name}.json"
        onnx_files: list[OnnxFile] = []
        if onnx:
            sets = [(k, net) for k, net in (("exits", exits), ("flex_exits", flex_exits)) if net is not None]
            onnx_files = [OnnxFile.from_json(e, path=f"onnx[{i}]")
                          for i, e in enumerate(_write_onnx(tmp, model, largest, sets, K, input_shape, nested))]
        files = sorted(p for p in tmp.rglob("*") if p.is_file())
        spec = replace(spec, profiles=profiles, onnx=tuple(onnx_files), files={
            p.relative_to(tmp).as_posix(): FileEntry(p.stat().st_size, file_digest(p)) for p in files})
        spec = replace(spec, integrity={"manifest_sha256": manifest_digest(spec.to_json())})
        manifest = spec.to_json()
        try:  # what load() will do: the writer and the reader agree, or nothing is written
            Manifest.from_json(manifest, weights_header=read_safetensors_header(tmp / WEIGHTS),
                                 where=f"export to {str(target)!r}")
        except BundleError as e:
            raise ExportError(f"{e} (the exporter produced a manifest its own schema refuses: a nestflex bug, or an "
                              f"argument export_bundle does not check yet)") from None
        # compact JSON: the programs make an indented manifest ~1.5x larger; `nestflex inspect`
        # (or `python -m json.tool`) shows it readably
        text = json.dumps(manifest, separators=(",", ":"), allow_nan=False) + "\n"
        atomic_write_bytes(tmp / MANIFEST, text.encode("utf-8"))
        os.chmod(tmp, 0o755)  # mkdtemp makes 0700; a bundle should read like any other directory
        _move_into_place(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        _WRITING.discard(tmp)
    sizes = {p: m.bytes for p, m in spec.files.items()}
    onnx_bytes = sum(b for p, b in sizes.items() if p.startswith("onnx/"))
    weights_bytes, samples_bytes = sizes[WEIGHTS], sizes.get(SAMPLES, 0)
    total = sum(sizes.values()) + (target / MANIFEST).stat().st_size
    progressive, flex = spec.exit_set("progressive"), spec.exit_set("flexdnn")
    return {"bundle": str(target), "bytes": total, "weights_bytes": weights_bytes, "onnx_bytes": onnx_bytes,
            "metadata_bytes": total - weights_bytes - onnx_bytes - samples_bytes, "samples_bytes": samples_bytes,
            "largest_level_bytes": level_bytes[-1],
            "exit_heads_bytes": heads_bytes, "exits_backbone": progressive.backbone if progressive else None,
            "flex_exit_heads_bytes": flex_heads_bytes,
            "flex_exits_backbone": flex.backbone if flex else None,
            "flex_backbone_bytes": _state_bytes({k: v for k, v in tensors.items() if k.startswith("flex.backbone.")}),
            "flex_exits": len(flex.heads) if flex else 0,
            "levels": K, "files": len(sizes) + 1}


#: the temporary and set-aside directories this process is writing or moving right now
_WRITING: set[Path] = set()


def _move_into_place(tmp: Path, target: Path) -> None:
    """``os.replace`` cannot replace a non-empty directory: move the old bundle aside first.

    A process killed between the two renames leaves no bundle at ``target`` and the previous one,
    whole, at ``.NAME.old-PID-N`` (``load``'s error says so); killed before them, the previous
    bundle untouched and a ``.NAME.PID.*.tmp`` directory. The next export that succeeds removes
    both kinds of leftovers of writers that are no longer running.
    """
    old = None
    if target.exists():
        old = target.with_name(f".{target.name}.old-{os.getpid()}-{time.monotonic_ns()}")
        _WRITING.add(old)
        os.replace(target, old)
    try:
        os.replace(tmp, target)
    except BaseException:
        if old is not None:
            os.replace(old, target)  # put the previous bundle back
        raise
    finally:
        _WRITING.discard(old)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    _remove_stale(target)


def _remove_stale(target: Path) -> None:
    """Remove the temporary and set-aside directories that killed exports to ``target`` left."""
    pattern = re.compile(rf"\.{re.escape(target.name)}\.(?:(\d+)\..+\.tmp|old-(\d+)-\d+)")
    for p in target.parent.glob(f".{glob.escape(target.name)}.*"):
        m = pattern.fullmatch(p.name)
        if m is None or not p.is_dir() or p.is_symlink():
            continue
        pid = int(m.group(1) or m.group(2))
        if p in _WRITING or (pid != os.getpid() and _alive(pid)):  # a writer still at work on it
            continue
        shutil.rmtree(p, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: it exists, under another user
        return True
    return True


def _region_bytes(prog: Program, name: str, level: int) -> int:
    t = prog.tensors[name]
    regions = prog.regions.get(name)
    if regions is None:
        return t.numel() * t.element_size()
    shape = regions[level]
    if shape is None:
        return 0
    n = 1
    for s in shape:
        n *= s
    return n * t.element_size()


def _exit_set(key, exits, largest, K, thresholds, confidence, fallback, **extra: Any
              ) -> tuple[ExitSet, dict[str, torch.Tensor]]:
    """The manifest record of one exit set (``exits`` or ``flex_exits``: same layout) and its tensors.

    ``extra``: the set's optional fields (``calibration``, ``plan``, ``operating_points``, ``profile``).
    """
    arg = "exits" if key == "exits" else "flex_exits"
    for attr in ("backbone", "exits", "points", "stages"):
        if not hasattr(exits, attr):
            raise ExportError(f"`{arg}` must be a nestflex.exits.MultiExitNetwork, got {type(exits).__name__} "
                              f"(no `{attr}`)")
    head_prefix, backbone_prefix, _ = _SET_NAMES[key]
    num_early = len(exits.exits)
    try:
        thr = check_thresholds(thresholds, num_early)
    except Exception as e:  # ExitError: re-raise as an export problem, same message
        raise ExportError(f"`{arg}`: {e}") from None
    shared = _shared_backbone(exits, largest)
    tensors: dict[str, torch.Tensor] = {}
    program = None
    if shared:
        program_nodes = {n["name"] for n in build_program(largest, "backbone.").nodes}
    else:
        own = build_program(exits.backbone, backbone_prefix)
        tensors.update(own.tensors)
        program = program_records.Program.from_json(own.nodes, path=f"{arg}.program")
        program_nodes = {n["name"] for n in own.nodes}
    taps = tuple(p.node for p in exits.points)
    missing = [t for t in taps if t not in program_nodes]
    if missing:
        raise ExportError(f"exit taps {missing} are not nodes of the backbone program. HINT: trace names differ "
                          f"between the exit network's backbone and the exported model; rebuild the exits on it")
    heads = []
    for k, head in enumerate(exits.exits):
        prog = build_program(head, f"{head_prefix}{k}.")
        tensors.update(prog.tensors)
        flex: dict[str, Any] = {}
        index = getattr(head, "index", None)
        if isinstance(index, torch.Tensor):  # a fine-grained (FlexDNN) exit: which filters feed it
            tap = exits.points[k]
            inner = getattr(head, "head", None)
            flex = {"tap_channels": int(next(shape for name, shape in tap.tensors if name == tap.node)[0]),
                    "filters": tuple(int(i) for i in index.tolist()),
                    "widths": tuple(int(w) for w in getattr(inner, "widths", [])),
                    "stem_pool": int(getattr(inner, "stem_pool", 1))}  # the factor its input is pooled by first
        heads.append(ExitHead(name=exits.exit_names[k], program=program_records.Program.from_json(
            prog.nodes, path=f"{arg}.heads[{k}].program"), **flex))
    entry = ExitSet(
        kind=EXIT_SETS[key],
        backbone="shared" if shared else "own",
        level=K - 1 if shared else None,
        note=("heads sit on the multi-capacity backbone's largest level (weights stored once)" if shared else
              "this exit network's backbone differs from the largest level (joint training, no grow stage, or "
              f"another base model): stored as its own component under {backbone_prefix}*"),
        names=tuple(exits.exit_names),
        positions=tuple(round(float(p), 6) for p in exits.positions),
        macs=tuple(int(m) for m in exits.exit_macs),
        backbone_macs=int(exits.backbone_macs),
        thresholds=tuple(thr),
        confidence=confidence,
        fallback=fallback,
        program=program,
        taps=taps,
        heads=tuple(heads),
        **extra,
    )
    return entry, tensors


def _calibration_summary(calibration: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "file": "profiles/exit_calibration.json", "split": calibration.get("split"),
        "samples": calibration.get("samples"), "final_accuracy": calibration.get("final_accuracy"),
        "lossless": {k: calibration.get("lossless", {}).get(k) for k in ("thresholds", "fallback", "accuracy",
                                                                           "mean_macs_fraction", "exit_rate")},
        "exits": calibration.get("exits"),
    }


def _write_onnx(root: Path, model, largest, exit_sets, K, input_shape, nested) -> list[dict[str, Any]]:
    """torch.onnx graphs of every level and exit set, as the manifest's ``onnx`` entries.

    A level or exit set that torch.onnx cannot export (an operator it has no ONNX form for, such as
    an adaptive pool whose output size does not divide its input: SDN heads on a 7x7 map) ships no
    file, with a warning: the device writes that graph from the bundle's op program instead
    (``nestflex.deploy.backends.graphs``), which covers those operators. An exit set ships all of
    its files or none, since the runtime uses shipped stage and head files only as a whole set.
    """
    from torch.onnx import OnnxExporterError

    entries = []
    x = torch.zeros(2, *input_shape)
    for k in range(K):
        plain = extract_level(model, k).eval() if nested else largest
        rel = f"onnx/level_{k}.onnx"
        try:
            _export_onnx(plain, (x,), root / rel, ["input"], ["logits"])
        except OnnxExporterError as err:
            _skip_onnx(root, [rel], f"level {k}", err)
            continue
        entries.append({"file": rel, "kind": "level", "level": k, "inputs": [["input", list(input_shape)]],
                        "outputs": [["logits", None]]})
    for key, exits in exit_sets:  # every exit set alike: its backbone cut at the taps, one file per head
        files = _SET_NAMES[key][2]
        state: tuple[torch.Tensor, ...] = (x,)
        written: list[dict[str, Any]] = []
        try:
            with torch.no_grad():
                for k, stage in enumerate(exits.stages):
                    ins = ["input"] if k == 0 else [f"in_{i}" for i in range(len(state))]
                    in_shapes = [list(t.shape[1:]) for t in state]
                    out = stage(*state)
                    out = out if isinstance(out, tuple) else (out,)
                    outs = [f"out_{i}" for i in range(len(out))] if k < len(exits.exits) else ["logits"]
                    rel = f"onnx/{files}stage_{k}.onnx"
                    written.append({"file": rel, "kind": "stage", "exit_set": EXIT_SETS[key], "stage": k,
                                    "inputs": [list(p) for p in zip(ins, in_shapes)],
                                    "outputs": [[n, list(t.shape[1:])] for n, t in zip(outs, out)],
                                    "tap_output": exits._taps[k] if k < len(exits.exits) else None})
                    _export_onnx(stage, state, root / rel, ins, outs)
                    if k < len(exits.exits):
                        tap = out[exits._taps[k]]
                        rel = f"onnx/{files}exit_{k}.onnx"
                        written.append({"file": rel, "kind": "exit", "exit_set": EXIT_SETS[key], "exit": k,
                                        "inputs": [["features", list(tap.shape[1:])]], "outputs": [["logits", None]]})
                        _export_onnx(exits.exits[k], (tap,), root / rel, ["features"], ["logits"])
                    state = out
        except OnnxExporterError as err:
            _skip_onnx(root, [e["file"] for e in written], f"the {EXIT_SETS[key]} exit set", err)
            continue
        entries.extend(written)
    return entries


def _skip_onnx(root: Path, files: list[str], what: str, err: Exception) -> None:
    for rel in files:
        (root / rel).unlink(missing_ok=True)
    first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    warnings.warn(f"export_bundle: torch.onnx cannot export {what} ({first[:200]}); the bundle ships no ONNX file "
                  f"for it and the device writes its graph from the bundle's program (nestflex.deploy), which "
                  f"gives the same outputs", stacklevel=3)
