import pytest
import torch

from nestflex import GraphError, ProfileError
from nestflex.models import create_model
from nestflex.profiling import lowest_bits, profile_split_quantization
from tests.conftest import settle_batchnorm


@pytest.fixture(scope="module")
def profiled():
    torch.manual_seed(0)
    model = settle_batchnorm(create_model("resnet20", width=0.25))
    x = torch.randn(48, 3, 32, 32)
    y = model(x).argmax(1)  # labels the float model gets right: drops are then pure quantisation
    batches = [(x[i : i + 16], y[i : i + 16]) for i in range(0, 48, 16)]
    splits = ["layer1.0.relu1", "layer2.0.relu2", "layer3.2.relu1"]
    return model, profile_split_quantization(model, batches, splits=splits, bitwidths=(2, 4, 8, 16),
                                             size_samples=8)


def test_float_transfer_is_exact_and_drops_shrink_with_bits(profiled):
    model, prof = profiled
    assert prof["float_accuracy"] == 1.0 and prof["samples"] == 48
    assert [row["name"] for row in prof["splits"]] == ["layer1.0.relu1", "layer2.0.relu2", "layer3.2.relu1"]
    for row in prof["splits"]:
        by_bits = {r["bits"]: r for r in row["per_bits"]}
        assert by_bits[None]["drop_points"] == 0 and by_bits[None]["accuracy"] == 1.0
        assert by_bits[16]["drop_points"] <= by_bits[2]["drop_points"]
        # fewer bits, fewer bytes on the wire; float costs more than its raw size only by the header
        assert by_bits[2]["bytes_mean"] < by_bits[8]["bytes_mean"] < by_bits[None]["bytes_mean"]
        assert by_bits[4]["ratio"] > 1
        for e in row["range_error"]:
            assert e["isquant_mae"] <= e["fixed_mae"] + 1e-9  # a per-sample range is never wider
    assert model.training is False  # the fixture's eval mode is kept


def test_skip_tensor_is_quantised_too(profiled):
    _, prof = profiled
    inside_block = prof["splits"][0]
    assert [t["name"] for t in inside_block["tensors"]] == ["relu", "layer1_0_relu1"]
    assert inside_block["float_bytes_per_sample"] == 2 * 4 * 4 * 32 * 32


def test_lowest_bits_picks_the_smallest_within_budget():
    row = {"per_bits": [{"bits": 2, "drop_points": 7.0}, {"bits": 3, "drop_points": 1.5},
                        {"bits": 4, "drop_points": 0.4}, {"bits": None, "drop_points": 0.0}]}
    assert lowest_bits(row, 1) == 4 and lowest_bits(row, 2) == 3 and lowest_bits(row, 10) == 2
    assert lowest_bits({"per_bits": [{"bits": 2, "drop_points": 3.0}]}, 1) is None


@pytest.mark.parametrize("bits", [0, 33, 2.5])
def test_bad_bitwidth_is_named(bits):
    with pytest.raises(ProfileError, match=rf"`bitwidths` entries must be ints in \[1, 16\] or None \(float\), got {bits}"):
        profile_split_quantization(create_model("resnet20", width=0.25), [], bitwidths=(bits,))


def test_unknown_split_lists_the_valid_ones():
    model = create_model("vgg11", width=0.125).eval()
    batches = [(torch.randn(4, 3, 32, 32), torch.zeros(4, dtype=torch.long))]
    with pytest.raises(GraphError, match="no split point 'features.relu99'; split points: features.relu1"):
        profile_split_quantization(model, batches, splits=["features.relu99"])


def test_empty_data_is_explained():
    with pytest.raises(ProfileError, match="`batches` yielded no data"):
        profile_split_quantization(create_model("vgg11", width=0.125), [])
