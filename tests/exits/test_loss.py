import pytest
import torch
import torch.nn.functional as F

from nestflex.exits import ExitError, loss_weights, multi_exit_loss, tau_schedule

POSITIONS = [0.15, 0.30, 0.45, 0.60, 0.75, 0.90]


@pytest.mark.parametrize(
    "step, total",
    [(0, 1000), (1, 1000), (250, 1000), (500, 1000), (999, 1000), (1000, 1000), (5000, 1000), (3, 7)],
)
def test_tau_matches_the_sdn_formula(step, total):
    weights = tau_schedule(step, total, POSITIONS)
    progress = min(1.0, step / total)
    expected = [0.01 + (c - 0.01) * progress for c in POSITIONS] + [1.0]
    assert weights == pytest.approx(expected, abs=1e-12)


def test_tau_starts_at_001_and_ends_at_the_positions():
    assert tau_schedule(0, 100, POSITIONS) == [0.01] * 6 + [1.0]
    assert tau_schedule(100, 100, POSITIONS) == pytest.approx(POSITIONS + [1.0])
    mid = tau_schedule(50, 100, POSITIONS)
    assert all(a < b for a, b in zip(mid[:-1], mid[1:]))  # deeper exits weigh more
    assert tau_schedule(0, 10, [0.5], start=0.2) == [0.2, 1.0]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"step": -1}, r"`step` must be an int >= 0, got -1"),
        ({"total_steps": 0}, r"`total_steps` must be an int >= 1, got 0"),
        ({"start": 0.0}, r"`start` must be in \(0, 1\], got 0.0. HINT: SDN starts every exit at 0.01"),
        ({"positions": [0.5, 1.2]}, r"`positions\[1\]` must be in \(0, 1\], got 1.2"),
    ],
)
def test_bad_schedule_arguments(kwargs, match):
    args = {"step": 0, "total_steps": 10, "positions": [0.5], **kwargs}
    with pytest.raises(ExitError, match=match):
        tau_schedule(**args)


def test_named_weightings():
    assert loss_weights("equal", 3, 10, [0.2, 0.4]) == [1.0, 1.0, 1.0]
    assert loss_weights("overthinking", 5, 10, [0.2]) == tau_schedule(5, 10, [0.2])
    with pytest.raises(ExitError, match="unknown loss weighting `sdn`; choose from: overthinking, equal"):
        loss_weights("sdn", 0, 1, [0.5])


def test_multi_exit_loss_is_the_weighted_sum_of_cross_entropies():
    g = torch.Generator().manual_seed(0)
    logits = [torch.randn(8, 5, generator=g, requires_grad=True) for _ in range(3)]
    y = torch.randint(0, 5, (8,), generator=g)
    total, per = multi_exit_loss(logits, y, [0.1, 0.5, 1.0])
    expected = sum(w * F.cross_entropy(z, y) for w, z in zip([0.1, 0.5, 1.0], logits))
    torch.testing.assert_close(total, expected)
    assert [p.requires_grad for p in per] == [False] * 3
    total.backward()
    assert logits[0].grad.abs().sum() < logits[2].grad.abs().sum()
    with pytest.raises(ExitError, match=r"`weights` needs one value per exit \(3\), got 2"):
        multi_exit_loss(logits, y, [1.0, 1.0])
