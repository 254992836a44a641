"""The README is the front door (issue 39): short, and its two snippets run as written.

The training snippet runs on the user-style module and loaders of examples/own_trainer.py (a
1x28x28 CNN of the user's own, 10 classes) with one change: ``epochs = 20`` becomes
``epochs = 1`` so that it runs in CI; every other character is the README's. The deployment snippet
then runs on the bundle the first one wrote, with one validation frame.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytorch_lightning as pl

import nestflex.deploy as nd
from tests.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def snippet(name: str) -> str:
    match = re.search(rf"<!-- readme:snippet {name} -->\s*```python\n(.*?)```\s*<!-- /readme:snippet -->",
                      README, re.S)
    assert match, f"README.md has no `readme:snippet {name}` block"
    return match.group(1)


def test_readme_is_short():
    assert len(README.splitlines()) < 120


def test_readme_snippets_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    example = load_script("examples/own_trainer.py")
    train_code = snippet("train")
    assert train_code.count("epochs = 20") == 1
    train_code = train_code.replace("epochs = 20", "epochs = 1")

    class QuietTrainer(pl.Trainer):  # CI output and files: the README's Trainer with no logger or bars
        def __init__(self, **kwargs):
            super().__init__(logger=False, enable_progress_bar=False, enable_checkpointing=False,
                             enable_model_summary=False, accelerator="cpu", **kwargs)

    monkeypatch.setattr(pl, "Trainer", QuietTrainer)
    scope = {"MyModule": example.MyModule, "train": example.data(512, 0), "val": example.data(256, 1)}
    exec(compile(train_code, "README.md:train", "exec"), scope)

    bundle = nd.load(scope["exporter"].result["bundle"])
    assert bundle.num_levels == scope["levels"] >= 2
    assert bundle.exits is not None

    frame = next(iter(scope["val"]))[0][0].numpy().astype(np.float32)
    deploy_scope = {"exporter": scope["exporter"], "frame": frame}
    exec(compile(snippet("deploy"), "README.md:deploy", "exec"), deploy_scope)
    result = deploy_scope["result"]
    assert 0 <= int(result.prediction) < 10 and 0 <= result.level < bundle.num_levels
