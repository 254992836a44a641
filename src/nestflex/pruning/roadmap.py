"""The filter pruning roadmap (NestDNN): every footprint from the vanilla model to the seed.

``roadmap.json`` is plain data a person can read and the freeze-&-grow stage replays backwards.
Channel indices are always in the *original* (unpruned) indexing, so any footprint can be
rebuilt from a fresh model with :func:`apply_footprint`. Group names are relative to the network
(``features.0.0``, not ``model.features.0.0``); ``network`` records the attribute of the pruned
LightningModule that holds it, so every consumer takes the LightningModule or the plain network
alike (:func:`roadmap_network`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch
from torch import nn

from nestflex._io import read_json, write_json
from nestflex.errors import PruningError
from nestflex.graph import trace
from nestflex.graph.surgery import prune_channels
from nestflex.pruning.evaluate import accuracy_se

__all__ = ["SCHEMA_VERSION", "Footprint", "Roadmap", "apply_footprint", "roadmap_network"]

#: 2: group names relative to ``network``; version 1 files (names from the traced module) still load
SCHEMA_VERSION = 2
_READABLE = (1, 2)


@dataclass(frozen=True)
class Footprint:
    """One point of the roadmap, after a pruning step and its retraining.

    Attributes:
        step: 0 for the unpruned model, then 1, 2, ...
        accuracy: top-1 on the callback's evaluation split, in [0, 1].
        params: parameters of the model at this footprint.
        macs: multiply-accumulates per sample.
        widths: kept channels per group name.
        removed: removed channels per group name since the unpruned model, original indexing.
        epoch: training epochs completed when it was evaluated.
        checkpoint: weights at this footprint, relative to the roadmap's directory.
        targets: with ``round_to`` > 1, the width each group would have without rounding (the
            schedule the rounded widths follow, :func:`~nestflex.pruning.plan_step`); ``None``
            without rounding, where it equals ``widths``.
        decision: with ``decision="paired"``, the statistics of the verdict on this step
            (:meth:`~nestflex.pruning.PairedDecision.to_dict`: ``estimate``, ``bound``, ``se``,
            ``n``, ``max_drop``, ``confidence``, ``broken``); ``None`` otherwise.
        cost: the footprint's cost under the roadmap's cost model (:attr:`Roadmap.cost`: its
            unit, e.g. milliseconds per batch for ``latency``); ``None`` without one.
    """

    step: int
    accuracy: float
    params: int
    macs: int
    widths: dict[str, int]
    removed: dict[str, list[int]]
    epoch: int = 0
    checkpoint: str | None = None
    targets: dict[str, int] | None = None
    decision: dict[str, Any] | None = None
    cost: float | None = None


@dataclass
class Roadmap:
    """The roadmap of one pruning run.

    Attributes:
        model: the traced module's class name.
        criterion: importance criterion name.
        goal: the accuracy every kept footprint meets (0.0 in the budget mode, which judges no
            step on accuracy).
        start_accuracy: accuracy of the unpruned model.
        groups: original width per prunable group name, in group-id order.
        footprints: kept footprints, largest first; the last one is the seed.
        rejected: every step that broke the goal (not kept), in order; after each, the callback
            may retry from the seed with a smaller step (``backoff``).
        status: ``running``, ``goal_broken``, ``target_reached`` (the budget mode),
            ``nothing_left``, ``max_steps`` or ``max_epochs``.
        allocation: per group name, the share of each step it takes.
        network: attribute path of the pruned module that holds the network the group names
            describe (``"model"`` for :class:`~nestflex.training.ImageClassifier`; ``""``: the
            module itself).
        input_shape: per-sample input shape MACs were traced at (``None`` in version 1 files).
        eval_samples: samples each accuracy was measured on (``None`` in older files); with
            ``start_accuracy`` it sizes the evaluation noise (:meth:`noise`).
        finetune: the seed's final fine-tuning, when there was one: ``epochs``, validation
            accuracy ``before`` and ``after``, ``kept`` (the fine-tuned weights replaced the
            seed's: they did not fall below the seed); with ``confirm``, the last seed's.
        confirm: ``FilterPruning``'s ``confirm`` verdicts, one per seed judged, in order: ``step``,
            ``macs``, validation ``accuracy`` and :class:`~nestflex.pruning.SeedConfirmation`'s
            fields; an unconfirmed seed's footprint left the roadmap. ``None`` without ``confirm``.
        mode: ``accuracy`` (NestDNN's: prune while every footprint meets ``goal``), ``macs``
            (the budget mode: prune until the seed has at most ``target_macs`` of the starting
            MACs, keeping every step and recording its accuracy) or ``cost`` (the same budget in
            the cost model's units: ``target_cost`` of the starting footprint's ``cost``).
        target_macs: the ``macs`` budget's target, a fraction of the starting model's MACs;
            ``None`` otherwise (and in files written before the budget mode).
        target_cost: the ``cost`` budget's target, a fraction of the starting model's cost under
            :attr:`cost`; ``None`` otherwise (and in files written before it).
        cost: the cost model the steps were planned with (:class:`~nestflex.pruning.CostModel`):
            ``model`` (``macs`` or ``latency``), ``unit``, for latency the backend, threads and
            batch measured, ``snap`` (how a target became one of those widths: ``FilterPruning``'s
            ``snap``; absent in files written before it: ``nearest``) and ``widths``: per group
            name, the widths it could take (``None``: any); each footprint's ``cost`` is in that unit. ``None``: NestDNN's allocation, MACs.
        approximate: the groups were traced with ``approximate=True`` (``FilterPruning``'s
            ``approximate``): streams normalised by a LayerNorm were pruned too, so replaying
            the roadmap traces the same way; ``False`` in files written before it.
        schema_version: version of the JSON layout (:data:`SCHEMA_VERSION`; files of older
            readable versions are read as this one).
    """

    model: str
    criterion: str
    goal: float
    start_accuracy: float
    groups: dict[str, int]
    footprints: list[Footprint] = field(default_factory=list)
    rejected: list[Footprint] = field(default_factory=list)
    status: str = "running"
    allocation: dict[str, float] = field(default_factory=dict)
    network: str = ""
    input_shape: list[int] | None = None
    eval_samples: int | None = None
    finetune: dict[str, Any] | None = None
    confirm: list[dict[str, Any]] | None = None
    mode: str = "accuracy"
    target_macs: float | None = None
    target_cost: float | None = None
    cost: dict[str, Any] | None = None
    approximate: bool = False
    schema_version: int = SCHEMA_VERSION

    @property
    def seed(self) -> Footprint:
        """The smallest footprint that meets the goal."""
        if not self.footprints:
            raise PruningError("the roadmap has no footprint yet")
        return self.footprints[-1]

    def noise(self) -> dict[str, Any] | None:
        """How the goal's margin compares with the evaluation noise (``None`` without ``eval_samples``).

        ``se``: binomial standard error of the start accuracy on ``eval_samples`` samples;
        ``margin_se``: the allowed drop (start - goal) in those units; ``warning``: a sentence when
        the margin is under 2 standard errors (a kept or broken step is then as much the split's
        noise as the pruning's effect), else ``None``.
        """
        if not self.eval_samples:
            return None
        se = accuracy_se(self.start_accuracy, self.eval_samples)
        margin = self.start_accuracy - self.goal
        ratio = margin / se if se > 0 else float("inf")
        warning = None
        if ratio < 2.0:
            # samples at which the margin is 2 standard errors (none helps a zero margin)
            need = math.ceil(4 * self.start_accuracy * (1 - self.start_accuracy) / margin**2) if margin > 0 else None
            fix = f"a validation split of about {need} samples, or a larger `max_drop`" if need else "a `max_drop` > 0"
            warning = (f"the goal allows a drop of {100 * margin:.2f} points, {ratio:.1f} standard errors of an accuracy "
                       f"measured on {self.eval_samples} validation samples ({100 * se:.2f} points): steps are kept "
                       f"or broken by the split's noise as much as by pruning. HINT: {fix}")
        return {"eval_samples": self.eval_samples, "se": round(se, 6), "margin_se": round(ratio, 2), "warning": warning}

    def kept(self, step: int) -> dict[str, list[int]]:
        """Kept channels per group at footprint ``step``, original indexing."""
        fp = self.footprint(step)
        return {g: sorted(set(range(w)) - set(fp.removed.get(g, []))) for g, w in self.groups.items()}

    def footprint(self, step: int) -> Footprint:
        for fp in self.footprints:
            if fp.step == step:
                return fp
        raise PruningError(f"no footprint {step} in the roadmap; steps: {[f.step for f in self.footprints]}")

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["seed"] = self.footprints[-1].step if self.footprints else None
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Roadmap":
        version = d.get("schema_version")
        if version not in _READABLE:
            raise PruningError(
                f"roadmap schema_version {version!r} is not supported (this nestflex reads {SCHEMA_VERSION}). "
                "HINT: re-run the prune stage with this version"
            )
        d = dict(d)
        d.pop("seed", None)
        d["footprints"] = [Footprint(**f) for f in d["footprints"]]
        d["rejected"] = [Footprint(**f) for f in d.get("rejected", [])]
        d["schema_version"] = SCHEMA_VERSION  # read as this version from now on
        return cls(**d)

    def save(self, path: str | Path) -> None:
        """Write ``roadmap.json`` atomically."""
        write_json(path, self.to_dict())

    @classmethod
    def load(cls, path: str | Path) -> "Roadmap":
        """Read and validate a ``roadmap.json``.

        Raises:
            PruningError: a missing file, or a schema this version cannot read.
        """
        path = Path(path)
        if not path.exists():
            raise PruningError(f"roadmap {path} does not exist. HINT: run the pruning stage first")
        try:
            return cls.from_dict(read_json(path))
        except (TypeError, KeyError) as e:
            raise PruningError(f"roadmap {path} is malformed: {e}") from e


def roadmap_network(module: nn.Module, roadmap: Roadmap) -> nn.Module:
    """The network inside ``module`` that ``roadmap``'s group names describe.

    Args:
        module: the pruned LightningModule (the network is its ``roadmap.network`` attribute)
            or the plain network itself (what exits, growth and export hold).
        roadmap: the roadmap whose group names the network must have.

    Raises:
        PruningError: neither ``module`` nor its ``roadmap.network`` has the roadmap's layers.

    Examples:
        >>> from nestflex.models import create_model
        >>> net = create_model("vgg11", width=0.125)
        >>> road = Roadmap("VGG", "l1", 0.5, 0.6, {"features.conv1": 8}, network="model")
        >>> roadmap_network(torch.nn.ModuleDict({"model": net}), road) is net, roadmap_network(net, road) is net
        (True, True)
    """
    names = set(roadmap.groups)
    candidates = []
    if roadmap.network:
        try:
            candidates.append(module.get_submodule(roadmap.network))
        except AttributeError:
            pass
    candidates.append(module)
    for net in candidates:
        if names <= {n for n, _ in net.named_modules()}:
            return net
    missing = sorted(names - {n for n, _ in candidates[0].named_modules()})
    where = f"{type(module).__name__}" + (f" (or its `{roadmap.network}`)" if roadmap.network else "")
    raise PruningError(
        f"the roadmap (model {roadmap.model}) prunes groups {missing[:3]}, which {where} does not have. HINT: the "
        f"roadmap comes from another model; pass the pruned LightningModule or its network"
    )


def apply_footprint(model: nn.Module, roadmap: Roadmap, step: int | None = None,
                    input_shape: Sequence[int] | None = None) -> nn.Module:
    """Prune an unpruned ``model`` (in place) to footprint ``step`` (default: the seed).

    Args:
        model: the LightningModule the roadmap was made on or its network
            (:func:`roadmap_network`).
        roadmap: the pruning run's roadmap.
        step: the footprint's pruning step; ``None``: the seed (the last kept footprint).
        input_shape: per-sample input shape the network is traced at; default the roadmap's,
            else the model's own (:func:`nestflex.graph.input_shape_of`).

    Returns:
        ``model`` itself, pruned.

    Raises:
        PruningError: the model's groups do not match the roadmap's (another architecture),
            or the roadmap has no footprint ``step``.
    """
    net = roadmap_network(model, roadmap)
    graph = trace(net, input_shape if input_shape is not None else roadmap.input_shape, approximate=roadmap.approximate)
    kept = roadmap.kept(roadmap.seed.step if step is None else step)
    for name, idx in kept.items():
        try:
            g = graph.group(name)
        except Exception as e:
            raise PruningError(f"the roadmap prunes group {name!r}, which this model does not have. HINT: {e}") from e
        if g.width != roadmap.groups[name]:
            raise PruningError(
                f"group {name!r} has {g.width} channels, the roadmap expects {roadmap.groups[name]} "
                "(unpruned). HINT: pass a freshly built model of the roadmap's architecture"
            )
        if len(idx) < g.width:
            prune_channels(net, g, torch.as_tensor(idx))
    return model
