"""The records of a channel analysis: a :class:`ChannelGroup` of :class:`Member` tensor slices,
and the :class:`Layout` of a concatenated dim (the concepts are in :mod:`nestflex.graph.groups`)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

__all__ = ["Member", "Layout", "ChannelGroup"]


@dataclass(frozen=True)
class Member:
    """One tensor slice that belongs to a channel group.

    Attributes:
        module: qualified name of the owning module (``model.get_submodule(module)``).
        attr: parameter or buffer name on that module (``weight``, ``running_mean``...).
        dim: the dimension indexed by the group's channels.
        factor: consecutive entries per channel along ``dim`` (``H*W`` for a linear fed by a
            flatten of ``(C, H, W)``, else 1).
        role: ``out`` (produces the channels), ``in`` (consumes them), ``norm`` (per-channel
            statistics/affine), ``depthwise`` (a depthwise conv, which is both), ``param`` (a
            parameter or buffer the forward combines elementwise with the channels: a layer scale,
            a class token, a position embedding) or ``count`` (an int attribute of the module equal
            to ``width * factor``: an attention's ``num_heads``).
        layout: for a tensor fed by a concatenation, the parts of ``dim`` in order (this group is
            one or more of them); ``None`` when the group owns the whole dim.
        copies: blocks of an interleaved group (a grouped conv's ``G``): channel ``j`` is entry
            ``j`` of every block, block ``b`` starting at ``b * width``; 1 otherwise, and for a
            grouped conv's own weight on dim 1 (the position inside a block).
    """

    module: str
    attr: str
    dim: int
    factor: int = 1
    role: str = "out"
    layout: Layout | None = None
    copies: int = 1

    def rows(self, group: ChannelGroup, idx: torch.Tensor, others: bool = True) -> torch.Tensor:
        """Entries along ``dim`` that channels ``idx`` of ``group`` hold in this tensor, at their
        offset in a concatenated dim; with ``others`` every other part is kept whole too (so the
        result selects along the whole dim, what surgery needs). An interleaved group's entries
        come block by block, each block in ``idx`` order."""
        if self.copies > 1:
            idx = (torch.arange(self.copies)[:, None] * group.width + idx[None, :]).flatten()
        own = (idx[:, None] * self.factor + torch.arange(self.factor)).flatten()
        if self.layout is None:
            return own
        rows, offset = [], 0
        for part in self.layout.parts:
            w = self.layout.width(part) * self.factor
            if part is group:
                rows.append(offset + own)
            elif others:
                rows.append(offset + torch.arange(w))
            offset += w
        return torch.cat(rows)

    def size(self, group: ChannelGroup, widths: dict[int, int] | None = None) -> int:
        """Entries along ``dim`` when the groups have ``widths`` (default: their current widths)."""
        if self.layout is None:
            return (widths or {}).get(group.id, group.width) * self.factor * self.copies
        return sum(self.layout.width(p, widths) for p in self.layout.parts) * self.factor


class Layout:
    """The parts of a concatenated channel dim, in order: groups (whose widths change with
    surgery) or fixed widths (a part with no group, such as the model input). Shared by every
    member that indexes the same concatenated tensor; compared by identity.

    The finder builds a layout when it meets a concatenation, before the groups exist, and
    resolves its parts once it has collected them.

    Args:
        spaces: the channel space of each part, in concatenation order (the finder's
            union-find ids, not group ids).
        widths: the number of channels of each part at trace time, in the same order; a part
            whose space ends in no group keeps this fixed width.

    Attributes:
        parts: each part, in order: its :class:`ChannelGroup`, or an ``int`` fixed width for a
            part with no group. Until the finder resolves them, the trace-time ``widths``.
    """

    def __init__(self, spaces: tuple[int, ...], widths: tuple[int, ...]) -> None:
        self._spaces, self._widths = spaces, widths
        self.parts: list[ChannelGroup | int] = list(widths)

    def width(self, part: ChannelGroup | int, widths: dict[int, int] | None = None) -> int:
        """Channels of ``part``: a fixed width as is, a group's from ``widths`` (by group id) or
        else its current width."""
        if isinstance(part, int):
            return part
        return (widths or {}).get(part.id, part.width)

    def __repr__(self) -> str:
        return "Layout(" + ", ".join(p if isinstance(p, int) else p.name for p in self.parts) + ")"


@dataclass
class ChannelGroup:
    """Channels that must be pruned, permuted or sliced together.

    Attributes:
        id: stable index (trace order of the first producer); unchanged by surgery.
        name: the first producing module, e.g. ``features.conv3``.
        width: current number of channels.
        members: every tensor slice indexed by these channels.
        prunable: ``False`` when the group is locked (see :mod:`nestflex.graph.groups`).
        reason: why a group is locked.
        nodes: fx node names whose output carries these channels on dim 1, one value per
            channel (convs, norms, activations, adds, pools; not flattened views), in trace
            order. Importance criteria read the group's responses from them.
        copies: blocks of an interleaved group (see :mod:`nestflex.graph.groups`): its nodes carry
            ``width * copies`` channels on dim 1, channel ``j`` of the group at ``b * width + j``.
        approximation: for a group made prunable by ``trace(..., approximate=True)``, what pruning
            it changes beyond removing the channels (the statistics of a norm over them, a
            weight standardisation): pruned does not equal masked. Empty for an exact group.
    """

    id: int
    name: str
    width: int
    members: list[Member] = field(default_factory=list)
    prunable: bool = True
    reason: str = ""
    nodes: list[str] = field(default_factory=list)
    copies: int = 1
    approximation: str = ""

    @property
    def exact(self) -> bool:
        """Pruning this group gives the masked model's outputs exactly (no :attr:`approximation`)."""
        return not self.approximation

    def blocks(self, t: torch.Tensor, dim: int = 1) -> torch.Tensor:
        """View ``t``'s ``width * copies`` entries on ``dim`` as ``(copies, width)``: a response's
        channels split into the group's blocks, so a per-channel statistic can be summed (or
        kept) over the blocks. Raises ValueError when ``dim`` has another size."""
        n = t.shape[dim]
        if n != self.width * self.copies:
            raise ValueError(f"group `{self.name}` has {self.width} channels x {self.copies} blocks, "
                             f"the tensor has {n} on dim {dim}")
        return t.unflatten(dim, (self.copies, self.width))

    @property
    def producers(self) -> list[str]:
        """Modules whose output channels are this group (convs, linears, depthwise convs)."""
        seen: list[str] = []
        for m in self.members:
            if m.role in ("out", "depthwise") and m.module not in seen:
                seen.append(m.module)
        return seen
