"""Filter importance criteria behind one interface, chosen by name from a registry.

A criterion scores every channel of the coupled channel groups it is asked about; a higher score
means more important (pruned last). Scores are compared *within* a group only: how many channels
each group loses is decided separately, from the per-layer sensitivity profile
(:mod:`nestflex.pruning.allocation`), as NestDNN does. So criteria need no cross-layer
normalisation, and L1 norms of a 3x3x16 filter are never weighed against those of a 3x3x256 one.

Built in: ``l1`` and ``l2`` (filter weight norms, Li et al. 2016), ``random`` (seeded) and
``trr`` (Triplet Response Residual, :mod:`nestflex.pruning.trr`). Register more with
:func:`register_importance`.

Examples:
    >>> from nestflex.models import create_model
    >>> from nestflex.graph import trace
    >>> model = create_model("vgg11", width=0.125)
    >>> graph = trace(model)
    >>> scores = get_importance("l1")(model, graph)
    >>> scores[0].shape
    torch.Size([8])
"""

from __future__ import annotations

import abc
from typing import Any, Callable, Iterable, Sequence

import torch
from torch import nn

from nestflex.errors import PruningError
from nestflex.graph import ChannelGroup, StructureGraph

__all__ = [
    "Importance",
    "PruningError",
    "WeightNorm",
    "RandomImportance",
    "register_importance",
    "list_importances",
    "get_importance",
]

#: reduces a tensor over data-parallel ranks (sum); identity on one process
Reduce = Callable[[torch.Tensor], torch.Tensor]


class Importance(abc.ABC):
    """Scores the channels of coupled channel groups; higher = more important.

    Subclasses implement :meth:`scores`. ``needs_data`` tells callers whether ``data`` is read.
    Data-dependent criteria take ``rank``/``world_size`` to work on a shard and ``reduce`` to
    sum partial results across data-parallel ranks, so every rank ends with the same scores.
    """

    name: str = ""
    needs_data: bool = False

    @abc.abstractmethod
    def scores(
        self,
        model: nn.Module,
        graph: StructureGraph,
        groups: Sequence[ChannelGroup] | None = None,
        data: Any = None,
        *,
        rank: int = 0,
        world_size: int = 1,
        reduce: Reduce | None = None,
    ) -> dict[int, torch.Tensor]:
        """One float64 score per channel for each group (default: every prunable group), by id."""

    def __call__(self, model: nn.Module, graph: StructureGraph, groups=None, data=None, **kw) -> dict[int, torch.Tensor]:
        return self.scores(model, graph, groups, data, **kw)

    def score(self, model: nn.Module, graph: StructureGraph, group: ChannelGroup | int | str, data: Any = None) -> torch.Tensor:
        """Scores of one group's channels."""
        g = group if isinstance(group, ChannelGroup) else graph.group(group)
        return self.scores(model, graph, [g], data)[g.id]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


def _groups(graph: StructureGraph, groups: Iterable[ChannelGroup] | None) -> list[ChannelGroup]:
    return list(groups) if groups is not None else graph.prunable_groups


class WeightNorm(Importance):
    """Lp norm of each output filter, summed over a group's producers (``l1``: Li et al. 2016).

    A residual group has several producers (one conv per block writes the same channels); a
    channel's weight mass is the sum over all of them.

    Args:
        p: the norm, 1 (sum of absolute weights, criterion ``"l1"``) or 2 (Euclidean,
            ``"l2"``).

    Raises:
        PruningError: ``p`` is neither 1 nor 2.
    """

    needs_data = False

    def __init__(self, p: int = 1) -> None:
        if p not in (1, 2):
            raise PruningError(f"`p` must be 1 or 2, got {p!r}")
        self.p = p
        self.name = f"l{p}"

    def scores(self, model, graph, groups=None, data=None, **_: Any) -> dict[int, torch.Tensor]:
        out = {}
        for g in _groups(graph, groups):
            total = torch.zeros(g.width, dtype=torch.float64)
            for m in g.members:
                if m.role not in ("out", "depthwise") or m.attr != "weight":
                    continue
                w = getattr(model.get_submodule(m.module), m.attr).detach().double().cpu()
                # an interleaved group's channel owns one row in each of its blocks
                w = w.movedim(m.dim, 0).reshape(m.copies, g.width, -1).transpose(0, 1).reshape(g.width, -1)
                total += w.abs().sum(1) if self.p == 1 else w.pow(2).sum(1)
            out[g.id] = total if self.p == 1 else total.sqrt()
        return out


class RandomImportance(Importance):
    """Seeded random scores: the floor every real criterion must beat.

    Each call to ``scores`` (one per pruning step) draws afresh, yet the sequence is the same on
    every rank and every rerun with the same seed.

    Args:
        seed: seed of the sequence of draws.
    """

    name = "random"
    needs_data = False

    def __init__(self, seed: int = 0) -> None:
        self.seed = int(seed)
        self._calls = 0

    def scores(self, model, graph, groups=None, data=None, **_: Any) -> dict[int, torch.Tensor]:
        # a fresh draw per call (per pruning step), yet the same sequence on every rank and rerun
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + self._calls)
        self._calls += 1
        return {g.id: torch.rand(g.width, generator=gen, dtype=torch.float64) for g in _groups(graph, groups)}

    def state_dict(self) -> dict[str, int]:
        return {"calls": self._calls}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self._calls = int(state["calls"])


_REGISTRY: dict[str, Callable[..., Importance]] = {}


def register_importance(name: str, factory: Callable[..., Importance] | None = None):
    """Register a criterion factory under ``name`` (usable as a decorator).

    Returns ``factory`` itself, or, when ``factory`` is ``None``, a decorator that registers the
    function it decorates and returns it.

    Args:
        name: the name :func:`get_importance` will accept.
        factory: a callable that takes keyword arguments and returns an :class:`Importance`;
            ``None``: return the decorator.

    Raises:
        PruningError: the name is taken.
    """

    def add(f: Callable[..., Importance]) -> Callable[..., Importance]:
        if name in _REGISTRY:
            raise PruningError(f"importance criterion {name!r} is already registered")
        _REGISTRY[name] = f
        return f

    return add(factory) if factory is not None else add


def list_importances() -> list[str]:
    """Names accepted by :func:`get_importance`."""
    return sorted(_REGISTRY)


def get_importance(criterion: str | Importance, **kwargs: Any) -> Importance:
    """A criterion by name (built with ``kwargs``), or ``criterion`` itself if it is one.

    Args:
        criterion: a registered name (:func:`list_importances`) or an :class:`Importance`
            instance.
        **kwargs: passed to the registered factory (ignored for an instance).

    Raises:
        PruningError: unknown name (the message lists the registered ones).
    """
    if isinstance(criterion, Importance):
        return criterion
    if criterion not in _REGISTRY:
        raise PruningError(
            f"`criterion` {criterion!r} is not registered; choose from {', '.join(list_importances())} "
            "or pass an `Importance` instance"
        )
    return _REGISTRY[criterion](**kwargs)


register_importance("l1", lambda **kw: WeightNorm(1, **kw))
register_importance("l2", lambda **kw: WeightNorm(2, **kw))
register_importance("random", RandomImportance)
