"""Same machine, same seed: the recipe gives a bit-identical run (issue: results that reproduce)."""

import torch

from tests.scripts import TINY, load_script

_TIMES = {"seconds", "train_seconds", "timing", "machine", "latency_ms"}


def _strip(value):
    """The summary without wall times (the only figures allowed to differ between two runs)."""
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if k not in _TIMES}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


def test_two_runs_with_the_same_seed_are_bit_identical(tmp_path):
    flags = [*TINY, "--prune-max-steps", "2", "--prune-triplets", "40", "--stages", "baseline,prune"]
    runs = [load_script("recipes/vgg_cifar.py").main([*flags, "--out", str(tmp_path / name)]) for name in "ab"]
    assert _strip(runs[0]) == _strip(runs[1])
    for ckpt in ("baseline/model.ckpt", "prune/seed.ckpt"):
        a, b = (torch.load(tmp_path / name / ckpt, map_location="cpu", weights_only=True)["state_dict"] for name in "ab")
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), ckpt
    assert (tmp_path / "a/prune/roadmap.json").read_text() == (tmp_path / "b/prune/roadmap.json").read_text()
