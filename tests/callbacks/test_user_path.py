"""A user's own model and data, end to end through the public callbacks only.

Prune -> grow (+ FlexDNN exits) -> progressive exits (+ the bundle) -> deploy, for a grayscale
1x16x16 model, a 3x64x64 one and a LightningModule that keeps its network under another
attribute. Nothing states an input shape: every callback takes it from the data.
"""

import pytest
import pytorch_lightning as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import nestflex.deploy as nd
from nestflex.callbacks import BundleExporter, FilterPruning, FlexDNNExits, FreezeAndGrow, OverthinkingSchedule
from nestflex.capacity import extract_level, num_levels
from nestflex.exits import MultiExitClassifier
from nestflex.graph import trace
from nestflex.pruning import Roadmap

CLASSES = 4
FLEX = {"locations": [0.3, 0.6], "exits_per_location": 2, "epochs": 1, "rank_samples": 64, "fit_samples": 64,
        "refit_iters": 20}


class UserNet(nn.Module):
    """A small CNN of the kind users write: no `input_shape` attribute, global pooling."""

    def __init__(self, in_chans: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(in_chans, 12, 3, padding=1), nn.BatchNorm2d(12), nn.ReLU(),
            nn.Conv2d(12, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 24, 3, padding=1), nn.BatchNorm2d(24), nn.ReLU(),
        )
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(24, CLASSES)

    def forward(self, x):
        return self.fc(torch.flatten(self.pool(self.body(x)), 1))


class UserModule(pl.LightningModule):
    def __init__(self, in_chans: int, attr: str = "model") -> None:
        super().__init__()
        self.attr = attr
        setattr(self, attr, UserNet(in_chans))

    @property
    def net(self) -> nn.Module:
        return getattr(self, self.attr)

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, _):
        x, y = batch
        return nn.functional.cross_entropy(self(x), y)

    def validation_step(self, batch, _):
        x, y = batch
        self.log("val_acc", (self(x).argmax(1) == y).float().mean())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


def _loaders(shape, n_train=128, n_val=96):
    """Learnable data: the class is the brightest quadrant."""
    g = torch.Generator().manual_seed(0)
    x = torch.rand(n_train + n_val, *shape, generator=g)
    h, w = shape[1] // 2, shape[2] // 2
    y = torch.randint(0, CLASSES, (n_train + n_val,), generator=g)
    for i, c in enumerate(y.tolist()):
        x[i, :, (c // 2) * h:(c // 2 + 1) * h, (c % 2) * w:(c % 2 + 1) * w] += 1.0
    train = DataLoader(TensorDataset(x[:n_train], y[:n_train]), batch_size=32, shuffle=True,
                       generator=torch.Generator().manual_seed(0))
    val = DataLoader(TensorDataset(x[n_train:], y[n_train:]), batch_size=32)
    return train, val


def _trainer(root, callbacks, epochs):
    return pl.Trainer(max_epochs=epochs, callbacks=callbacks, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, accelerator="cpu", default_root_dir=root)


@pytest.mark.parametrize(("shape", "attr"), [((1, 16, 16), "model"), ((3, 64, 64), "model"), ((3, 24, 24), "backbone")],
                         ids=["gray16", "rgb64", "other_attribute"])
def test_users_model_and_data_go_from_pruning_to_deployment(tmp_path, shape, attr):
    pl.seed_everything(0)
    train, val = _loaders(shape)
    x = next(iter(val))[0][:4]

    # 1. prune: the shape comes from the data, names are relative to the network
    module = UserModule(shape[0], attr)
    _trainer(tmp_path, [FilterPruning("l1", goal=0.01, step=0.3, allocation="uniform")], epochs=3).fit(module, train, val)
    road = Roadmap.load(tmp_path / "pruning" / "roadmap.json")
    assert road.network == attr and road.input_shape == list(shape)
    assert road.footprints[0].macs == trace(UserNet(shape[0]), shape).macs()  # MACs at the real shape
    assert all(not name.startswith(f"{attr}.") for name in road.groups) and len(road.footprints) >= 3

    # 2. grow the levels from the roadmap and plan FlexDNN exits on the largest one
    grown = UserModule(shape[0], attr)
    flex = FlexDNNExits(config=FLEX, calibration_fraction=0.5)
    _trainer(tmp_path, [FreezeAndGrow(tmp_path / "pruning" / "roadmap.json", levels=3), flex], epochs=2).fit(
        grown, train, val)
    net = grown.net.eval()
    K = num_levels(net)
    assert K == 3 and flex.result.network is not None

    # 3. progressive exits on the largest level; the bundle collects levels, both exit sets and profiles
    exits = MultiExitClassifier(backbone=extract_level(net, K - 1), num_classes=CLASSES, positions=(0.3, 0.6),
                                mode="exits_only", max_epochs=1)
    exporter = BundleExporter(dirpath=tmp_path, model=net, flex=tmp_path / "flexdnn", onnx=False, profile_repeats=1)
    _trainer(tmp_path, [OverthinkingSchedule(), exporter], epochs=1).fit(exits, train, val)
    assert exporter.result["exits_backbone"] == "shared" and exporter.result["flex_exits_backbone"] == "shared"

    # 4. deploy: every level and both exit sets reproduce the training side, MACs as traced at the real shape
    bundle = nd.load(exporter.result["bundle"])
    assert bundle.num_levels == K and tuple(bundle.input_spec["shape"]) == shape
    # onnxruntime (the default backend) sums in another order than torch: agreement to float32's
    # relative precision at the logits' scale (1e-4), the torch reference to 1e-5
    with torch.no_grad():
        for k in range(K):
            plain = extract_level(net, k).eval()
            torch.testing.assert_close(nd.CapacityRuntime(bundle, k)(x), plain(x), atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(nd.CapacityRuntime(bundle, k, plan="eager")(x), plain(x), atol=1e-5, rtol=0)
            assert bundle.levels[k]["macs"] == trace(plain, shape).macs()
            assert bundle.levels[k]["accuracy"] is not None  # profiled on the validation loader
        for got, want in zip(nd.ProgressiveRuntime(bundle).all_exits(x), exits.model.eval()(x)):
            torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
        flex_net = flex.result.network.eval()
        for got, want in zip(nd.ProgressiveRuntime(bundle, exit_set="flex_exits").all_exits(x), flex_net(x)):
            torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    assert bundle.exits["calibration"] is not None
