"""The recipe end to end on a tiny generated MNIST (1x28x28 IDX files, padded to 1x32x32)."""

from nestflex.deploy.runtime.capacity import CapacityRuntime
from nestflex.deploy.runtime.progressive import ProgressiveRuntime
import json

import torch

from tests.data.mnist_files import make_fake_mnist
from tests.scripts import load_script

# every stage, export included, at the smallest scale that still prunes, grows and plans exits
TINY_MNIST = ["--data", "mnist", "--val-size", "40", "--model", "vgg11", "--width", "0.125", "--batch-size", "64",
              "--accelerator", "cpu", "--epochs", "1", "--prune-max-steps", "1", "--prune-triplets", "40",
              "--grow-levels", "2", "--grow-latency-repeats", "1", "--exit-epochs", "1",
              "--exit-positions", "0.3,0.6", "--profile-samples", "24", "--precision-calibration", "16",
              "--flex-positions", "0.3,0.6", "--flex-exits-per-location", "2", "--flex-epochs", "1",
              "--flex-train-samples", "64", "--flex-val-samples", "20", "--flex-calibration-samples", "20"]


# every stage: 118-193 s measured on 2 busy cores (load 5-9)
def test_recipe_runs_end_to_end_on_mnist(tmp_path):
    from nestflex.deploy import load

    data = make_fake_mnist(tmp_path / "mnist", n_train=240, n_test=64)
    out = tmp_path / "run"
    summary = load_script("recipes/vgg_cifar.py").main([*TINY_MNIST, "--data-dir", str(data["root"]),
                                                        "--out", str(out)])
    assert json.loads((out / "summary.json").read_text()) == json.loads(json.dumps(summary))
    assert summary["data"]["name"] == "mnist" and summary["data"]["synthetic"] is False
    assert summary["data"]["source"].startswith("data: MNIST found in ")
    assert summary["model"]["input_shape"] == [1, 32, 32]
    assert {"baseline", "pruning", "grow", "exits", "flexdnn", "quantization", "export"} <= set(summary)
    assert len(summary["levels"]) >= 2  # the roadmap had at least one kept step
    macs = [lv["macs"] for lv in summary["levels"]]
    assert macs == sorted(macs) and macs[0] < macs[-1] == summary["baseline"]["macs"]

    # the bundle declares the MNIST input and normalisation, and the runtime runs 1x32x32 images
    bundle = load(out / summary["export"]["bundle"])
    manifest = json.loads((out / summary["export"]["bundle"] / "manifest.json").read_text())
    assert manifest["input"]["shape"] == [1, 32, 32]
    assert manifest["model"]["data"] == "mnist"
    assert manifest["input"]["mean"] == [0.1307] and manifest["input"]["std"] == [0.3081]
    digits = torch.from_numpy(data["test"][0][:4].copy()).unsqueeze(1)  # (4, 1, 28, 28) uint8
    x = (torch.nn.functional.pad(digits, (2, 2, 2, 2)).float() / 255 - 0.1307) / 0.3081
    assert CapacityRuntime(bundle)(x).shape == (4, 10)
    assert all(z.shape == (4, 10) for z in ProgressiveRuntime(bundle).all_exits(x))
