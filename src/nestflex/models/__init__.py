"""CIFAR models and a registry: ``list_models()``, ``create_model(name, num_classes, width)``."""

from nestflex.models import resnet as _resnet  # noqa: F401  (registers resnet20/56)
from nestflex.models import vgg as _vgg  # noqa: F401  (registers vgg11/13/16)
from nestflex.models._registry import TIMM_PREFIX, create_model, list_models, register_model
from nestflex.models.resnet import BasicBlock, CifarResNet
from nestflex.models.vgg import VGG, VGG_CONFIGS

__all__ = [
    "TIMM_PREFIX",
    "create_model",
    "list_models",
    "register_model",
    "VGG",
    "VGG_CONFIGS",
    "CifarResNet",
    "BasicBlock",
]
