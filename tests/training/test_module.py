import pytest
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

from nestflex import ModelError
from nestflex.training import ImageClassifier


def _loader(n=32):
    g = torch.Generator().manual_seed(0)
    return DataLoader(TensorDataset(torch.randn(n, 3, 32, 32, generator=g), torch.randint(0, 10, (n,), generator=g)),
                      batch_size=8)


def test_fast_dev_run_trains_validates_and_tests(tmp_path):
    module = ImageClassifier("resnet20", width=0.25, max_epochs=1)
    before = [p.detach().clone() for p in module.parameters()]
    trainer = pl.Trainer(fast_dev_run=True, accelerator="cpu", default_root_dir=tmp_path, logger=False,
                         enable_progress_bar=False)
    trainer.fit(module, _loader(), _loader())
    assert any(not torch.equal(a, b) for a, b in zip(before, module.parameters()))
    result = trainer.test(module, _loader(), verbose=False)[0]
    assert 0.0 <= result["test_acc"] <= 1.0


def test_checkpoint_rebuilds_the_network(tmp_path):
    module = ImageClassifier("vgg11", width=0.25, num_classes=7, max_epochs=1)
    trainer = pl.Trainer(max_epochs=1, limit_train_batches=1, limit_val_batches=0, accelerator="cpu",
                         default_root_dir=tmp_path, logger=False, enable_progress_bar=False)
    x = torch.randn(2, 3, 32, 32)
    data = DataLoader(TensorDataset(torch.randn(8, 3, 32, 32), torch.randint(0, 7, (8,))), batch_size=4)
    trainer.fit(module, data)
    trainer.save_checkpoint(tmp_path / "m.ckpt", weights_only=True)
    loaded = ImageClassifier.load_from_checkpoint(tmp_path / "m.ckpt", map_location="cpu", weights_only=True).eval()
    module.eval()
    assert torch.equal(loaded(x), module(x))
    assert loaded.hparams.num_classes == 7


@pytest.mark.parametrize("kwargs, match", [({"lr": 0}, "`lr`"), ({"momentum": 1.0}, "`momentum`"),
                                           ({"max_epochs": 0}, "`max_epochs`")])
def test_bad_hyperparameters(kwargs, match):
    with pytest.raises(ModelError, match=match):
        ImageClassifier("resnet20", **kwargs)
