"""Fine-grained exits (FlexDNN): an exit fed by the top-k ranked filters of one layer.

Progressive exits read a whole layer; FlexDNN's exits read a *subset of its filters*, the top
``k`` of a collective ranking (:mod:`nestflex.pruning.collective`), so an exit's cost and
capacity are chosen at the granularity of filters, not layers.

* :class:`FilterSubsetExit`: ``head(x[:, index])``: any head (a registry name, a factory or a
  module) behind a fixed channel selection. The selection is a buffer, so it travels with the
  ``state_dict`` and costs no MACs.
* :class:`RankedDropout`: channel dropout whose rate grows with a filter's rank (FlexDNN's
  training "with emphasis on important filters": the top filter is never dropped).
* :class:`CompactHead`: the conv exit of the architecture search: blocks of 3x3 conv + BN + ReLU
  (stride 2 while the map is larger than 1x1), global average pooling, linear. The search starts
  it over-parameterised (four blocks, doubling widths) and prunes it.
* :func:`exit_filter_counts`: the ``M`` over-parameterised exits of one location take the top
  ``ceil(k N / M)`` filters, ``k = 1..M``.

Examples:
    >>> import torch
    >>> ex = FilterSubsetExit(torch.tensor([3, 0]), CompactHead(2, [4, 8], num_classes=10, in_hw=(8, 8)))
    >>> ex(torch.randn(5, 16, 8, 8)).shape
    torch.Size([5, 10])
    >>> exit_filter_counts(64, 3)
    [22, 43, 64]
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import torch
from torch import nn

from nestflex.deploy.exits import ExitError
from nestflex.exits.heads import HeadFactory, create_head, default_head

__all__ = ["FilterSubsetExit", "RankedDropout", "CompactHead", "exit_filter_counts", "fine_grained_exit"]


def exit_filter_counts(filters: int, m: int) -> list[int]:
    """Filters fed to each of the ``m`` over-parameterised exits of a layer of ``filters``.

    Args:
        filters: the layer's filters (output channels).
        m: exits at the layer (``FlexDNNConfig.exits_per_location``).

    Returns:
        ``ceil(k * filters / m)`` for ``k = 1..m``: exit ``k`` reads that many top-ranked filters.

    Raises:
        ExitError: ``m`` < 1 or a layer with fewer filters than ``m`` (two exits would be equal).

    Examples:
        >>> exit_filter_counts(10, 4)
        [3, 5, 8, 10]
    """
    if isinstance(m, bool) or not isinstance(m, int) or m < 1:
        raise ExitError(f"`exits_per_location` (M) must be a positive int, got {m!r}")
    if filters < m:
        raise ExitError(
            f"a layer with {filters} filters cannot feed M={m} distinct exits (exit k takes the top "
            f"ceil(k*{filters}/{m}) filters). HINT: lower `exits_per_location` to at most {filters}, or drop this location"
        )
    return [math.ceil(k * filters / m) for k in range(1, m + 1)]


class RankedDropout(nn.Module):
    """Channel dropout with a rate per channel that grows with its rank (0 = most important).

    Channel ``i`` of ``k`` (in ranked order) is dropped with probability ``p_max * i / (k - 1)``;
    kept channels are rescaled by ``1 / (1 - p)`` so eval mode (identity) sees the same scale.

    Args:
        channels: channels of its input, in ranked order (the top filter first).
        p_max: drop probability of the lowest-ranked channel, in [0, 1).

    Raises:
        ExitError: ``p_max`` outside [0, 1).

    Examples:
        >>> import torch
        >>> drop = RankedDropout(4, p_max=0.5).eval()
        >>> x = torch.randn(2, 4, 3, 3)
        >>> torch.equal(drop(x), x)  # the identity at inference
        True
    """

    def __init__(self, channels: int, p_max: float = 0.5) -> None:
        super().__init__()
        if not (isinstance(p_max, (int, float)) and 0.0 <= p_max < 1.0):
            raise ExitError(f"`p_max` (ranked dropout) must be in [0, 1), got {p_max!r}")
        p = torch.linspace(0.0, float(p_max), channels) if channels > 1 else torch.zeros(1)
        self.register_buffer("p", p, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or float(self.p.max()) == 0.0:
            return x
        keep = 1.0 - self.p
        mask = torch.bernoulli(keep.expand(x.shape[0], -1)).to(x.dtype) / keep
        return x * mask.view(*mask.shape, *([1] * (x.ndim - 2)))


class CompactHead(nn.Module):
    """Conv exit: ``len(widths)`` blocks of 3x3 conv (stride 2 while the map is > 1x1), BN, ReLU;
    global average pooling; linear. ``widths=[]`` is a pooled linear probe.

    ``stem_pool`` > 1 average-pools the input by that factor before the first block: every block
    then runs on ``1 / stem_pool^2`` of the positions, which is what makes an exit on an early,
    high-resolution layer affordable (pooling is not counted as MACs, as everywhere in nestflex).

    Args:
        in_channels: channels of its input (the filters its exit reads).
        widths: output channels of each conv block (``[]``: no block, a pooled linear probe).
        num_classes: logits it returns.
        in_hw: height and width of its input, before ``stem_pool``.
        stem_pool: average-pooling factor applied first (1: none).

    Raises:
        ExitError: a width or ``stem_pool`` that is not a positive int.

    Examples:
        >>> import torch
        >>> head = CompactHead(6, [8, 16], num_classes=10, in_hw=(16, 16), stem_pool=2)
        >>> head(torch.randn(2, 6, 16, 16)).shape
        torch.Size([2, 10])
    """

    def __init__(self, in_channels: int, widths: Sequence[int], num_classes: int, in_hw: tuple[int, int],
                 stem_pool: int = 1) -> None:
        super().__init__()
        for i, w in enumerate(widths):
            if isinstance(w, bool) or not isinstance(w, int) or w < 1:
                raise ExitError(f"`widths[{i}]` must be a positive int, got {w!r}")
        if isinstance(stem_pool, bool) or not isinstance(stem_pool, int) or stem_pool < 1:
            raise ExitError(f"`stem_pool` must be a positive int (1: no pooling), got {stem_pool!r}")
        self.widths = [int(w) for w in widths]
        self.in_hw = tuple(int(v) for v in in_hw)
        self.stem_pool = int(stem_pool)
        self.stem = nn.AvgPool2d(stem_pool, ceil_mode=True) if stem_pool > 1 else nn.Identity()
        blocks, c = [], in_channels
        h, w_ = (math.ceil(v / self.stem_pool) for v in self.in_hw)
        for width in self.widths:
            stride = 2 if min(h, w_) > 1 else 1
            blocks.append(
                nn.Sequential(nn.Conv2d(c, width, 3, stride, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True))
            )
            h, w_ = (h + 2 - 3) // stride + 1, (w_ + 2 - 3) // stride + 1
            c = width
        self.blocks = nn.Sequential(*blocks)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.linear = nn.Linear(c, num_classes)

    def features(self, x: torch.Tensor, depth: int | None = None) -> torch.Tensor:
        """Pooled output ``(N, C)`` after the first ``depth`` blocks (default: all)."""
        x = self.stem(x)
        for block in self.blocks[: len(self.blocks) if depth is None else depth]:
            x = block(x)
        return torch.flatten(self.pool(x), 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(self.features(x))

    def extra_repr(self) -> str:
        return f"widths={self.widths}, in_hw={self.in_hw}" + (f", stem_pool={self.stem_pool}" if self.stem_pool > 1 else "")


class FilterSubsetExit(nn.Module):
    """An exit that reads only the channels ``index`` of its tapped feature map.

    Args:
        index: channel indices (the top-k of a ranking), in ranked order.
        head: the head applied to the selected channels.
        dropout: optional :class:`RankedDropout` (training only) between selection and head.
        dim: the channel dimension of the batched tapped tensor: 1 for ``(N, C, H, W)`` maps
            (default), 2 for a transformer's tokens ``(N, T, C)``, 3 for channels-last maps
            ``(N, H, W, C)`` (a number, not -1: the bundle program stores it as one).

    Raises:
        ExitError: ``index`` empty, negative or with a repeated channel; ``dim`` not a positive
            int, or other than 1 with a ``dropout`` (ranked dropout drops channels of dim 1).

    Examples:
        >>> import torch
        >>> ex = FilterSubsetExit([3, 0], CompactHead(2, [4], num_classes=10, in_hw=(8, 8)))
        >>> ex(torch.randn(5, 16, 8, 8)).shape, ex.filters
        (torch.Size([5, 10]), 2)
    """

    def __init__(self, index: torch.Tensor | Sequence[int], head: nn.Module, dropout: nn.Module | None = None,
                 dim: int = 1) -> None:
        super().__init__()
        index = torch.as_tensor(index, dtype=torch.long).flatten()
        if index.numel() == 0 or len(set(index.tolist())) != index.numel() or int(index.min()) < 0:
            raise ExitError(f"`index` must list distinct, non-negative channel indices, got {index.tolist()}")
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
            raise ExitError(f"`dim` must be a positive int (1: channels-first maps, 2: tokens, 3: channels-last "
                            f"maps), got {dim!r}")
        if dim != 1 and dropout is not None:
            raise ExitError(f"`dropout` (RankedDropout) drops channels of dim 1, so it cannot run with dim={dim}. "
                            f"HINT: leave dropout=None on token exits")
        self.dim = dim
        self.register_buffer("index", index)
        self.dropout = dropout
        self.head = head

    @property
    def filters(self) -> int:
        return int(self.index.numel())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.index_select(self.dim, self.index)
        if self.dropout is not None:
            x = self.dropout(x)
        return self.head(x)

    def extra_repr(self) -> str:
        return f"filters={self.filters}"


def fine_grained_exit(
    in_shape: tuple[int, int, int],
    index: torch.Tensor | Sequence[int],
    num_classes: int,
    head: str | HeadFactory | None = None,
    *,
    layout: str = "channels_first",
    **head_kwargs: Any,
) -> FilterSubsetExit:
    """An exit on the top-k filters ``index`` of a tapped tensor, with a registry head.

    Args:
        in_shape: per-sample shape of the tapped tensor: ``(C, H, W)``, or ``(T, C)`` /
            ``(H, W, C)`` for a transformer's stream.
        index: the channels the exit reads (the top-k of a ranking), in ranked order.
        num_classes: logits it returns.
        head: a registered head name (:func:`~nestflex.exits.list_heads`) or a factory; ``None``
            (default): ``sdn`` on maps, ``token`` on the token layouts.
        layout: the tapped tensor's layout (:attr:`nestflex.graph.CutPoint.layout`):
            ``channels_first`` (default), ``tokens`` or ``channels_last``; the channels are dim 1
            of the first, the last dim of the others.
        **head_kwargs: the head factory's own arguments.

    Returns:
        a :class:`FilterSubsetExit` with the head built for the selected channels
        (``(len(index), H, W)``, or ``(T, len(index))`` on tokens).

    Raises:
        ExitError: an index outside the tapped tensor's channels, an unknown head or layout.

    Examples:
        >>> ex = fine_grained_exit((32, 8, 8), [5, 1, 7], num_classes=10)
        >>> ex(torch.randn(2, 32, 8, 8)).shape
        torch.Size([2, 10])
        >>> fine_grained_exit((17, 48), [5, 1, 7], 10, layout="tokens")(torch.randn(2, 17, 48)).shape
        torch.Size([2, 10])
    """
    head = default_head(layout) if head is None else head  # an unknown layout fails here
    first = layout == "channels_first"
    channels = in_shape[0] if first else in_shape[-1]
    index = torch.as_tensor(index, dtype=torch.long).flatten()
    if index.numel() and (int(index.max()) >= channels or int(index.min()) < 0):
        raise ExitError(
            f"`index` {index.tolist()} selects channels outside the tapped {'map' if first else 'tensor'}'s "
            f"{channels} channels"
        )
    sub = (int(index.numel()), *in_shape[1:]) if first else (*in_shape[:-1], int(index.numel()))
    return FilterSubsetExit(index, create_head(head, sub, num_classes, layout=layout, **head_kwargs),
                            dim=1 if first else len(in_shape))
