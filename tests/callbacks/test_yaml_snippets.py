"""Every LightningCLI snippet in callbacks/ loads in a real LightningCLI and builds its callback."""

import importlib
from pathlib import Path

import pytest
import yaml
from pytorch_lightning.cli import LightningCLI

from nestflex.data import SyntheticDataModule
from nestflex.training import ImageClassifier

SNIPPETS = sorted((Path(__file__).resolve().parents[2] / "callbacks").glob("*.yaml"))


def test_there_are_snippets():
    assert SNIPPETS


@pytest.mark.parametrize("path", SNIPPETS, ids=[p.name for p in SNIPPETS])
def test_snippet_builds_its_callbacks(path, tmp_path):
    spec = yaml.safe_load(path.read_text())
    entries = spec["trainer"]["callbacks"]
    cli = LightningCLI(
        ImageClassifier,
        SyntheticDataModule,
        run=False,
        args=["--config", str(path), "--trainer.logger=false", f"--trainer.default_root_dir={tmp_path}"],
        save_config_callback=None,
    )
    for entry in entries:
        module, _, name = entry["class_path"].rpartition(".")
        cls = getattr(importlib.import_module(module), name)
        built = [cb for cb in cli.trainer.callbacks if isinstance(cb, cls)]
        assert len(built) == 1, f"{path.name}: {name} not among {cli.trainer.callbacks}"
