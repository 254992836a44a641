"""The multi-exit wrapper: any traceable backbone plus exit heads, still a plain ``nn.Module``.

:class:`MultiExitNetwork` traces the backbone, places exits (:mod:`~nestflex.exits.placement`),
cuts the backbone into stages at the exits and attaches a head (:mod:`~nestflex.exits.heads`) to
each. ``forward`` returns every exit's logits, the backbone's own classifier last (the final
exit); :meth:`~MultiExitNetwork.early_exit` runs the exit policy batched, so samples that exit
stop computing.

The stages are ``torch.fx`` graphs over the backbone's own submodules, so they share its weights
and follow its ``train()``/``eval()`` flags; they are rebuilt (re-traced) after unpickling or
copying instead of being stored. One caveat of fx: Python branches on ``self.training`` inside a
*non-leaf* module are frozen at trace time (standard layers such as BatchNorm and Dropout are
leaves and unaffected).

Cost accounting: :attr:`~MultiExitNetwork.exit_macs` ``[k]`` is what a sample that stops at
exit ``k`` costs: the backbone's MACs up to the tap plus the heads of exits ``0..k``; the final
exit costs the whole backbone plus every early head.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import torch
from torch import fx, nn

from nestflex.deploy.exits import ConfidenceFn, ExitError, ExitResult, early_exit
from nestflex.exits._stages import build_stages
from nestflex.exits.heads import HeadFactory, create_head, default_head, get_head
from nestflex.exits.placement import Position, _tap_shape, resolve_positions
from nestflex.graph import SplitPoint, input_shape_of, trace

__all__ = ["MultiExitNetwork"]


class MultiExitNetwork(nn.Module):
    """A backbone with early exits.

    Args:
        backbone: an image classifier ``(N, *input_shape) -> (N, num_classes)`` that
            :func:`nestflex.graph.trace` can trace (nestflex VGG/ResNet, timm CNNs, ...). It is
            registered as the ``backbone`` submodule, not copied.
        positions: exit positions, in execution order: fractions in (0, 1) of the backbone's MACs
            and/or split point names (``trace(backbone).split_points``). ``None`` (default):
            SPINN's 0.15, 0.30, ..., 0.90, or, on a backbone with fewer places for exits, one at
            each, with a warning (:func:`~nestflex.exits.placement.default_positions`); positions
            given explicitly must fit.
        head: a head name from :func:`~nestflex.exits.heads.list_heads` or a factory
            ``(in_shape, num_classes, **kw) -> nn.Module``; ``None`` (default): by the layout of
            each exit's point (:func:`~nestflex.exits.heads.default_head`): ``sdn`` on feature
            maps, ``token`` on a transformer's token stream.
        head_kwargs: extra arguments for the head factory.
        input_shape: per-sample input shape used for tracing; default: the backbone's own
            (:func:`nestflex.graph.input_shape_of`: its ``input_shape`` attribute, else
            ``(3, 32, 32)``).

    Attributes:
        backbone, exits: the backbone and an ``nn.ModuleList`` of the early-exit heads.
        points: the :class:`~nestflex.graph.SplitPoint` of each early exit.
        exit_names: split point name of each early exit, then ``"final"``.
        positions: MACs fraction of each early exit's tap (``C_i`` of the overthinking loss).
        num_exits: early exits + 1.
        num_classes: logits per exit.
        backbone_macs: MACs per sample of the backbone alone.
        head_macs: MACs per sample of each early head.
        exit_macs: MACs per sample of stopping at each exit (see the module docstring).

    Raises:
        ExitError: bad positions, unknown head, or a backbone whose output is not ``(N, C)``.
        GraphError: the backbone cannot be traced.

    Examples:
        >>> from nestflex.models import create_model
        >>> net = MultiExitNetwork(create_model("resnet20", width=0.25), positions=(0.25, 0.5, 0.75))
        >>> [tuple(z.shape) for z in net(torch.randn(2, 3, 32, 32))]
        [(2, 10), (2, 10), (2, 10), (2, 10)]
        >>> net.exit_names
        ['layer1.1.relu2', 'layer2.1.relu1', 'layer3.0.relu2', 'final']
    """

    def __init__(
        self,
        backbone: nn.Module,
        positions: Sequence[Position] | None = None,
        head: str | HeadFactory | None = None,
        head_kwargs: Mapping[str, Any] | None = None,
        input_shape: Sequence[int] | None = None,
    ) -> None:
        super().__init__()
        if head is not None:
            get_head(head)  # an unknown name fails before the (slower) trace
        self.backbone = backbone
        self.input_shape = input_shape_of(backbone, input_shape)
        graph = trace(backbone, input_shape=self.input_shape)
        out_shape = _output_shape(graph.gm)
        if out_shape is None or len(out_shape) != 1:
            raise ExitError(
                f"the backbone must return logits of shape (N, num_classes), got per-sample output shape "
                f"{out_shape}. HINT: wrap models that return tuples or dicts so they return the logits"
            )
        self.num_classes = int(out_shape[0])
        self.points: list[SplitPoint] = resolve_positions(graph, positions)
        self.exits = nn.ModuleList(
            create_head(default_head(p.layout) if head is None else head, _tap_shape(p), self.num_classes,
                        layout=p.layout, **dict(head_kwargs or {}))
            for p in self.points
        )
        self._taps = [[name for name, _ in p.tensors].index(p.node) for p in self.points]
        self.exit_names = [p.name for p in self.points] + ["final"]
        self.positions = [p.macs_fraction for p in self.points]
        self.backbone_macs = graph.macs()
        self.head_macs = [_head_macs(h, _tap_shape(p)) for h, p in zip(self.exits, self.points)]
        early = [p.macs_before + sum(self.head_macs[: k + 1]) for k, p in enumerate(self.points)]
        self.exit_macs = early + [self.backbone_macs + sum(self.head_macs)]
        self._stage_cache: list[fx.GraphModule] | None = build_stages(graph, self.points)

    @property
    def num_exits(self) -> int:
        return len(self.points) + 1

    @property
    def stages(self) -> list[fx.GraphModule]:
        """The backbone cut at the exits (shares its weights); re-traced when missing."""
        if self._stage_cache is None:
            graph = trace(self.backbone, input_shape=self.input_shape)
            points = [graph.split_point(p.node) for p in self.points]
            self._stage_cache = build_stages(graph, points)
        return self._stage_cache

    def __getstate__(self) -> dict[str, Any]:
        # fx stages are derived data: pickling and deepcopy rebuild them rather than copy
        # generated code (and a copy must share the *copied* backbone's modules)
        state = dict(self.__dict__)
        state["_stage_cache"] = None
        return state

    def _heads(self) -> list:
        heads = [lambda state, h=h, t=t: h(state[t]) for h, t in zip(self.exits, self._taps)]
        return heads + [lambda state: state[0]]

    def forward(self, x: torch.Tensor, detach: bool = False) -> list[torch.Tensor]:
        """Logits of every exit, final exit last.

        Args:
            x: input batch.
            detach: feed the heads detached features, so exit losses train the heads only and
                never reach the backbone.
        """
        state: tuple[torch.Tensor, ...] = (x,)
        outputs = []
        for k, stage in enumerate(self.stages):
            state = stage(*state)
            if k < len(self.exits):
                tap = state[self._taps[k]]
                outputs.append(self.exits[k](tap.detach() if detach else tap))
            else:
                outputs.append(state)
        return outputs

    def early_exit(
        self,
        x: torch.Tensor,
        thresholds: float | Sequence[float],
        confidence: str | ConfidenceFn = "max_prob",
        fallback: str = "most_confident",
    ) -> ExitResult:
        """Batched early exit (:func:`nestflex.deploy.exits.early_exit`); call in eval mode.

        Samples whose confidence at an early exit exceeds its threshold leave the batch there;
        only the rest run the next stage.
        """
        return early_exit(self.stages, self._heads(), x, thresholds, confidence, fallback)

    def extra_repr(self) -> str:
        pos = ", ".join(f"{n}@{f:.2f}" for n, f in zip(self.exit_names, self.positions))
        return f"exits=[{pos}], num_classes={self.num_classes}"


def _output_shape(gm: fx.GraphModule) -> tuple[int, ...] | None:
    out = next(n for n in gm.graph.nodes if n.op == "output")
    arg = out.args[0]
    if isinstance(arg, fx.Node) and arg.meta.get("shape") is not None:
        return tuple(arg.meta["shape"][1:])
    return None


@torch.no_grad()
def _head_macs(head: nn.Module, in_shape: tuple[int, ...]) -> int:
    """MACs per sample of a head, by :class:`~nestflex.graph.StructureGraph`'s convention (convs
    and linears: weight elements x output positions), counted with hooks on one forward pass so
    any user head works, traceable or not."""
    total = 0

    def count(module: nn.Module, _inputs, output: torch.Tensor) -> None:
        nonlocal total
        out = output.shape[1:]
        spatial = math.prod(out[1:]) if isinstance(module, nn.Conv2d) else math.prod(out[:-1])
        total += module.weight.numel() * spatial

    hooks = [m.register_forward_hook(count) for m in head.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
    was_training = head.training
    head.eval()  # BatchNorm statistics must not move
    try:
        param = next(head.parameters(), None)
        head(torch.zeros(1, *in_shape, device=param.device if param is not None else None))
    finally:
        head.train(was_training)
        for h in hooks:
            h.remove()
    return int(total)
