import pytest
import torch

from nestflex import ModelError
from nestflex.models import create_model, list_models


@pytest.mark.parametrize("name", list_models())
def test_every_registered_model_runs_on_cifar_input(name):
    model = create_model(name, num_classes=7, width=0.25).eval()
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 7)
    assert model.num_classes == 7


@pytest.mark.parametrize("name", list_models())
def test_every_registered_model_takes_greyscale_input(name):
    from nestflex.graph import input_shape_of, trace

    model = create_model(name, width=0.25, in_chans=1).eval()
    assert model(torch.randn(2, 1, 32, 32)).shape == (2, 10)
    assert model.input_shape == (1, 32, 32) == input_shape_of(model)
    assert trace(model).input_shape == (1, 32, 32)  # traced at its own shape without being told
    assert create_model(name, width=0.25).input_shape == (3, 32, 32)


def test_width_multiplier_shrinks_channels():
    full, quarter = create_model("vgg16"), create_model("vgg16", width=0.25)
    assert full.features.conv1.out_channels == 64 and quarter.features.conv1.out_channels == 16
    assert sum(p.numel() for p in quarter.parameters()) < sum(p.numel() for p in full.parameters()) / 10


def test_unknown_model_lists_known_names():
    with pytest.raises(ModelError, match=r"unknown model `vgg61`; known models: resnet20, resnet56, vgg11.*did you mean `vgg16`"):
        create_model("vgg61")


@pytest.mark.parametrize("kwargs, match", [
    ({"width": 0}, "`width`"), ({"num_classes": 1}, "`num_classes`"),
    ({"in_chans": 0}, r"`in_chans` must be an integer >= 1 \(3 for RGB, 1 for greyscale\), got 0"),
])
def test_bad_arguments(kwargs, match):
    with pytest.raises(ModelError, match=match):
        create_model("resnet20", **kwargs)


@pytest.mark.parametrize("name", ["timm:resnet18", "timm:mobilenetv2_100"])
def test_timm_models_get_a_cifar_stem(name):
    model = create_model(name).eval()
    # the CIFAR stem keeps 32x32 resolution into the first block
    feats = model.forward_features(torch.randn(1, 3, 32, 32))
    assert feats.shape[-1] == (4 if "resnet" in name else 2)
    assert model(torch.randn(1, 3, 32, 32)).shape == (1, 10)
    grey = create_model(name, in_chans=1).eval()
    assert grey(torch.randn(1, 1, 32, 32)).shape == (1, 10) and grey.input_shape == (1, 32, 32)


@pytest.mark.parametrize("name", ["timm:regnetx_002", "timm:densenet121", "timm:convnext_atto"])
def test_models_without_a_named_stem_get_the_general_rule(name):
    # the strided layers of the first 4x (stem convs, a max-pool, RegNet's first stage, ConvNeXt's
    # 4x4/4 patchify conv) run at stride 1; the 8x of the later stages stay: 4x4 features
    model = create_model(name).eval()
    feats = model.forward_features(torch.randn(1, 3, 32, 32))
    assert feats.shape[-1] == 4, feats.shape
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 10) and model.input_shape == (3, 32, 32)


def test_your_own_stem_function():
    seen = []
    model = create_model("timm:resnet18", cifar_stem=seen.append)
    assert seen == [model] and model.input_shape == (3, 32, 32)
    assert model.conv1.stride == (2, 2)  # the function did nothing: the ImageNet stem stays


def test_timm_errors():
    with pytest.raises(ModelError, match="unknown timm model `resnet_nope`"):
        create_model("timm:resnet_nope")
    with pytest.raises(ModelError, match="`width`=0.5 is not supported for timm"):
        create_model("timm:resnet18", width=0.5)
    with pytest.raises(ModelError, match="no CIFAR stem rule .* HINT: pass cifar_stem=False"):
        create_model("timm:vit_tiny_patch16_224")
