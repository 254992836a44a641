"""Building a multi-capacity model from a pruning roadmap, and the wrapper users hold."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import torch
from torch import nn

from nestflex.capacity.levels import LevelPlan, choose_levels, plan_levels
from nestflex.capacity.nested import Source, extract_level, get_level, is_nested, nest_, num_levels, set_level
from nestflex.errors import CapacityError, PruningError
from nestflex.graph import trace
from nestflex.graph.surgery import state_for
from nestflex.pruning.roadmap import Roadmap, roadmap_network

__all__ = ["INITS", "MultiCapacityModel", "check_roadmap", "roadmap_sources", "nest_from_roadmap", "read_state"]

#: where grown filters start: their footprint's retrained values, the vanilla model's, or the model's own init
INITS = ("footprint", "vanilla", "random")


def read_state(path: str | Path, model: nn.Module) -> dict[str, torch.Tensor]:
    """Tensors of a (Lightning or plain) checkpoint, renamed to ``model``'s names.

    A checkpoint of a LightningModule names the network ``model.<...>``; the prefix that makes
    the checkpoint's names cover ``model``'s is stripped. Only tensors are read.

    Args:
        path: the checkpoint file (a Lightning ``.ckpt`` or a plain ``state_dict`` file).
        model: the module whose parameter and buffer names the result uses.

    Returns:
        The checkpoint's tensors, keyed by ``model``'s state names.

    Raises:
        CapacityError: the file does not exist, or does not hold ``model``'s weights.
    """
    path = Path(path)
    if not path.exists():
        raise CapacityError(f"checkpoint {path} does not exist. HINT: the prune stage writes footprints/step_NNN.ckpt")
    state = torch.load(path, map_location="cpu", weights_only=True)
    renamed = state_for(model, state.get("state_dict", state))
    if renamed is not None:
        return renamed
    raise CapacityError(f"checkpoint {path} does not hold the weights of {type(model).__name__}")


def check_roadmap(model: nn.Module, roadmap: Roadmap, input_shape: Sequence[int] | None = None) -> None:
    """Raise unless ``model`` is the unpruned architecture the roadmap was made for.

    Args:
        model: the LightningModule the roadmap was made on, or its network
            (:func:`~nestflex.pruning.roadmap_network`).
        roadmap: the pruning roadmap to check against.
        input_shape: per-sample input shape the model is traced at; default the roadmap's,
            else the model's own (:func:`nestflex.graph.input_shape_of`).

    Raises:
        CapacityError: the model lacks a group the roadmap prunes, or a group's width differs
            from the roadmap's unpruned model (another model or width, or already pruned).
    """
    try:
        net = roadmap_network(model, roadmap)
    except PruningError as e:
        raise CapacityError(str(e)) from e
    groups = {g.name: g.width for g in trace(net, _shape(roadmap, input_shape)).groups}
    for name, width in roadmap.groups.items():
        if name not in groups:
            raise CapacityError(
                f"the roadmap (model {roadmap.model}) prunes group {name!r}, which {type(model).__name__} does not "
                f"have. HINT: the roadmap comes from another model; groups here: {', '.join(groups)}"
            )
        if groups[name] != width:
            raise CapacityError(
                f"group {name!r} has {groups[name]} channels, the roadmap's unpruned model has {width}. HINT: the "
                "roadmap comes from another model (or width), or the model is already pruned: pass a freshly "
                "built, unpruned model"
            )


def _shape(roadmap: Roadmap, input_shape: Sequence[int] | None) -> Sequence[int] | None:
    return input_shape if input_shape is not None else roadmap.input_shape


def roadmap_sources(model: nn.Module, roadmap: Roadmap, root: str | Path, plan: LevelPlan,
                    init: str = "footprint") -> list[Source]:
    """Per level, where its weights come from. Level 0 is always the seed's footprint."""
    if init not in INITS:
        raise CapacityError(f"`init` must be one of {INITS}, got {init!r}")
    root = Path(root)

    def footprint(step: int) -> Source:
        fp = roadmap.footprint(step)
        if fp.checkpoint is None:
            raise CapacityError(f"footprint {step} of the roadmap has no checkpoint")
        return Source(read_state(root / fp.checkpoint, model), roadmap.kept(step))

    own = Source({k: v.detach().clone() for k, v in model.state_dict().items()})
    seed = footprint(plan.steps[0])
    if init == "footprint":
        rest = [footprint(s) for s in plan.steps[1:]]
    elif init == "vanilla":
        rest = [footprint(plan.steps[-1])] * (len(plan.steps) - 1)
    else:
        rest = [own] * (len(plan.steps) - 1)
    return [seed, *rest]


def nest_from_roadmap(
    model: nn.Module,
    roadmap: Roadmap | str | Path,
    levels: int = 5,
    steps: Sequence[int] | None = None,
    init: str = "footprint",
    input_shape: Sequence[int] | None = None,
) -> LevelPlan:
    """Nest ``model`` (unpruned, in place) with levels from ``roadmap``'s footprints.

    The roadmap's footprint checkpoints are read relative to the roadmap file's directory.

    Args:
        model: the pruned LightningModule's unpruned twin or its plain network (the network
            inside is nested: :func:`~nestflex.pruning.roadmap_network`).
        roadmap: path of the pruning run's ``roadmap.json``; a loaded :class:`Roadmap` is
            rejected, since its checkpoints could not be found.
        levels: number of levels K, seed and vanilla model included, chosen evenly spaced in
            MACs (:func:`~nestflex.capacity.choose_levels`); ignored when ``steps`` is given.
        steps: the roadmap steps of the levels, seed first, ending with 0 (overrides
            ``levels``).
        init: where grown filters start: ``"footprint"`` (their values in the level's
            footprint checkpoint), ``"vanilla"`` (the unpruned model's) or ``"random"`` (the
            module's own initialisation).
        input_shape: per-sample input shape for tracing; default the roadmap's, else the
            model's own.

    Returns:
        The :class:`LevelPlan` of the nested model.

    Raises:
        CapacityError: ``model`` is already nested, ``roadmap`` is not a path, it does not
            match ``model`` (:func:`check_roadmap`), ``init`` is unknown, or the levels cannot
            be chosen.
    """
    if is_nested(model):
        raise CapacityError(f"{type(model).__name__} is already nested")
    path = None
    if not isinstance(roadmap, Roadmap):
        path = Path(roadmap)
        roadmap = Roadmap.load(path)
    if path is None:
        raise CapacityError("pass the roadmap as a path so its footprint checkpoints can be found")
    check_roadmap(model, roadmap, input_shape)
    plan = plan_levels(roadmap, list(steps) if steps is not None else choose_levels(roadmap, levels))
    net = roadmap_network(model, roadmap)
    nest_(net, plan, roadmap_sources(net, roadmap, path.parent, plan, init), _shape(roadmap, input_shape))
    return plan


class MultiCapacityModel(nn.Module):
    """A network with ``K`` nested levels sharing one copy of their weights.

    Args:
        net: an already nested network (see :func:`nest_from_roadmap`).
        plan: its :class:`LevelPlan` (kept for reports and saving).

    Example::

        net = create_model("vgg16", width=0.25)
        mc = MultiCapacityModel.from_roadmap(net, "runs/x/prune/roadmap.json", levels=5)
        mc.set_level(0)   # the seed
        small = mc.extract(0)  # plain nn.Module of that level
    """

    def __init__(self, net: nn.Module, plan: LevelPlan | None = None) -> None:
        super().__init__()
        if num_levels(net) == 0:
            raise CapacityError(f"{type(net).__name__} is not nested. HINT: use MultiCapacityModel.from_roadmap")
        self.net, self.plan = net, plan

    @classmethod
    def from_roadmap(cls, net: nn.Module, roadmap: str | Path, levels: int = 5, steps: Sequence[int] | None = None,
                     init: str = "footprint", input_shape: Sequence[int] | None = None) -> "MultiCapacityModel":
        return cls(net, nest_from_roadmap(net, roadmap, levels, steps, init, input_shape))

    @property
    def num_levels(self) -> int:
        return num_levels(self.net)

    @property
    def level(self) -> int:
        return get_level(self.net)

    def set_level(self, level: int) -> "MultiCapacityModel":
        set_level(self.net, level)
        return self

    def extract(self, level: int) -> nn.Module:
        return extract_level(self.net, level)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)
