"""LightningDataModules: splits, subsets, dataloaders, errors."""

from __future__ import annotations

import pytest
import torch

from nestflex.data import CIFAR10_MEAN, CIFAR10DataModule, SyntheticDataModule
from nestflex.data import cifar as cifar_mod
from nestflex.data.cifar import CIFAR10_CLASSES
from nestflex.data.synthetic import SYNTHETIC_CLASSES
from nestflex.errors import DataError

N = 24  # images per fake CIFAR batch


def _small_synthetic(**kwargs) -> SyntheticDataModule:
    args = {"batch_size": 16, "train_size": 300, "test_size": 60, "val_size": 50} | kwargs
    return SyntheticDataModule(**args)


def test_synthetic_splits_and_batches():
    dm = _small_synthetic()
    assert (dm.name, dm.synthetic, dm.num_classes, dm.classes) == ("synthetic", True, 10, SYNTHETIC_CLASSES)
    dm.setup("fit")
    assert (len(dm.train_dataset), len(dm.val_dataset), len(dm.test_dataset)) == (250, 50, 60)
    train_idx, val_idx = set(dm.train_indices.tolist()), set(dm.val_indices.tolist())
    assert not train_idx & val_idx and train_idx | val_idx == set(range(300))
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape == (16, 3, 32, 32) and x.dtype == torch.float32
    assert y.shape == (16,) and y.dtype == torch.int64
    xv, _ = next(iter(dm.val_dataloader()))
    assert abs(float(xv.mean())) < 0.3 and 0.7 < float(xv.std()) < 1.3  # normalised
    # Validation and test are not augmented: the first val batch is the stored images, normalised.
    base = dm.val_dataset.dataset
    first = dm.val_indices[0]
    mean, std = torch.tensor(dm.mean).view(3, 1, 1), torch.tensor(dm.std).view(3, 1, 1)
    expected = (base.images[first].float() / 255 - mean) / std
    assert torch.allclose(xv[0], expected, atol=1e-6)
    assert len(dm.test_dataloader()) == 4  # 60 / 16, last partial batch kept
    assert len(dm.train_dataloader()) == 250 // 16  # partial training batch dropped (BatchNorm)
    assert dm.test_dataset.difficulty.shape == (60,)
    assert dm.describe()["train_samples"] == 250 and dm.describe()["synthetic"] is True


def test_split_is_seeded():
    a, b, c = _small_synthetic(), _small_synthetic(), _small_synthetic(seed=1)
    for dm in (a, b, c):
        dm.setup()
    assert torch.equal(a.val_indices, b.val_indices) and torch.equal(a.train_indices, b.train_indices)
    assert not torch.equal(a.val_indices, c.val_indices)
    ya = torch.cat([y for _, y in a.train_dataloader()])
    yb = torch.cat([y for _, y in b.train_dataloader()])
    assert torch.equal(ya, yb)  # same shuffle order


def test_max_train_samples_and_fraction():
    dm = _small_synthetic(max_train_samples=40, val_size=0.2)
    dm.setup()
    assert len(dm.val_dataset) == 60 and len(dm.train_dataset) == 40
    full = _small_synthetic(val_size=0.2)
    full.setup()
    assert torch.equal(dm.val_indices, full.val_indices)  # the subset never touches the hold-out
    assert set(dm.train_indices.tolist()) <= set(full.train_indices.tolist())
    big = _small_synthetic(max_train_samples=10_000)
    big.setup()
    assert len(big.train_dataset) == 250  # capped at what is left


def test_setup_is_idempotent():
    dm = _small_synthetic()
    dm.setup("fit")
    ds = dm.train_dataset
    dm.setup("test")
    assert dm.train_dataset is ds


def test_dataloader_before_setup():
    with pytest.raises(DataError, match=r"SyntheticDataModule: call `setup\(\)` before asking for a"):
        _small_synthetic().train_dataloader()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"batch_size": 0}, r"`batch_size` must be an integer >= 1, got 0"),
        ({"num_workers": -1}, r"`num_workers` must be an integer >= 0, got -1"),
        ({"max_train_samples": 0}, r"`max_train_samples` must be an integer >= 1 or None, got 0"),
        ({"val_size": 0}, r"`val_size` must be a count >= 1 or a fraction in \(0, 1\), got 0\. HINT"),
        ({"val_size": 1.5}, r"`val_size` must be a count >= 1 or a fraction in \(0, 1\), got 1\.5"),
        ({"seed": -3}, r"`seed` must be an integer >= 0, got -3"),
        ({"train_size": 1}, r"`train_size` must be an integer >= 2, got 1"),
        ({"test_size": 0}, r"`test_size` must be an integer >= 1, got 0"),
    ],
)
def test_synthetic_argument_errors(kwargs, match):
    with pytest.raises(DataError, match=match):
        _small_synthetic(**kwargs)


def test_val_size_too_large():
    dm = _small_synthetic(val_size=300)
    match = r"`val_size`=300 holds out 300 of the 300 samples of the synthetic training split; .*HINT"
    with pytest.raises(DataError, match=match):
        dm.setup()
    with pytest.raises(DataError, match=r"`val_size`=0\.001 holds out 0 of the 300 samples"):
        _small_synthetic(val_size=0.001).setup()


def test_cifar_datamodule(fake_cifar):
    dm = CIFAR10DataModule(fake_cifar["root"], batch_size=8, val_size=20, max_train_samples=50)
    assert (dm.name, dm.synthetic, dm.mean, dm.classes) == ("cifar10", False, CIFAR10_MEAN, CIFAR10_CLASSES)
    dm.prepare_data()  # download=False: nothing happens
    dm.setup()
    assert (len(dm.train_dataset), len(dm.val_dataset), len(dm.test_dataset)) == (50, 20, N)
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape == (8, 3, 32, 32) and x.dtype == torch.float32 and int(y.max()) <= 9
    xt, yt = next(iter(dm.test_dataloader()))
    assert yt.tolist() == fake_cifar["batches"]["test_batch"][1][:8]
    assert dm.describe()["data_dir"] == str(fake_cifar["root"])


def test_cifar_datamodule_missing_files(tmp_path):
    dm = CIFAR10DataModule(tmp_path / "none", val_size=10)  # construction touches no files
    with pytest.raises(DataError, match=r"CIFAR-10 directory .*none does not exist.*HINT"):
        dm.setup()


def test_cifar_datamodule_download_in_prepare_data(tmp_path, monkeypatch, cifar_factory):
    calls = []

    def fake_download(data_dir):
        calls.append(data_dir)
        return cifar_factory(tmp_path / "data")["dir"]

    monkeypatch.setattr(cifar_mod, "download_cifar10", fake_download)
    import nestflex.data.datamodule as dm_mod

    monkeypatch.setattr(dm_mod, "download_cifar10", fake_download)
    dm = CIFAR10DataModule(tmp_path / "data", download=True, val_size=10)
    dm.prepare_data()
    assert calls == [str(tmp_path / "data")]
    dm.setup()
    assert len(dm.test_dataset) == N


def test_works_with_a_lightning_trainer():
    import pytorch_lightning as pl
    from torch import nn

    class Tiny(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 10))

        def training_step(self, batch, _):
            x, y = batch
            return nn.functional.cross_entropy(self.net(x), y)

        def validation_step(self, batch, _):
            x, y = batch
            self.log("val_loss", nn.functional.cross_entropy(self.net(x), y))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    trainer = pl.Trainer(fast_dev_run=2, accelerator="cpu", logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(Tiny(), datamodule=_small_synthetic())
    assert trainer.state.finished
