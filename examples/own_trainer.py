#!/usr/bin/env python
"""Add nestflex to your own Trainer: your LightningModule and data, nestflex's callbacks.

    python examples/own_trainer.py --out runs/own_trainer          # about a minute on 2 CPU cores

Prune (NestDNN) -> grow nested levels + FlexDNN exits -> progressive exits + the bundle -> deploy.
No input shape is stated anywhere: the callbacks read it from the data.
"""

from nestflex.deploy.runtime.capacity import CapacityRuntime
import argparse

import pytorch_lightning as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import nestflex.deploy
from nestflex.callbacks import BundleExporter, FilterPruning, FlexDNNExits, FreezeAndGrow, OverthinkingSchedule
from nestflex.capacity import extract_level, num_levels
from nestflex.exits import MultiExitClassifier


class MyNet(nn.Module):  # any CNN: here 1x28x28 inputs, 10 classes
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.AdaptiveAvgPool2d(1))
        self.head = nn.Linear(32, 10)

    def forward(self, x):
        return self.head(self.features(x).flatten(1))


class MyModule(pl.LightningModule):  # your module, unchanged: nestflex finds the network in `self.net`
    def __init__(self):
        super().__init__()
        self.net = MyNet()

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, _):
        return nn.functional.cross_entropy(self(batch[0]), batch[1])

    def validation_step(self, batch, _):
        self.log("val_acc", (self(batch[0]).argmax(1) == batch[1]).float().mean())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


def data(n: int, seed: int) -> DataLoader:
    """Stand-in data (a bright square marks the class); use your own loaders or DataModule."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 10, (n,), generator=g)
    x = torch.rand(n, 1, 28, 28, generator=g) * 0.5
    for i, c in enumerate(y.tolist()):
        x[i, 0, 2 * c:2 * c + 8, 2 * c:2 * c + 8] += 1.0
    return DataLoader(TensorDataset(x, y), batch_size=64, shuffle=seed == 0)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", default="runs/own_trainer")
    p.add_argument("--samples", type=int, default=2048)
    p.add_argument("--epochs", type=int, default=2, help="training epochs per stage")
    a = p.parse_args(argv)
    train, val = data(a.samples, 0), data(a.samples // 4, 1)

    def trainer(*callbacks, epochs):
        return pl.Trainer(max_epochs=epochs, callbacks=list(callbacks), default_root_dir=a.out, logger=False,
                          enable_checkpointing=False, enable_progress_bar=False, accelerator="cpu")

    model = MyModule()
    trainer(epochs=a.epochs).fit(model, train, val)  # 0. your usual training
    pruner = FilterPruning("l1", max_drop=0.02, step=0.25, max_steps=3)  # 1. prune to a seed model
    trainer(pruner, epochs=3 * 3).fit(model, train, val)
    grown, levels = MyModule(), len(pruner.roadmap.footprints)  # 2. grow levels back + FlexDNN exits
    grow = FreezeAndGrow(f"{a.out}/pruning/roadmap.json", levels=levels, epochs_per_level=a.epochs)
    trainer(grow, FlexDNNExits(config={"epochs": 1, "locations": [0.3, 0.6]}),
            epochs=(levels - 1) * a.epochs).fit(grown, train, val)
    largest = extract_level(grown.net, num_levels(grown.net) - 1)  # 3. progressive exits + the bundle
    exits = MultiExitClassifier(backbone=largest, positions=(0.3, 0.6), mode="exits_only", max_epochs=a.epochs)
    exporter = BundleExporter(dirpath=a.out, model=grown.net, flex=f"{a.out}/flexdnn", onnx=False)
    trainer(OverthinkingSchedule(), exporter, epochs=a.epochs).fit(exits, train, val)

    bundle = nestflex.deploy.load(exporter.result["bundle"])  # 4. deployment: no Lightning needed
    x = next(iter(val))[0][:8]
    for k, row in enumerate(bundle.levels):
        print(f"level {k}: {row['macs']:,} MACs, validation accuracy {row['accuracy']}, "
              f"predictions {CapacityRuntime(bundle, k, plan=None)(x).argmax(1).tolist()}")
    print(f"bundle: {exporter.result['bundle']} ({exporter.result['bytes']:,} bytes)")
    return exporter.result


if __name__ == "__main__":
    main()
