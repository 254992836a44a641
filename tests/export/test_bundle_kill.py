"""A bundle write that dies part-way (an exception at any step, or SIGKILL) leaves the previous
bundle, whole and loadable, or no bundle (the previous one set aside whole), never a partial one;
the next export cleans up what a killed writer left (DESIGN invariant 5, issue 19 item 5)."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import nestflex.deploy as nd
from nestflex.export import bundle as writer
from nestflex.export import export_bundle
from tests.export.bundles import exits_on, nested_vgg
from tests.scripts import ROOT

CALIBRATION = {"split": "validation", "samples": 10, "final_accuracy": 0.5, "lossless": {"thresholds": [0.5, 0.6]}}


class Killed(BaseException):
    """What a step raises: not an Exception, like KeyboardInterrupt or SystemExit."""


def _tree(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _export(target: Path, net, exits, scale: float = 1.0) -> None:
    with torch.no_grad():
        net.classifier.fc2.weight.mul_(scale)  # the new bundle differs from the old one
    export_bundle(target, net, exits=exits, thresholds=[0.5, 0.6], onnx=False, calibration=CALIBRATION)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    net = nested_vgg(tmp_path_factory.mktemp("net"))
    return net, exits_on(net)


# every step of the write that touches the disk, in order, and how many times it runs
# (os.replace: #1 and #2 are the profile's and the manifest's atomic writes, #3 and #4 the two renames)
STEPS = [("save_file", 1), ("write_json", 1), ("atomic_write_bytes", 1), ("replace", 1), ("replace", 3),
         ("replace", 4), ("rmtree", 1)]


@pytest.mark.parametrize("step, nth", STEPS)
def test_an_interrupted_write_leaves_the_old_bundle_whole(model, tmp_path, monkeypatch, step, nth):
    net, exits = model
    target = tmp_path / "m.nfx"
    _export(target, net, exits)
    before = _tree(target)
    import safetensors.torch

    owners = {"save_file": (safetensors.torch, "save_file"), "write_json": (writer, "write_json"),
              "atomic_write_bytes": (writer, "atomic_write_bytes"), "replace": (writer.os, "replace"),
              "rmtree": (writer.shutil, "rmtree")}
    owner, name = owners[step]
    real, calls = getattr(owner, name), []

    def dies(*args, **kwargs):
        calls.append(args)
        if len(calls) == nth:
            raise Killed(f"{step} #{nth}")
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, dies)
    with pytest.raises(Killed):
        _export(target, net, exits, scale=2.0)
    monkeypatch.undo()
    if step == "rmtree":  # died removing the set-aside old bundle: the new one is in place, whole
        assert _tree(target) != before and nd.load(target).num_levels == 3
    else:
        assert _tree(target) == before and nd.load(target).num_levels == 3
    _export(target, net, exits, scale=0.5)  # the next export works and leaves nothing behind
    assert [p.name for p in tmp_path.iterdir()] == ["m.nfx"], list(tmp_path.iterdir())


KILL_SCRIPT = textwrap.dedent(
    """
    import os, signal, sys
    import torch
    from nestflex.export import bundle as writer
    from tests.export.test_bundle_kill import _export, exits_on, nested_vgg
    from pathlib import Path

    target, at = Path(sys.argv[1]), int(sys.argv[2])
    net = nested_vgg(target.parent / "net")
    exits = exits_on(net)
    real, calls = os.replace, []

    def replace(*args):
        calls.append(args)
        if len(calls) == at:  # a real SIGKILL: no cleanup, no finally, no atexit
            os.kill(os.getpid(), signal.SIGKILL)
        return real(*args)

    writer.os.replace = replace  # os.replace, as the exporter and its atomic writes call it
    _export(target, net, exits, scale=2.0)
    """
)


@pytest.mark.parametrize("at", [1, 4])  # in the temp dir (before any rename), between the two renames
def test_a_sigkilled_write_leaves_the_old_bundle_or_none_and_the_next_export_cleans_up(model, tmp_path, at):
    net, exits = model
    target = tmp_path / "m.nfx"
    (tmp_path / "net").mkdir()
    _export(target, net, exits)
    before = _tree(target)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, "-c", KILL_SCRIPT, str(target), str(at)], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == -signal.SIGKILL, run.stderr[-2000:]
    left = sorted(p.name for p in tmp_path.iterdir() if p.name not in ("net", "m.nfx"))
    assert left and all(n.startswith(".m.nfx.") for n in left), left  # the killed writer's leftovers
    if at == 4:  # the old bundle was moved aside, the new one not yet in: no bundle, the old one whole
        assert not target.exists()
        with pytest.raises(nd.BundleError, match=r"an export to it was interrupted. HINT: the previous bundle is "
                                                 r"whole at '.*\.m\.nfx\.old-\d+-\d+': rename it back"):
            nd.load(target)
        aside = next(tmp_path.glob(".m.nfx.old-*"))
        assert _tree(aside) == before and nd.load(aside).num_levels == 3
    else:
        assert _tree(target) == before and nd.load(target).num_levels == 3
    _export(target, net, exits, scale=0.5)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.nfx", "net"]
    assert nd.load(target).num_levels == 3
