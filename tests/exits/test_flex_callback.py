"""FlexDNNExits in a real Trainer: runs after fit, writes a spec and weights that rebuild the exits."""

import pytest
import pytorch_lightning as pl
import torch
from safetensors.torch import load_file
from torch.utils.data import DataLoader, TensorDataset

from nestflex._io import read_json
from nestflex.errors import NestflexError
from nestflex.exits import build_flex_network
from nestflex.callbacks import FlexDNNExits
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
    module = ImageClassifier("vgg11", width=0.125, max_epochs=1)
    with pytest.raises(NestflexError, match=r"`attr`='net': ImageClassifier has no nn.Module attribute 'net'"):
        _trainer(tmp_path, FlexDNNExits(attr="net", config=CONFIG)).fit(module, _loader(32, 0), _loader(32, 1))
