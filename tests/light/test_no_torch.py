"""The device side imports no training dependency: every feature run once in a fresh process leaves
no torch, onnx, Lightning, timm, torchmetrics (...) in ``sys.modules`` (DESIGN invariant 6)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_exercising_every_device_feature_imports_no_training_package(refs):
    if importlib.util.find_spec("onnx") is not None:
        # what a device runs was tuned where `onnx` is (the fused early-exit graphs kept beside the
        # bundle, as `nestflex tune` keeps them); without this, run alone, the device path below would
        # build them itself and import onnx doing it
        import nestflex.deploy as nd

        for name in ("shipped", "derived"):
            bundle = nd.load(refs.root / f"{name}.nfx")
            for key in bundle.exit_sets:
                nd.ProgressiveRuntime(bundle, exit_set=key)
    done = subprocess.run([sys.executable, "-m", "tests.light.exercise", str(refs.root)], capture_output=True,
                          text=True, cwd=ROOT, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["heavy"] == [], f"imported on the device path: {result['heavy']}"

