"""FlexDNNExits in a real Trainer: runs after fit, writes a spec and weights that rebuild the exits."""

import pytest
import pytorch_lightning as pl
import torch
from safetensors.torch import load_file
from torch.utils.data import DataLoader, SubsetRandomSampler, TensorDataset

from nestflex._io import read_json
from nestflex.errors import NestflexError
from nestflex.callbacks import FlexDNNExits
from nestflex.exits.flexdnn import build_flex_network
from nestflex.data import SyntheticDataModule
from nestflex.training import ImageClassifier

CONFIG = {"locations": [0.3, 0.6], "exits_per_location": 2, "epochs": 1, "rank_samples": 64, "fit_samples": 64,
          "refit_iters": 20}


def _loader(n: int, seed: int, shuffle: bool = False) -> DataLoader:
    g = torch.Generator().manual_seed(seed)
    data = TensorDataset(torch.randn(n, 3, 32, 32, generator=g), torch.randint(0, 10, (n,), generator=g))
    return DataLoader(data, batch_size=32, shuffle=shuffle, generator=torch.Generator().manual_seed(seed))


def _trainer(tmp_path, callback) -> pl.Trainer:
    return pl.Trainer(max_epochs=1, limit_train_batches=2, limit_val_batches=1, callbacks=[callback], logger=False,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                      accelerator="cpu", default_root_dir=tmp_path)


def test_exits_are_planned_after_fit_and_rebuild_from_the_files(tmp_path):
    torch.manual_seed(0)
    module = ImageClassifier("vgg11", width=0.125, max_epochs=1)
    callback = FlexDNNExits(config=CONFIG, calibration_fraction=0.5)
    _trainer(tmp_path, callback).fit(module, _loader(64, 0, shuffle=True), _loader(96, 1))
    result = callback.result
    out = tmp_path / "flexdnn"
    spec, report = read_json(out / "spec.json"), read_json(out / "report.json")
    assert spec == result.spec and report["plan"] == result.report["plan"]
    assert report["calibration"]["split"] == "calibration" and report["calibration"]["samples"] == 48
    assert result.network is not None and spec["exits"]
    # the module's own network is untouched (a frozen copy was searched on)
    assert all(p.requires_grad for p in module.model.parameters())
    net = build_flex_network(module.model.cpu().eval(), spec)
    net.load_state_dict(load_file(out / "model.safetensors"))
    x = torch.randn(4, 3, 32, 32)
    for a, b in zip(net.eval()(x), result.network(x)):
        torch.testing.assert_close(a, b)


def test_bad_arguments_fail_at_construction_and_a_missing_network_at_fit_end(tmp_path):
    with pytest.raises(NestflexError, match=r"`config` has unknown FlexDNNConfig fields \['epoch'\]. HINT"):
        FlexDNNExits(config={"epoch": 2})
    with pytest.raises(NestflexError, match=r"`calibration_folds` must be 0"):
        FlexDNNExits(config={"calibration_folds": 1})
    with pytest.raises(NestflexError, match=r"`calibration_fraction` must be in \[0, 1\), got 1.0. HINT"):
        FlexDNNExits(calibration_fraction=1.0)
    with pytest.raises(NestflexError, match=r"unknown confidence measure `entrpy`; choose from: entropy, max_prob"):
        FlexDNNExits(config={"confidence": "entrpy"})
    with pytest.raises(NestflexError, match=r"`FlexDNNConfig.epochs` must be a positive int, got '2'. HINT: the default is 2"):
        FlexDNNExits(config={"epochs": "2"})
    with pytest.raises(NestflexError, match=r"`val_samples` must be a positive int or None \(all\), got 0"):
        FlexDNNExits(val_samples=0)
    assert FlexDNNExits(config={"locations": "all"}).config.locations == ("all",)
    module = ImageClassifier("vgg11", width=0.125, max_epochs=1)
    callback = FlexDNNExits(attr="net", config=CONFIG)
    with pytest.raises(NestflexError, match=r"`attr`='net': ImageClassifier has no nn.Module attribute 'net'"):
        _trainer(tmp_path, callback).fit(module, _loader(32, 0), _loader(32, 1))
    assert callback.result is None  # refused at setup, before any training


def test_with_a_datamodule_the_caps_and_the_split_hold(tmp_path):
    torch.manual_seed(0)
    dm = SyntheticDataModule(batch_size=32, train_size=200, test_size=40, val_size=80, seed=0)
    module = ImageClassifier("vgg11", width=0.125, max_epochs=1)
    callback = FlexDNNExits(dirpath=tmp_path / "out", config=CONFIG, train_samples=96, val_samples=60,
                            calibration_fraction=0.25)
    _trainer(tmp_path, callback).fit(module, datamodule=dm)
    report = callback.result.report
    assert report["calibration"]["samples"] == 15  # a quarter of the 60 drawn validation images
    assert (tmp_path / "out" / "spec.json").is_file() and (tmp_path / "out" / "report.json").is_file()


def test_splits_stay_inside_the_validation_loaders_own_images():
    """One dataset, two samplers (a common setup): planning and calibration images must come from
    the validation sampler's indices only, disjoint."""
    data = TensorDataset(torch.arange(100).float().view(100, 1, 1, 1).expand(100, 3, 2, 2).contiguous(),
                         torch.zeros(100, dtype=torch.long))
    val_idx = list(range(80, 100))
    train = DataLoader(data, batch_size=8, sampler=SubsetRandomSampler(list(range(80))))
    val = DataLoader(data, batch_size=8, sampler=SubsetRandomSampler(val_idx))
    cb = FlexDNNExits(calibration_fraction=0.5, train_samples=16)
    train_s, plan, cal = cb._splits(train, val)
    seen = lambda loader: [int(x[i, 0, 0, 0]) for x, _ in loader for i in range(len(x))]  # noqa: E731
    p, c, t = seen(plan), seen(cal), seen(train_s)
    assert sorted(p + c) == val_idx and not set(p) & set(c) and len(c) == 10
    assert len(t) == 16 and all(i < 80 for i in t)
    _, plan0, cal0 = FlexDNNExits(calibration_fraction=0.0)._splits(train, val)
    assert cal0 is None and sorted(seen(plan0)) == val_idx
