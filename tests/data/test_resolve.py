"""resolve_data: auto / cifar10 / synthetic, the one-line message, the kinds and light imports.

The other real kinds are tested beside their readers (test_mnist, test_fashion_mnist, test_cifar100,
test_svhn, test_imagefolder).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from nestflex.data import DATA_KINDS, CIFAR10DataModule, SyntheticDataModule, resolve_data
from nestflex.data import cifar as cifar_mod
from nestflex.errors import DataError

SMALL = {"train_size": 200, "test_size": 50, "val_size": 20}


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    def forbidden(*args, **kwargs):
        raise AssertionError("resolve_data downloaded without download=True")

    monkeypatch.setattr(cifar_mod, "_fetch", forbidden)


def test_auto_uses_cifar_when_present(fake_cifar):
    dm, message = resolve_data("auto", fake_cifar["root"], batch_size=8, **SMALL)
    assert isinstance(dm, CIFAR10DataModule) and not dm.synthetic and dm.batch_size == 8
    assert message == f"data: CIFAR-10 found in {fake_cifar['dir']}"
    dm.setup()  # train_size/test_size were synthetic-only and not passed on
    assert len(dm.val_dataset) == 20


def test_auto_falls_back_to_synthetic(tmp_path):
    dm, message = resolve_data("auto", tmp_path / "data", seed=3, **SMALL)
    assert isinstance(dm, SyntheticDataModule) and dm.synthetic and dm.seed == 3 and dm.train_size == 200
    assert message == (
        f"data: CIFAR-10 not found in {tmp_path / 'data'} (expected cifar-10-batches-py/data_batch_1..5, "
        "test_batch); using the synthetic dataset (seed 3) — figures on it are synthetic"
    )
    assert "\n" not in message


def test_auto_with_incomplete_cifar_falls_back(fake_cifar):
    (fake_cifar["dir"] / "test_batch").unlink()
    dm, message = resolve_data("auto", fake_cifar["root"], **SMALL)
    assert dm.synthetic and "CIFAR-10 not found" in message


def test_cifar10_required(fake_cifar, tmp_path):
    dm, message = resolve_data("cifar10", fake_cifar["root"], val_size=10)
    assert isinstance(dm, CIFAR10DataModule) and message.startswith("data: CIFAR-10 found in ")
    match = (
        r"CIFAR-10 directory .*missing does not exist \(expected cifar-10-batches-py/data_batch_1\.\.5, "
        r"test_batch in it\)\. HINT: pass `download=True`.*--data synthetic"
    )
    with pytest.raises(DataError, match=match):
        resolve_data("cifar10", tmp_path / "missing")
    (fake_cifar["dir"] / "data_batch_5").unlink()
    with pytest.raises(DataError, match=r"lacks data_batch_5"):
        resolve_data("cifar10", fake_cifar["root"])


def test_synthetic_requested(fake_cifar):
    dm, message = resolve_data("synthetic", fake_cifar["root"], **SMALL)
    assert isinstance(dm, SyntheticDataModule)
    assert message == (
        "data: using the synthetic dataset (seed 0), as requested — figures on it are synthetic"
    )


def test_download_only_when_asked(tmp_path, monkeypatch, cifar_factory):
    calls = []

    def fake_download(data_dir):
        calls.append(data_dir)
        return cifar_factory(tmp_path / "data")["dir"]

    import nestflex.data.resolve as resolve_mod

    monkeypatch.setattr(resolve_mod, "download_cifar10", fake_download)
    dm, _ = resolve_data("auto", tmp_path / "data", **SMALL)
    assert dm.synthetic and calls == []
    dm, message = resolve_data("auto", tmp_path / "elsewhere", download=True, val_size=10)
    assert isinstance(dm, CIFAR10DataModule) and calls == [str(tmp_path / "elsewhere")]
    assert message.startswith("data: CIFAR-10 downloaded to ")


def test_unknown_kind_and_kwarg(tmp_path):
    assert DATA_KINDS == ("auto", "cifar10", "mnist", "synthetic", "cifar100", "fashion_mnist", "svhn", "imagefolder")
    match = (r"`kind` must be one of \['auto', 'cifar10', 'mnist', 'synthetic', 'cifar100', 'fashion_mnist', "
             r"'svhn', 'imagefolder'\], got 'imagenet'")
    with pytest.raises(DataError, match=match):
        resolve_data("imagenet", tmp_path)
    match = r"unknown DataModule argument\(s\) \['batchsize'\]; accepted: \[.*'batch_size'"
    with pytest.raises(DataError, match=match):
        resolve_data("synthetic", tmp_path, batchsize=3)


def test_light_imports_do_not_pull_lightning():
    code = (
        "import sys, nestflex.data, nestflex.data.synthetic, nestflex.data.cifar, nestflex.data.mnist, "
        "nestflex.data.cifar100, nestflex.data.fashion_mnist, nestflex.data.svhn, nestflex.data.imagefolder; "
        "nestflex.data.make_synthetic(2); "
        "assert 'pytorch_lightning' not in sys.modules and 'lightning' not in sys.modules, "
        "'lightning imported'; "
        "assert 'scipy' not in sys.modules and 'PIL' not in sys.modules, 'scipy or Pillow imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
