import pytest
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

from nestflex import GraphError, ModelError
from nestflex.graph import trace
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


def test_greyscale_input_shape_builds_traces_and_survives_the_checkpoint(tmp_path):
    module = ImageClassifier("vgg11", width=0.125, max_epochs=1, input_shape=(1, 32, 32))
    assert module.model.features.conv1.in_channels == 1
    assert module.input_shape == module.model.input_shape == (1, 32, 32)
    assert trace(module).input_shape == trace(module.model).input_shape == (1, 32, 32)  # no shape passed
    data = DataLoader(TensorDataset(torch.randn(8, 1, 32, 32), torch.randint(0, 10, (8,))), batch_size=4)
    trainer = pl.Trainer(max_epochs=1, limit_train_batches=1, limit_val_batches=0, accelerator="cpu",
                         default_root_dir=tmp_path, logger=False, enable_progress_bar=False)
    trainer.fit(module, data)
    trainer.save_checkpoint(tmp_path / "m.ckpt", weights_only=True)
    loaded = ImageClassifier.load_from_checkpoint(tmp_path / "m.ckpt", map_location="cpu", weights_only=True)
    assert loaded.input_shape == (1, 32, 32) and loaded.model.features.conv1.in_channels == 1


def test_batches_of_another_shape_are_an_error(tmp_path):
    module = ImageClassifier("resnet20", width=0.25, max_epochs=1, input_shape=(1, 32, 32))
    data = DataLoader(TensorDataset(torch.randn(8, 1, 28, 28), torch.randint(0, 10, (8,))), batch_size=4)
    trainer = pl.Trainer(fast_dev_run=True, accelerator="cpu", default_root_dir=tmp_path, logger=False,
                         enable_progress_bar=False)
    # resnet20 would run on 28x28, but every MACs figure and exit position was traced at 32x32
    with pytest.raises(GraphError, match=r"ImageClassifier \(train\) traces the model at per-sample input_shape "
                                         r"\(1, 32, 32\), but the data's samples are \(1, 28, 28\)\. HINT: pass "
                                         r"`input_shape=\(1, 28, 28\)`"):
        trainer.fit(module, data)


@pytest.mark.parametrize("kwargs, match", [({"lr": 0}, "`lr`"), ({"momentum": 1.0}, "`momentum`"),
                                           ({"max_epochs": 0}, "`max_epochs`"),
                                           ({"input_shape": (32, 32)}, r"`input_shape` is out of range, got "
                                                                       r"\(32, 32\)\. HINT: a per-sample \(C, H, W\)"),
                                           ({"input_shape": (1, 0, 32)}, "`input_shape`")])
def test_bad_hyperparameters(kwargs, match):
    with pytest.raises(ModelError, match=match):
        ImageClassifier("resnet20", **kwargs)
