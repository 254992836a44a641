"""What a pruning step saves: one cost abstraction, MACs or measured latency.

:class:`CostModel` prices a traced model at any group widths. :class:`MacsCost` is the graph's
MACs (NestDNN's, and what every committed roadmap used). :class:`LatencyCost` sums a
:class:`~nestflex.profiling.LatencyTable` measured on the target backend over the model's
conv/linear layers (NetAdapt's per-layer lookup tables), so a step is priced in milliseconds
where the model will run.

:class:`~nestflex.pruning.FilterPruning` and :class:`~nestflex.capacity.FreezeAndGrow` take
either through one code path: the pruner reweights its per-layer allocation by the cost each
group's next step saves per accuracy risked (:func:`cost_allocation`, HALP's latency saliency
at the granularity of a group), keeps each group at the widths the cost says are worth having
(:meth:`CostModel.widths_for`: for latency, the measured fast widths, so the channel step comes
from measurement), and records each footprint's cost; the grower spaces its levels evenly in it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Mapping, Sequence

import torch
from torch import nn

from nestflex.errors import PruningError
from nestflex.graph import StructureGraph, input_shape_of, trace
from nestflex.profiling.latency import LatencyTable, LayerSpec, measure_table, write_layer_specs
from nestflex.pruning.step import shrink

__all__ = [
    "COSTS",
    "CostModel",
    "LatencyCost",
    "MacsCost",
    "build_latency_table",
    "cost_allocation",
    "get_cost",
    "latency_specs",
    "write_model_specs",
]

#: the cost models by name
COSTS = ("macs", "latency")


class CostModel:
    """The price of a traced model at given group widths; lower is cheaper.

    Subclasses set :attr:`name` and :attr:`unit` and implement :meth:`__call__`; :meth:`widths_for`
    may restrict the widths a group is pruned to.
    """

    name = ""
    unit = ""

    def __call__(self, graph: StructureGraph, widths: Mapping[int, int] | None = None) -> float:
        """The model's cost with each group ``g`` at ``widths[g]`` channels (the rest as traced).

        Args:
            graph: the traced model.
            widths: group id -> width; ``None``: the traced widths.
        """
        raise NotImplementedError

    def widths_for(self, graph: StructureGraph, gid: int) -> list[int] | None:
        """The widths group ``gid`` may be pruned to, ascending (its current width last), or
        ``None`` when any width is as good as the next (MACs fall with every channel).

        Args:
            graph: the traced model.
            gid: the group's id.
        """
        return None

    def describe(self) -> dict:
        """What the roadmap records of the cost model (its name and unit)."""
        return {"model": self.name, "unit": self.unit}


class MacsCost(CostModel):
    """Multiply-accumulates per sample (:meth:`~nestflex.graph.StructureGraph.macs`).

    Examples:
        >>> from nestflex.models import create_model
        >>> g = trace(create_model("vgg11", width=0.125))
        >>> MacsCost()(g) == g.macs()
        True
    """

    name, unit = "macs", "MACs"

    def __call__(self, graph: StructureGraph, widths: Mapping[int, int] | None = None) -> float:
        return float(graph.macs(widths))


def _layer_spec(graph: StructureGraph, name: str, shapes: Mapping[str, tuple[int, ...]],
                inputs: Mapping[str, tuple[int, ...]]) -> LayerSpec:
    """The spec of layer ``name`` at the widths ``shapes`` describe."""
    mod = graph.gm.get_submodule(name)
    w = shapes[f"{name}.weight"]
    if isinstance(mod, nn.Linear):
        rows = max(1, next(layer.spatial for layer in graph.layers if layer.name == name))
        return LayerSpec("linear", int(w[1]), int(w[0]), in_hw=(rows, 1))
    depthwise = mod.groups > 1 and mod.groups == mod.in_channels == mod.out_channels
    if mod.groups > 1 and not depthwise:
        raise PruningError(f"layer {name!r} is a grouped conv ({mod.groups} groups, not depthwise), which the "
                           f"latency table does not model. HINT: use the MACs cost for this model")
    return LayerSpec("conv", int(w[0]) if depthwise else int(w[1]), int(w[0]), kernel=mod.kernel_size,
                     stride=mod.stride, padding=mod.padding, dilation=mod.dilation, depthwise=depthwise,
                     in_hw=tuple(inputs[name][2:4]))


def _layer_inputs(graph: StructureGraph) -> dict[str, tuple[int, ...]]:
    """Each layer's input shape at trace (batch 1), by layer name."""
    names = {layer.name for layer in graph.layers}
    return {n.target: tuple(n.args[0].meta["shape"]) for n in graph.gm.graph.nodes
            if n.op == "call_module" and n.target in names}


def _specs(graph: StructureGraph, widths: Mapping[int, int] | None = None) -> list[LayerSpec]:
    shapes, inputs = graph.param_shapes(widths), _layer_inputs(graph)
    return [_layer_spec(graph, layer.name, shapes, inputs) for layer in graph.layers]


class LatencyCost(CostModel):
    """Milliseconds per batch on the target backend: the sum of a measured
    :class:`~nestflex.profiling.LatencyTable` over the model's conv and linear layers.

    Each layer is priced by the table's entry for its shape (:meth:`LatencyTable.lookup`),
    interpolated at its current widths. The parts no layer accounts for (pools, adds, the
    runtime's call overhead) are nearly a constant no pruning step changes: ``overhead_ms``
    (default 0, left out: differences and even spacing are the same with it; a share of the
    whole model's time needs it, as benchmarks/synthesis/time_vs_macs.py measures it).

    Args:
        table: the measured table, or the path of its JSON.
        margin: the relative saving a width must show to count as faster than a larger one, as a
            share of the time of the layers the group's width moves (producers and consumers):
            the timer's noise, as :meth:`~nestflex.profiling.LatencyTable.fast_widths` applies it
            to one layer's sweep.
        overhead_ms: milliseconds added to every price for the parts the table does not measure.
    """

    name, unit = "latency", "ms"

    def __init__(self, table: LatencyTable | str | os.PathLike, margin: float = 0.03, overhead_ms: float = 0.0) -> None:
        self.table = table if isinstance(table, LatencyTable) else LatencyTable.load(table)
        self.margin, self.overhead_ms = margin, float(overhead_ms)

    def __call__(self, graph: StructureGraph, widths: Mapping[int, int] | None = None) -> float:
        return self.overhead_ms + sum(self.table.layer_time(spec) for spec in _specs(graph, widths))

    def widths_for(self, graph: StructureGraph, gid: int) -> list[int] | None:
        g = graph.group(gid)
        producers = {m.module for m in g.members if m.attr == "weight" and m.dim == 0}
        base = _specs(graph)
        candidates = {g.width}
        for spec, layer in zip(base, graph.layers):
            if layer.name in producers:  # every width the producers' fine sweep measured below the current one
                candidates |= {w for w in self.table.lookup(spec)["fine"] if w < g.width}
        # The layers the group's width moves (its producers and consumers) at each candidate; the rest
        # of the model is the same at every candidate. A width is worth having when those layers are
        # faster there than at every larger kept width by `margin` of *their* time: the margin is the
        # timer's noise, which is a share of the layers measured. (Judged on the whole model, a 3%
        # margin left 30 of EfficientNet-B0's 40 groups no width at 25% of its time, 320 -> 256
        # channels saving 12% of the moved layers' time among them: the roadmap stalled at 0.25-0.29
        # of the time, depending on the table's draw. Taking every measured width, not only the
        # producers' own fast ones, lets the consumers' time count when a producer's sweep is flat.)
        at = {w: _specs(graph, {gid: w}) for w in candidates}
        moved = [i for i in range(len(base)) if any(at[w][i] != base[i] for w in candidates)]
        costs = {w: sum(self.table.layer_time(at[w][i]) for i in moved) for w in candidates}
        kept, best = [], float("inf")
        for w in sorted(candidates, reverse=True):
            if costs[w] < best * (1 - self.margin) or not kept:
                kept.append(w)
                best = costs[w]
        return sorted(kept)

    def describe(self) -> dict:
        return {"model": self.name, "unit": self.unit, "backend": self.table.backend, "threads": self.table.threads,
                "batch": self.table.batch}


def get_cost(cost: str | CostModel | LatencyTable | None, table: str | os.PathLike | None = None) -> CostModel:
    """A cost model from a name, a table or a model.

    Args:
        cost: ``"macs"``, ``"latency"`` (needs ``table``), a :class:`CostModel`, a
            :class:`~nestflex.profiling.LatencyTable`, the path of a table's ``.json`` (what a
            LightningCLI config can give), or ``None`` (MACs).
        table: the latency table's JSON, for ``cost="latency"``.

    Raises:
        PruningError: an unknown name, or ``"latency"`` without a table.
    """
    if cost is None or cost == "macs":
        return MacsCost()
    if isinstance(cost, CostModel):
        return cost
    if isinstance(cost, LatencyTable):
        return LatencyCost(cost)
    if isinstance(cost, (str, os.PathLike)) and str(cost).endswith(".json"):
        return LatencyCost(cost)
    if cost == "latency":
        if table is None:
            raise PruningError("`cost`='latency' needs a latency table. HINT: pass `table=` (a JSON from "
                               "`nestflex latency-table`) or a LatencyCost")
        return LatencyCost(table)
    raise PruningError(f"`cost` must be one of {COSTS}, a CostModel or a LatencyTable, got {cost!r}")


def cost_allocation(graph: StructureGraph, weights: Mapping[int, float], cost: CostModel, step: float,
                    min_channels: int = 1) -> tuple[dict[int, float], dict[int, list[int] | None]]:
    """Each group's share of a step reweighted by what its channels save, and the widths it may take.

    The sensitivity allocation gives group ``g`` a share ``w_g`` of each step in proportion to
    its tolerance, so every group risks about the same accuracy per step. What the step saves
    differs: ``e_g``, the cost its next useful width saves per share of its channels removed (for
    latency, the next measured fast width: HALP's latency saliency, per group). A group at least
    as efficient as the median group keeps its share; a less efficient one takes
    ``w_g * e_g / median(e)``: accuracy is not spent where little is saved, and a group whose next
    width saves nothing is left alone. (Proportional shares, ``w_g * e_g / max(e)``, starve all
    but the one or two most efficient groups: on ResNet-18 one residual group takes 30 to 80 times
    the others' share, and the roadmap then removes a channel or two per step elsewhere.) The
    shares are then scaled so the largest is 1.

    Args:
        graph: the traced model at the start of pruning.
        weights: the sensitivity (or uniform) allocation by group id, in [0, 1].
        cost: the cost model.
        step: the step size: a group the cost does not restrict (MACs) is priced at the width
            one full step at weight 1 leaves it.
        min_channels: no group goes below this many channels.

    Returns:
        ``(weights, widths)``: the new share of each group, and the widths each may take
        (:meth:`CostModel.widths_for`, ``None``: any).

    Examples:
        >>> from nestflex.models import create_model
        >>> g = trace(create_model("vgg11", width=0.125))
        >>> w, widths = cost_allocation(g, {x.id: 1.0 for x in g.prunable_groups}, MacsCost(), 0.25)
        >>> max(w.values()), all(v is None for v in widths.values())
        (1.0, True)
    """
    base = cost(graph)
    widths = {gid: cost.widths_for(graph, gid) for gid in weights}
    gain: dict[int, float] = {}
    for gid, share in weights.items():
        width = graph.group(gid).width
        below = [w for w in (widths[gid] or [shrink(width, 1.0, step, min_channels)]) if min_channels <= w < width]
        nxt = max(below) if below else width
        gain[gid] = share * (base - cost(graph, {gid: nxt})) / ((width - nxt) / width) if nxt < width else 0.0
    saving = sorted(v / weights[g] for g, v in gain.items() if v > 0)
    if not saving:
        raise PruningError(f"no group's next width saves any {cost.unit} ({cost.name} cost); nothing to prune. "
                           f"HINT: check the latency table was measured for this model and input shape")
    median = saving[len(saving) // 2]
    shares = {g: weights[g] * min(1.0, v / weights[g] / median) if v > 0 else 0.0 for g, v in gain.items()}
    top = max(shares.values())
    return {g: v / top for g, v in shares.items()}, widths


def latency_specs(model: nn.Module, input_shape: Sequence[int] | None = None) -> list[LayerSpec]:
    """The conv and linear layers of ``model`` at its current widths, one per distinct shape.

    Args:
        model: the network (or LightningModule) to measure.
        input_shape: per-sample input shape; default the model's (``input_shape`` attribute).
    """
    graph = trace(model, input_shape_of(model, input_shape))
    return list({s.key: s for s in _specs(graph)}.values())


def write_model_specs(model: nn.Module, input_shape: Sequence[int] | None, path: str | os.PathLike) -> Path:
    """Write the layer specs of ``model`` for ``nestflex latency-table`` on the device.

    Args:
        model: the network (or LightningModule).
        input_shape: per-sample input shape (``None``: the model's).
        path: the JSON file to write, atomically.
    """
    shape = input_shape_of(model, input_shape)
    return write_layer_specs(latency_specs(model, shape), path, model=type(model).__name__, input_shape=list(shape))


def build_latency_table(model: nn.Module, input_shape: Sequence[int] | None = None, threads: int = 1,
                        batch: int = 1, repeats: int = 7, log: Callable[[str], None] | None = None) -> LatencyTable:
    """Measure the latency table of ``model`` here (the device's command does the same from a spec file).

    Args:
        model: the network (or LightningModule).
        input_shape: per-sample input shape (``None``: the model's).
        threads: onnxruntime intra-op threads (the synthesized plan's).
        batch: batch size (the plan's).
        repeats: timed samples per measured point.
        log: called with a line per layer (``None``: quiet).
    """
    with torch.no_grad():
        specs = latency_specs(model, input_shape)
    return measure_table(specs, threads=threads, batch=batch, repeats=repeats, log=log)
