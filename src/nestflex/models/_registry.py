"""Model registry: ``register_model`` / ``list_models`` / ``create_model`` (timm's pattern)."""

from __future__ import annotations

import difflib
from typing import Callable

from torch import nn

from nestflex.errors import ModelError

__all__ = ["register_model", "list_models", "create_model", "TIMM_PREFIX"]

#: Names starting with this prefix are handed to :func:`timm.create_model` (with a CIFAR stem).
TIMM_PREFIX = "timm:"

_MODELS: dict[str, Callable[..., nn.Module]] = {}


def register_model(name: str) -> Callable[[Callable[..., nn.Module]], Callable[..., nn.Module]]:
    """Decorator that registers a model constructor under ``name``.

    Args:
        name: the name :func:`create_model` will accept for the decorated constructor.

    Returns:
        A decorator that registers its function and returns it unchanged.

    Raises:
        ModelError: (when the decorator is applied) ``name`` is already registered.
    """

    def wrap(fn: Callable[..., nn.Module]) -> Callable[..., nn.Module]:
        if name in _MODELS:
            raise ModelError(f"model `{name}` is already registered")
        _MODELS[name] = fn
        return fn

    return wrap


def list_models() -> list[str]:
    """Names accepted by :func:`create_model`, sorted; ``timm:<name>`` is accepted too."""
    return sorted(_MODELS)


def create_model(name: str, num_classes: int = 10, width: float = 1.0, in_chans: int = 3, **kwargs) -> nn.Module:
    """Build a registered model.

    Args:
        name: a name from :func:`list_models`, or ``"timm:<timm model name>"``.
        num_classes: size of the classifier output.
        width: channel multiplier (``0.25`` keeps a quarter of every layer's channels).
        in_chans: input image channels (3 for RGB, 1 for greyscale such as MNIST), as timm's.
        **kwargs (Any): passed to the model constructor.

    Raises:
        ModelError: unknown name (the message lists the known ones) or bad argument.

    Examples:
        >>> from nestflex.models import create_model
        >>> model = create_model("vgg16", width=0.25)
        >>> model.num_classes
        10
    """
    if not isinstance(num_classes, int) or num_classes < 2:
        raise ModelError(f"`num_classes` must be an integer >= 2, got {num_classes!r}")
    if not (isinstance(width, (int, float)) and 0 < width <= 4):
        raise ModelError(f"`width` must be a number in (0, 4], got {width!r}")
    if isinstance(in_chans, bool) or not isinstance(in_chans, int) or in_chans < 1:
        raise ModelError(f"`in_chans` must be an integer >= 1 (3 for RGB, 1 for greyscale), got {in_chans!r}")
    if name.startswith(TIMM_PREFIX):
        from nestflex.models.timm_adapter import create_timm_model

        return create_timm_model(name[len(TIMM_PREFIX):], num_classes=num_classes, width=width, in_chans=in_chans,
                                 **kwargs)
    if name not in _MODELS:
        close = difflib.get_close_matches(name, list(_MODELS), n=1)
        hint = f" HINT: did you mean `{close[0]}`?" if close else ""
        raise ModelError(
            f"unknown model `{name}`; known models: {', '.join(list_models())}, "
            f"or `{TIMM_PREFIX}<name>` for any timm model.{hint}"
        )
    if in_chans != 3:  # only then: a registered constructor without `in_chans` keeps working for RGB
        kwargs["in_chans"] = in_chans
    return _MODELS[name](num_classes=num_classes, width=width, **kwargs)


def scaled(channels: int, width: float) -> int:
    """Channel count after a width multiplier (at least 1)."""
    return max(1, int(round(channels * width)))
