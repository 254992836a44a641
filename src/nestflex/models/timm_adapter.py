"""timm models with a CIFAR stem.

ImageNet stems shrink a 32x32 input 4x (ResNet: 7x7/2 conv + max-pool) or 2x (MobileNet /
EfficientNet: 3x3/2 ``conv_stem``) before the first block, which leaves too little resolution
for CIFAR. The adapter replaces the ResNet stem by a 3x3/1 conv without max-pool, and sets the
``conv_stem`` stride to 1 for the conv_stem families. Any other CNN gets the general rule: the
layers that make the first 4x of downsampling (what an ImageNet stem does; found by running the
model once) stop downsampling: an overlapping strided conv or pool keeps its kernel with stride 1
and "same" padding, a patchifying one (kernel = stride) becomes a 3x3/1 conv with the same
channels and groups, a non-overlapping pool goes. A model the rule cannot adapt (a transformer
whose position embedding fixes its input size) raises; ``cifar_stem`` also takes your own
function. timm is imported lazily: it is a training dependency (``pip install nestflex[train]``).
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from nestflex.errors import ModelError

__all__ = ["create_timm_model"]


def create_timm_model(name: str, num_classes: int = 10, width: float = 1.0,
                      cifar_stem: bool | Callable[[nn.Module], object] = True, **kwargs) -> nn.Module:
    """``timm.create_model(name, pretrained=False, num_classes=...)`` plus a CIFAR stem.

    Args:
        name: a timm model name, e.g. ``"resnet18"`` or ``"mobilenetv2_100"``.
        num_classes: classifier outputs.
        width: must be 1.0 (timm encodes width in the name, e.g. ``mobilenetv2_050``).
        cifar_stem: adapt the stem to 32x32 inputs (see the module docstring), or a function
            that adapts the model in place (your own stem); the model then records
            ``input_shape = (in_chans, 32, 32)``. ``False`` keeps the ImageNet stem.
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
        if callable(cifar_stem):
            cifar_stem(model)
        else:
            _cifar_stem(model, name, int(kwargs.get("in_chans", 3)))
        # what nestflex traces it at by default (graph.input_shape_of); timm's own input_size is ImageNet's
        model.input_shape = (int(kwargs.get("in_chans", 3)), 32, 32)
    model.num_classes = num_classes
    return model


def _cifar_stem(model: nn.Module, name: str, in_chans: int) -> None:
    conv1 = getattr(model, "conv1", None)
    if isinstance(conv1, nn.Conv2d) and hasattr(model, "maxpool"):
        model.conv1 = nn.Conv2d(conv1.in_channels, conv1.out_channels, 3, 1, 1, bias=conv1.bias is not None)
        model.maxpool = nn.Identity()
        return
    stem = getattr(model, "conv_stem", None)
    if isinstance(stem, nn.Conv2d):
        stem.stride = (1, 1)
        return
    _undo_first_downsampling(model, name, in_chans)


#: the spatial reduction an ImageNet stem makes, and the size the general rule probes it at
_STEM_REDUCTION, _PROBE = 4, 64


def _undo_first_downsampling(model: nn.Module, name: str, in_chans: int) -> None:
    """The general rule (module docstring): the convs and pools that downsample while the map is
    larger than 1/4 of the input stop downsampling."""
    hint = ("HINT: pass cifar_stem=False to keep the ImageNet stem (and feed the model its own input size), "
            "or cifar_stem=your_function to adapt the model yourself")
    order: list[tuple[str, nn.Module, int, int]] = []
    names = {m: n for n, m in model.named_modules()}

    def hook(module, args, out):
        x = args[0] if args else None
        if isinstance(x, torch.Tensor) and isinstance(out, torch.Tensor) and x.dim() == 4 and out.dim() == 4:
            order.append((names[module], module, x.shape[-1], out.shape[-1]))

    handles = [m.register_forward_hook(hook) for m in model.modules()
               if isinstance(m, (nn.Conv2d, nn.MaxPool2d, nn.AvgPool2d))]
    was_training = model.training
    try:
        with torch.no_grad():
            model.eval()(torch.zeros(1, in_chans, _PROBE, _PROBE))
    except Exception as e:
        raise ModelError(f"no CIFAR stem rule for timm model `{name}`: it does not run on a {_PROBE}x{_PROBE} input "
                         f"({type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}). {hint}") from None
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)
    # every conv or pool that downsamples a map larger than the stem's output: the main path's and
    # a residual shortcut's (RegNet's first block downsamples both)
    strided = [(qual, module) for qual, module, size_in, size_out in order
               if size_in > _PROBE // _STEM_REDUCTION and size_out < size_in]
    if not strided:
        raise ModelError(f"no CIFAR stem rule for timm model `{name}`: no conv or pool downsamples its input "
                         f"before the first {_STEM_REDUCTION}x. {hint}")
    for qual, module in strided:
        _set_submodule(model, qual, _without_stride(module))


def _without_stride(module: nn.Module) -> nn.Module:
    """The module with stride 1 and the same output size; timm's dynamically padded ``*Same``
    variants are replaced (their forward would pad again)."""
    k = module.kernel_size if isinstance(module.kernel_size, tuple) else (module.kernel_size,) * 2
    s = module.stride if isinstance(module.stride, tuple) else (module.stride,) * 2
    overlapping = all(ki > si and ki % 2 for ki, si in zip(k, s))
    in_place = overlapping and "Same" not in type(module).__name__
    if isinstance(module, nn.Conv2d):
        if not overlapping:  # a patchifying conv: a 3x3 one with the same channels and groups
            k, module.dilation = (3, 3), (1, 1)
        pad = tuple((ki - 1) // 2 * di for ki, di in zip(k, module.dilation))
        if in_place:
            module.stride, module.padding = (1, 1), pad
            return module
        return nn.Conv2d(module.in_channels, module.out_channels, k, 1, pad, module.dilation, module.groups,
                         bias=module.bias is not None)
    if not overlapping:
        return nn.Identity()
    if in_place:
        module.stride, module.padding = 1, tuple((ki - 1) // 2 for ki in k)
        return module
    pool = nn.MaxPool2d if isinstance(module, nn.MaxPool2d) else nn.AvgPool2d
    return pool(k, 1, tuple((ki - 1) // 2 for ki in k))


def _set_submodule(model: nn.Module, qual: str, new: nn.Module) -> None:
    parent, _, last = qual.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, last, new)
