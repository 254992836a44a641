"""Exit heads (internal classifiers) and their registry.

A head factory is called as ``factory(in_shape, num_classes, **kwargs)`` with the per-sample
shape ``(C, H, W)`` of the tapped feature map and returns an ``nn.Module`` mapping
``(N, C, H, W)`` features to ``(N, num_classes)`` logits.

Built in:

* ``sdn`` (Shallow-Deep Networks, Kaya et al. 2019): the feature map is reduced to at most 4x4
  by a learned mix of max and average pooling, ``a * maxpool + (1 - a) * avgpool`` with one
  learnable scalar ``a`` (SDN initialises it at random; we start at 0.5 so runs are
  reproducible without a seed), then flattened into one linear layer. Cheap: a few thousand MACs.
* ``msdnet`` (MSDNet's classifier, which SPINN uses at every exit): two 3x3 stride-2 conv + BN +
  ReLU blocks, global average pooling, linear. MSDNet uses 128 channels; here ``channels``
  defaults to the tapped map's own channel count so a head never costs more than the narrow
  backbones nestflex trains on CPU (pass ``channels=128`` for MSDNet's).

* ``token`` (exits on transformers: SDN-style and SPINN-style exits on ViTs read the class
  token or the mean of the tokens after a block): the class token (``pool="cls"``) or the mean of
  the tokens (``pool="mean"``, default), a LayerNorm, a linear layer. It reads a residual stream
  ``(N, T, C)``, or Swin's channels-last ``(N, H, W, C)`` as ``H * W`` tokens.

Heads are built for a cut point's ``layout`` (:attr:`~nestflex.graph.CutPoint.layout`): ``sdn``
and ``msdnet`` read channels-first maps, ``token`` reads tokens and channels-last maps; a
factory of your own gets the shape as it is, channels last for the token layouts.

Register your own with :func:`register_head`, or pass a factory callable wherever a head name is
accepted.

Examples:
    >>> import torch
    >>> head = create_head("sdn", (16, 32, 32), num_classes=10)
    >>> head(torch.randn(2, 16, 32, 32)).shape
    torch.Size([2, 10])
"""

from __future__ import annotations

from typing import Any, Callable, Union

import torch
from torch import nn

from nestflex.deploy._registry import Registry
from nestflex.deploy.exits import ExitError

__all__ = ["HeadFactory", "LAYOUTS", "default_head", "register_head", "list_heads", "get_head", "create_head",
           "SDNHead", "MSDNetHead", "TokenHead"]

#: the layouts a tapped tensor can have (:attr:`nestflex.graph.CutPoint.layout`), with the per-sample
#: shape each one has
LAYOUTS = {"channels_first": "(C, H, W)", "tokens": "(T, C)", "channels_last": "(H, W, C)"}
#: the built-in heads and the layouts they read
_READS = {"sdn": ("channels_first",), "msdnet": ("channels_first",), "token": ("tokens", "channels_last")}

HeadFactory = Callable[..., nn.Module]
_HEADS: Registry[HeadFactory] = Registry(
    "exit head", ExitError, accepts=callable, register_hint="register your own with `register_head(name)`"
)


def register_head(name: str, *, overwrite: bool = False) -> Callable[[HeadFactory], HeadFactory]:
    """Decorator that registers ``factory(in_shape, num_classes, **kwargs) -> nn.Module``.

    Args:
        name: registry key.
        overwrite: replace an existing entry instead of raising.

    Returns:
        the decorator; it registers the factory and returns it unchanged.

    Raises:
        ExitError: ``name`` is already registered (and ``overwrite`` is false) or empty.

    Examples:
        >>> from torch import nn
        >>> @register_head("linear_probe", overwrite=True)
        ... def linear_probe(in_shape, num_classes):
        ...     return nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(in_shape[0], num_classes))
        >>> "linear_probe" in list_heads()
        True
    """
    return _HEADS.register(name, overwrite=overwrite)


def list_heads() -> list[str]:
    """Names accepted by :func:`get_head`, sorted.

    Returns:
        the registered head names (``msdnet``, ``sdn`` and yours).
    """
    return _HEADS.names()


def get_head(name: Union[str, HeadFactory]) -> HeadFactory:
    """A head factory by name (a callable is returned as is).

    Args:
        name: a registered head name (:func:`list_heads`) or a factory
            ``(in_shape, num_classes, **kwargs) -> nn.Module``.

    Returns:
        the factory.

    Raises:
        ExitError: unknown name; the message lists the registered heads and a close match.

    Examples:
        >>> get_head("sdn").__name__
        'sdn'
    """
    return _HEADS.get(name)


def default_head(layout: str) -> str:
    """The built-in head for a layout: ``sdn`` on channels-first maps, ``token`` on token layouts.

    Args:
        layout: one of :data:`LAYOUTS`.

    Returns:
        the head name.

    Raises:
        ExitError: an unknown layout.
    """
    if layout not in LAYOUTS:
        raise ExitError(f"`layout` must be one of {', '.join(LAYOUTS)}, got {layout!r}")
    return "sdn" if layout == "channels_first" else "token"


def create_head(
    name: Union[str, HeadFactory], in_shape: tuple[int, ...], num_classes: int, *, layout: str = "channels_first",
    **kwargs: Any,
) -> nn.Module:
    """Build a head for a tapped tensor of per-sample shape ``in_shape``.

    Args:
        name: a registered head name or a factory (see :func:`get_head`).
        in_shape: per-sample shape of the tensor the head reads: ``(C, H, W)``, or ``(T, C)`` /
            ``(H, W, C)`` for the token layouts.
        num_classes: logits it returns.
        layout: the tensor's layout, one of :data:`LAYOUTS` (a cut point's
            :attr:`~nestflex.graph.CutPoint.layout`); default ``channels_first``.
        **kwargs: the factory's own arguments (``pool_size`` of ``sdn``, ``channels`` of ``msdnet``,
            ``pool`` of ``token``).

    Returns:
        the head, an ``nn.Module`` ``(N, *in_shape) -> (N, num_classes)``.

    Raises:
        ExitError: unknown head or layout, ``in_shape`` of another rank than ``layout`` has, or a
            built-in head that does not read ``layout`` (``sdn`` on tokens, say).

    Examples:
        >>> import torch
        >>> create_head("sdn", (16, 8, 8), 10)(torch.randn(2, 16, 8, 8)).shape
        torch.Size([2, 10])
        >>> create_head("token", (17, 32), 10, layout="tokens")(torch.randn(2, 17, 32)).shape
        torch.Size([2, 10])
    """
    factory = get_head(name)
    default_head(layout)  # an unknown layout fails with the list
    rank = 2 if layout == "tokens" else 3
    if len(in_shape) != rank:
        what = {"channels_first": "feature maps", "tokens": "token streams", "channels_last": "channels-last maps"}[layout]
        raise ExitError(
            f"exit heads attach to {LAYOUTS[layout]} {what}, got a tensor of per-sample shape {tuple(in_shape)}. "
            f"HINT: place exits at cut points (`trace(model).cut_points`), not after flattening"
        )
    reads = _READS.get(name) if isinstance(name, str) else None
    if reads is not None and layout not in reads:
        raise ExitError(
            f"exit head {name!r} reads {' or '.join(reads)} tensors, not {layout} ones {tuple(in_shape)}. "
            f"HINT: use head={default_head(layout)!r} (or head=None to choose by layout)"
        )
    head = factory(tuple(in_shape), num_classes, **kwargs)
    if not isinstance(head, nn.Module):
        raise ExitError(f"exit head factory `{name}` returned {type(head).__name__}, not an nn.Module")
    return head


class SDNHead(nn.Module):
    """SDN internal classifier: mixed max/avg pooling to at most ``pool_size`` squared, then linear."""

    def __init__(self, in_shape: tuple[int, int, int], num_classes: int, pool_size: int = 4) -> None:
        super().__init__()
        if not isinstance(pool_size, int) or pool_size < 1:
            raise ExitError(f"`pool_size` must be a positive int, got {pool_size!r}")
        c, h, w = in_shape
        self.out_hw = (min(h, pool_size), min(w, pool_size))
        self.max_pool = nn.AdaptiveMaxPool2d(self.out_hw)
        self.avg_pool = nn.AdaptiveAvgPool2d(self.out_hw)
        self.alpha = nn.Parameter(torch.tensor(0.5))
        self.linear = nn.Linear(c * self.out_hw[0] * self.out_hw[1], num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mixed = self.alpha * self.max_pool(x) + (1 - self.alpha) * self.avg_pool(x)
        return self.linear(torch.flatten(mixed, 1))


class MSDNetHead(nn.Module):
    """MSDNet classifier: 2 x (3x3 stride-2 conv, BN, ReLU), global average pooling, linear."""

    def __init__(self, in_shape: tuple[int, int, int], num_classes: int, channels: int | None = None) -> None:
        super().__init__()
        c = in_shape[0]
        channels = c if channels is None else channels
        if not isinstance(channels, int) or channels < 1:
            raise ExitError(f"`channels` must be a positive int or None, got {channels!r}")
        self.features = nn.Sequential(
            nn.Conv2d(c, channels, 3, 2, 1, bias=False),
            nn.BatchNorm2d(channels),
            nn.ReLU(inplace=True),
            nn.Conv2d(channels, channels, 3, 2, 1, bias=False),
            nn.BatchNorm2d(channels),
            nn.ReLU(inplace=True),
        )
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.linear = nn.Linear(channels, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(torch.flatten(self.pool(self.features(x)), 1))


@register_head("sdn")
def sdn(in_shape: tuple[int, int, int], num_classes: int, pool_size: int = 4) -> nn.Module:
    """SDN head (mixed max/avg pooling + linear)."""
    return SDNHead(in_shape, num_classes, pool_size=pool_size)


@register_head("msdnet")
def msdnet(in_shape: tuple[int, int, int], num_classes: int, channels: int | None = None) -> nn.Module:
    """MSDNet-style conv head (SPINN's exits)."""
    return MSDNetHead(in_shape, num_classes, channels=channels)


class TokenHead(nn.Module):
    """Exit head on a transformer's residual stream: class token or mean of the tokens, LayerNorm, linear.

    Args:
        in_shape: per-sample ``(T, C)`` tokens, or ``(H, W, C)`` channels-last (read as ``H * W``
            tokens).
        num_classes: logits it returns.
        pool: ``"mean"`` (the mean of the tokens, as DeiT's and Swin's classifiers pool) or
            ``"cls"`` (token 0, a ViT's class token).

    Raises:
        ExitError: ``pool`` is neither.
    """

    def __init__(self, in_shape: tuple[int, ...], num_classes: int, pool: str = "mean") -> None:
        super().__init__()
        if pool not in ("mean", "cls"):
            raise ExitError(f"`pool` must be 'mean' or 'cls', got {pool!r}. HINT: 'cls' reads a class token at index 0")
        self.pool = pool
        self.grid = len(in_shape) == 3  # channels-last (H, W, C): flattened to tokens first
        self.norm = nn.LayerNorm(in_shape[-1])
        self.linear = nn.Linear(in_shape[-1], num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.grid:
            x = torch.flatten(x, 1, 2)
        x = x[:, 0] if self.pool == "cls" else x.mean(1)
        return self.linear(self.norm(x))

    def extra_repr(self) -> str:
        return f"pool={self.pool!r}"


@register_head("token")
def token(in_shape: tuple[int, ...], num_classes: int, pool: str = "mean") -> nn.Module:
    """Token head (class token or mean of the tokens + LayerNorm + linear) for transformers."""
    return TokenHead(in_shape, num_classes, pool=pool)
