"""timm models with a CIFAR stem.

ImageNet stems shrink a 32x32 input 4x (ResNet: 7x7/2 conv + max-pool) or 2x (MobileNet /
EfficientNet: 3x3/2 ``conv_stem``) before the first block, which leaves too little resolution
for CIFAR. The adapter replaces the ResNet stem by a 3x3/1 conv without max-pool, and sets the
``conv_stem`` stride to 1 for the conv_stem families. timm is imported lazily: it is a training
dependency (``pip install nestflex[train]``).
"""

from __future__ import annotations

from torch import nn

from nestflex.errors import ModelError

__all__ = ["create_timm_model"]


def create_timm_model(name: str, num_classes: int = 10, width: float = 1.0, cifar_stem: bool = True, **kwargs) -> nn.Module:
    """``timm.create_model(name, pretrained=False, num_classes=...)`` plus a CIFAR stem.

    Args:
        name: a timm model name, e.g. ``"resnet18"`` or ``"mobilenetv2_100"``.
        num_classes: classifier outputs.
        width: must be 1.0 (timm encodes width in the name, e.g. ``mobilenetv2_050``).
        cifar_stem: adapt the stem to 32x32 inputs (see the module docstring); the model then
            records ``input_shape = (in_chans, 32, 32)``.
        **kwargs: passed to ``timm.create_model`` (``in_chans`` included).

    Raises:
        ModelError: unknown timm name, ``width`` != 1, or a stem this adapter does not know.
    """
    try:
        import timm
    except ImportError as e:  # pragma: no cover - depends on the install
        raise ModelError(
            f"model `timm:{name}` needs timm. HINT: pip install 'nestflex[train]'"
        ) from e
    if width != 1.0:
        raise ModelError(
            f"`width`={width} is not supported for timm models; timm encodes width in the name "
            f"(e.g. `mobilenetv2_050`). HINT: pass width=1.0"
        )
    if not timm.is_model(name):
        raise ModelError(f"unknown timm model `{name}`. HINT: see timm.list_models('{name[:4]}*')")
    # pretrained=False always: nothing may download weights at run time.
    model = timm.create_model(name, pretrained=False, num_classes=num_classes, **kwargs)
    if cifar_stem:
        _cifar_stem(model, name)
        # what nestflex traces it at by default (graph.input_shape_of); timm's own input_size is ImageNet's
        model.input_shape = (int(kwargs.get("in_chans", 3)), 32, 32)
    model.num_classes = num_classes
    return model


def _cifar_stem(model: nn.Module, name: str) -> None:
    conv1 = getattr(model, "conv1", None)
    if isinstance(conv1, nn.Conv2d) and hasattr(model, "maxpool"):
        model.conv1 = nn.Conv2d(conv1.in_channels, conv1.out_channels, 3, 1, 1, bias=conv1.bias is not None)
        model.maxpool = nn.Identity()
        return
    stem = getattr(model, "conv_stem", None)
    if isinstance(stem, nn.Conv2d):
        stem.stride = (1, 1)
        return
    raise ModelError(
        f"no CIFAR stem rule for timm model `{name}` (it has neither `conv1`+`maxpool` nor "
        f"`conv_stem`). HINT: pass cifar_stem=False to keep the ImageNet stem"
    )
