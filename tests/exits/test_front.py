"""Per-exit threshold front: runtime-policy consistency, what it buys over one shared threshold, errors."""

import pytest
import torch

from nestflex.errors import NestflexError
from nestflex.exits.calibration import evaluate_thresholds
from nestflex.exits.front import threshold_front

MACS = [10.0, 40.0, 100.0]


def _logits(n: int = 400, seed: int = 0):
    """Exit 0 is calibrated: right when confident, wrong below; exit 1 is overconfident: confident
    on every sample but right on only 70%; the final exit is always right."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 10, (n,), generator=g)
    eye = torch.nn.functional.one_hot(labels, 10).float()
    wrong = (labels + 1) % 10
    strength = torch.rand(n, generator=g) * 6  # exit 0's confidence grows with strength
    off = torch.nn.functional.one_hot(wrong, 10).float()
    exit0 = strength[:, None] * torch.where((strength > 3)[:, None], eye, off)
    right1 = torch.rand(n, generator=g) < 0.7
    exit1 = 8 * torch.where(right1[:, None], eye, off)
    return torch.stack([exit0, exit1, 8 * eye]), labels


def _conf(logits):
    p = logits.softmax(-1)
    return 1 + (p * p.clamp_min(1e-12).log()).sum(-1) / torch.log(torch.tensor(10.0))


def test_points_are_the_runtime_policy_and_macs_fall():
    logits, labels = _logits()
    conf, correct = _conf(logits), logits.argmax(-1) == labels[None]
    pts = threshold_front(conf, correct, MACS, 100.0, max_drop=0.1)
    assert pts[0]["thresholds"] == [1.0, 1.0] and pts[0]["mean_macs"] == 100.0 and pts[0]["accuracy"] == 1.0
    assert len(pts) > 3
    assert all(b["mean_macs"] < a["mean_macs"] for a, b in zip(pts, pts[1:]))
    for p in pts:
        assert p["accuracy"] >= 1.0 - 0.1 - 1e-12
        ev = evaluate_thresholds(logits, labels, p["thresholds"], MACS, 100.0, _conf_name(), "final")
        assert ev["accuracy"] == pytest.approx(p["accuracy"]) and ev["mean_macs"] == pytest.approx(p["mean_macs"])


def _conf_name():
    return "entropy"  # the same measure as _conf


def test_per_exit_thresholds_save_what_one_shared_threshold_cannot():
    logits, labels = _logits()
    conf, correct = _conf(logits), logits.argmax(-1) == labels[None]
    pts = threshold_front(conf, correct, MACS, 100.0, max_drop=0.0)
    lossless = min(p["mean_macs"] for p in pts if p["accuracy"] == 1.0)
    # every shared threshold low enough to open exit 1 loses accuracy there; exit 0 alone stays lossless
    shared = [evaluate_thresholds(logits, labels, t / 100, MACS, 100.0, "entropy", "final") for t in range(101)]
    best_shared = min(r["mean_macs"] for r in shared if r["accuracy"] == 1.0)
    assert pts[-1]["thresholds"][1] == 1.0  # the overconfident exit stays closed at no loss
    assert lossless < best_shared
    # with loss allowed, the front keeps reaching lower MACs
    loose = threshold_front(conf, correct, MACS, 100.0, max_drop=0.2)
    assert min(p["mean_macs"] for p in loose) < lossless


def test_bad_input_names_the_argument():
    conf = torch.rand(3, 5)
    correct = torch.ones(3, 5, dtype=torch.bool)
    with pytest.raises(NestflexError, match=r"`conf` and `correct` must both be \(K, N\).*2 costs"):
        threshold_front(conf, correct, MACS[:2], 100.0)
    with pytest.raises(NestflexError, match=r"`conf` and `correct`.*N >= 1"):
        threshold_front(conf[:, :0], correct[:, :0], MACS, 100.0)
    with pytest.raises(NestflexError, match=r"`max_drop` must be an accuracy fraction in \[0, 1\], got 5.*HINT"):
        threshold_front(conf, correct, MACS, 100.0, max_drop=5)
    with pytest.raises(NestflexError, match=r"`backbone_macs` must be positive.*got 0"):
        threshold_front(conf, correct, MACS, 0)
    with pytest.raises(NestflexError, match=r"`exit_macs` must not fall along the exits.*\[40.0, 10.0, 100.0\]"):
        threshold_front(conf, correct, [40.0, 10.0, 100.0], 100.0)
    with pytest.raises(NestflexError, match=r"`grid` values must be thresholds in \[0, 1\], got \[-0.5\]"):
        threshold_front(conf, correct, MACS, 100.0, grid=[-0.5, 0.5])
    with pytest.raises(NestflexError, match=r"`fallback` must be one of .*got 'first'"):
        threshold_front(conf, correct, MACS, 100.0, fallback="first")


def test_a_move_past_the_floor_does_not_stop_the_others():
    """Exit 0's only move loses 0.3; exit 1's loses 0.05 and fits within max_drop=0.1."""
    conf = torch.tensor([[0.9] * 10 + [0.0] * 10, [0.0] * 10 + [0.8] + [0.0] * 9, [1.0] * 20])
    correct = torch.ones(3, 20, dtype=torch.bool)
    correct[0, :6] = False  # exit 0 would release 10 samples, 6 of them wrong
    correct[1, 10] = False  # exit 1 would release one, wrong
    pts = threshold_front(conf, correct, [10.0, 40.0, 100.0], 100.0, max_drop=0.1)
    assert [p["thresholds"] for p in pts] == [[1.0, 1.0], [1.0, 0.79]]
    assert pts[-1]["accuracy"] == pytest.approx(0.95) and pts[-1]["mean_macs"] == pytest.approx(97.0)
