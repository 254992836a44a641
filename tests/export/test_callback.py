import pytest
import pytorch_lightning as pl
import torch

import nestflex.deploy as nd
from nestflex.callbacks import BundleExporter
from nestflex.data import SyntheticDataModule
from nestflex.exits import MultiExitClassifier
from nestflex.export import ExportError
from nestflex.training import ImageClassifier


def _fit(module, tmp_path, exporter):
    dm = SyntheticDataModule(batch_size=16, train_size=64, test_size=32, val_size=16)
    trainer = pl.Trainer(fast_dev_run=True, accelerator="cpu", callbacks=[exporter], default_root_dir=tmp_path,
                         logger=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module, datamodule=dm)
    return dm


def test_bundle_exporter_writes_a_loadable_bundle_at_fit_end(tmp_path):
    module = ImageClassifier("vgg11", width=0.125, max_epochs=1)
    exporter = BundleExporter(filename="plain", onnx=False)
    dm = _fit(module, tmp_path, exporter)
    assert exporter.result["bundle"] == str(tmp_path / "plain.nfx")
    b = nd.load(exporter.result["bundle"])
    assert b.manifest["input"]["mean"] == list(dm.mean) and b.manifest["classes"] == list(dm.classes)
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(nd.CapacityRuntime(b)(x), module.model.eval()(x), atol=1e-5, rtol=0)


def test_bundle_exporter_takes_the_exits_of_a_multi_exit_classifier(tmp_path):
    module = MultiExitClassifier("vgg11", width=0.125, positions=(0.5,), mode="joint", max_epochs=1)
    exporter = BundleExporter(dirpath=tmp_path / "out", onnx=False, thresholds=0.7)
    _fit(module, tmp_path, exporter)
    b = nd.load(tmp_path / "out" / "model.nfx")
    assert b.exits["backbone"] == "shared" and b.exits["thresholds"] == [0.7]  # a plain backbone is its own level
    x = torch.randn(3, 3, 32, 32)
    for got, want in zip(nd.ProgressiveRuntime(b).all_exits(x), module.model.eval()(x)):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


def test_bad_arguments_are_explained():
    with pytest.raises(ExportError, match=r"`filename` must be a plain directory name such as 'model.nfx', got 'a/b'"):
        BundleExporter(filename="a/b")
    with pytest.raises(ExportError, match=r"`confidence` must be one of entropy, max_prob, got 'x'"):
        BundleExporter(confidence="x")
    with pytest.raises(ExportError, match=r"`fallback` must be one of most_confident, final, got 'x'"):
        BundleExporter(fallback="x")
    from nestflex.export.callback import bundle_arguments

    with pytest.raises(ExportError, match=r"`attr`='net': ImageClassifier has no nn.Module attribute 'net'"):
        bundle_arguments(ImageClassifier("vgg11", width=0.125), attr="net")


def test_bundle_arguments_take_the_shape_and_refuse_a_mismatch():
    from nestflex.export.callback import bundle_arguments

    class _DM:
        mean, std, classes, input_shape = (0.13,), (0.31,), tuple("0123456789"), (1, 32, 32)

    grey = ImageClassifier("vgg11", width=0.125, input_shape=(1, 32, 32))
    kwargs = bundle_arguments(grey, _DM())
    assert kwargs["input_shape"] == (1, 32, 32) and kwargs["mean"] == [0.13]
    with pytest.raises(ExportError, match=r"the network is traced at per-sample input_shape \(3, 32, 32\), but the "
                                          r"DataModule's samples are \(1, 32, 32\).*HINT: build the module with "
                                          r"`input_shape=datamodule.input_shape`"):
        bundle_arguments(ImageClassifier("vgg11", width=0.125), _DM())


def test_exporter_placed_before_a_producer_or_given_missing_files_fails_early(tmp_path):
    from nestflex.callbacks import FlexDNNExits

    module = ImageClassifier("vgg11", width=0.125, max_epochs=1)
    with pytest.raises(ExportError, match=r"BundleExporter comes before FlexDNNExits .* HINT: put BundleExporter last"):
        pl.Trainer(fast_dev_run=True, accelerator="cpu", logger=False, enable_progress_bar=False,
                   callbacks=[BundleExporter(onnx=False), FlexDNNExits()], default_root_dir=tmp_path).fit(
            module, datamodule=SyntheticDataModule(batch_size=16, train_size=64, test_size=32, val_size=16))
    with pytest.raises(ExportError, match=r"`flex`='.*nowhere' is not a directory. HINT: pass FlexDNNExits' output"):
        BundleExporter(flex=tmp_path / "nowhere")
    with pytest.raises(ExportError, match=r"`calibration`='.*cal.json' is not a file"):
        BundleExporter(calibration=tmp_path / "cal.json")
    with pytest.raises(ExportError, match=r"`exits`='.*x.ckpt' is neither a MultiExitNetwork nor a checkpoint file"):
        BundleExporter(exits=tmp_path / "x.ckpt")
    with pytest.raises(ExportError, match=r"`profile_repeats` must be an int >= 1, got 0"):
        BundleExporter(profile_repeats=0)


def test_the_bundle_says_how_to_scale_inputs(tmp_path):
    module = ImageClassifier("vgg11", width=0.125, max_epochs=1)
    exporter = BundleExporter(filename="scaled", onnx=False)
    dm = _fit(module, tmp_path, exporter)
    spec = nd.load(exporter.result["bundle"]).manifest["input"]
    assert spec["scale"] == pytest.approx(dm.input_scale) and "raw * 0.00392157 - mean) / std" in spec["note"]
    from nestflex.export import export_bundle

    # data of another range: no pixel/255 claim, the note points at the data's own transforms
    info = export_bundle(tmp_path / "raw.nfx", module.model, onnx=False, mean=[0.0] * 3, std=[1.0] * 3)
    spec = nd.load(info["bundle"]).manifest["input"]
    assert spec.get("scale") is None and "255" not in spec["note"] and "own transforms" in spec["note"]
    with pytest.raises(ExportError, match=r"`input_scale` must be a finite number > 0 or None, got -1"):
        export_bundle(tmp_path / "bad.nfx", module.model, onnx=False, input_scale=-1)
