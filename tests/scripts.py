"""Helpers for tests that run the repository's scripts (recipes, benchmarks): files, not modules."""

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]

# The smallest recipe run that still trains every stage: a 0.125-width VGG-11 on 600 synthetic images.
TINY = ["--data", "synthetic", "--synthetic-train-size", "600", "--synthetic-test-size", "200", "--val-size", "100",
        "--model", "vgg11", "--width", "0.125", "--batch-size", "64", "--accelerator", "cpu", "--epochs", "1"]
# The flex stage at the same scale: two candidate locations, two exits each, one epoch; 60 of the
# 100 validation images plan, the other 40 calibrate.
FLEX = ["--flex-positions", "0.3,0.6", "--flex-exits-per-location", "2", "--flex-epochs", "1",
        "--flex-train-samples", "128", "--flex-val-samples", "60", "--flex-calibration-samples", "40"]


def load_script(relative: str) -> ModuleType:
    """Import ``ROOT/relative`` (e.g. ``recipes/vgg_cifar.py``) as a fresh module."""
    path = ROOT / relative
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses (and pickle) look a class's module up by name
    spec.loader.exec_module(module)
    return module
