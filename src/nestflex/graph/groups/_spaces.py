"""Channel spaces while the finder walks the graph: a union-find over space ids, and the
:class:`ChannelInfo` of each node (which space its channels are, on which dim, in which parts)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from nestflex.graph.groups.records import Layout

__all__ = ["UnionFind", "ChannelInfo"]


class UnionFind:
    """Disjoint sets of channel spaces (path halving; a union keeps the smaller id as the root, so a
    group's id follows trace order)."""

    def __init__(self) -> None:
        self.parent: list[int] = []

    def new(self) -> int:
        self.parent.append(len(self.parent))
        return len(self.parent) - 1

    def find(self, a: int) -> int:
        while self.parent[a] != a:
            self.parent[a] = self.parent[self.parent[a]]
            a = self.parent[a]
        return a

    def union(self, a: int, b: int) -> int:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[max(ra, rb)] = min(ra, rb)
        return min(ra, rb)


@dataclass
class ChannelInfo:
    """Channel layout of one node's output: its space and features per channel along dim 1.

    A concatenation's output has ``parts``, ``(space, width)`` per input in order, and
    ``space`` -1: its channels belong to several spaces.
    """

    space: int
    factor: int = 1
    parts: tuple[tuple[int, int], ...] | None = None
    layout: Layout | None = None
    dim: int = 1  # where the channels are in the node's output
    head: tuple[int, int] | None = None  # heads: (where the head dim d is, d); None if the dim is gone
    unbound: int | None = None  # a tuple from unbind(dim): its items drop that dim
    attention: str | None = None  # heads: the attention module (owner of num_heads, head_dim, proj)
    constant: bool = False  # a parameter or buffer (no batch dim), or a view of one

    @property
    def spaces(self) -> list[int]:
        return [sp for sp, _ in self.parts] if self.parts else [self.space]

    @property
    def heads(self) -> bool:
        return self.attention is not None

    def with_factor(self, factor: int) -> ChannelInfo:
        return replace(self, factor=factor)

    def at(self, dim: int) -> ChannelInfo:
        return replace(self, dim=dim)
