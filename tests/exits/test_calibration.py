import json

import pytest
import torch

from nestflex.exits import (
    ExitError,
    MultiExitNetwork,
    calibrate,
    collect_logits,
    evaluate_thresholds,
    exit_profile,
    lossless_thresholds,
)
from nestflex.exits.calibration import fit_lossless_thresholds
from nestflex.models import create_model
from tests.exits.conftest import tiny_loader


def _synthetic_exits(n=600, classes=10, seed=0):
    """Later exits are more often right, and confidence tracks correctness (as in trained nets)."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, classes, (n,), generator=g)
    logits = []
    for k, strength in enumerate([1.0, 2.0, 3.0, 4.0]):
        z = torch.randn(n, classes, generator=g)
        z += strength * torch.rand(n, 1, generator=g) * 2 * torch.nn.functional.one_hot(labels, classes)
        logits.append(z)
    return torch.stack(logits), labels


def test_sweep_endpoints_and_rates():
    logits, labels = _synthetic_exits()
    macs = [100, 250, 400, 1000]
    report = exit_profile(logits, labels, macs, backbone_macs=980)
    first, last = report["sweep"][0], report["sweep"][-1]
    assert first["threshold"] == 0.0 and first["exit_rate"] == [1.0, 0.0, 0.0, 0.0]
    assert first["accuracy"] == pytest.approx(report["exits"][0]["accuracy"])
    assert first["mean_macs"] == 100 and first["mean_macs_fraction"] == pytest.approx(100 / 980)
    assert (
        last["threshold"] == 1.0 and last["exit_rate"] == [0.0, 0.0, 0.0, 1.0] and last["mean_macs"] == 1000
    )
    for row in report["sweep"]:
        assert sum(row["exit_rate"]) == pytest.approx(1.0)
        rate_weighted = sum(r * a for r, a in zip(row["exit_rate"], row["exit_accuracy"]) if a is not None)
        assert rate_weighted == pytest.approx(row["accuracy"])
    costs = [row["mean_macs"] for row in report["sweep"]]
    assert costs == sorted(costs)  # a higher threshold never costs less
    assert [e["macs_fraction"] for e in report["exits"]] == pytest.approx([m / 980 for m in macs])
    json.dumps(report, allow_nan=False)


def test_overthinking_and_oracle_rates_count_samples():
    labels = torch.tensor([0, 0, 0, 0])
    hit, miss = torch.tensor([5.0, 0.0]), torch.tensor([0.0, 5.0])
    logits = torch.stack(
        [
            torch.stack([hit, miss, hit, miss]),  # exit 0
            torch.stack([hit, miss, miss, miss]),  # final
        ]
    )
    report = exit_profile(logits, labels, [1, 2], backbone_macs=2)
    assert report["overthinking_rate"] == 0.25  # sample 2: right early, wrong at the end
    assert report["oracle_accuracy"] == 0.5 and report["final_accuracy"] == 0.25


def test_fitted_thresholds_are_lossless_on_the_fit_set():
    logits, labels = _synthetic_exits()
    conf = torch.softmax(logits, -1).amax(-1)
    correct = logits.argmax(-1) == labels
    thresholds = fit_lossless_thresholds(conf, correct)
    remaining = torch.ones(labels.shape[0], dtype=torch.bool)
    for k, t in enumerate(thresholds):
        leave = remaining & (conf[k] > t)
        assert correct[k][leave].sum() >= correct[-1][leave].sum()
        remaining &= ~leave
    assert any(t < 1.0 for t in thresholds), "some exit should be usable"
    # so the whole cascade, answered by the final exit where nobody exits early, loses nothing
    row = evaluate_thresholds(logits, labels, thresholds, [1, 2, 3, 4], 4, fallback="final")
    assert row["accuracy"] >= correct[-1].double().mean().item()
    assert row["exit_rate"][-1] < 1 and row["mean_macs"] < 4


def test_lossless_cross_validation_report():
    logits, labels = _synthetic_exits(n=1000)
    result = lossless_thresholds(logits, labels, [1, 2, 3, 4], 4, folds=4)
    assert len(result["thresholds"]) == 3 and len(result["cv"]) == 4
    assert result["fallback"] == "final"  # "no loss vs the final exit" is only reachable with it
    assert sum(r["samples"] for r in result["cv"]) == 1000
    for k, t in enumerate(result["thresholds"]):
        assert t == max(r["thresholds"][k] for r in result["cv"])
    assert result["mean_macs_fraction"] < 1.0  # the exits save work at lossless thresholds
    assert abs(result["cv_accuracy_delta_mean"]) < 0.05
    with pytest.raises(
        ExitError, match=r"`folds` must be an int in \[2, 1000\] \(the number of samples\), got 1"
    ):
        lossless_thresholds(logits, labels, [1, 2, 3, 4], 4, folds=1)


def test_calibrate_a_network_end_to_end():
    net = MultiExitNetwork(create_model("resnet20", width=0.25), positions=(0.3, 0.6))
    report = calibrate(net, tiny_loader(40), folds=2, thresholds=(0.0, 0.5, 1.0))
    assert report["samples"] == 40 and [e["name"] for e in report["exits"]] == net.exit_names
    assert [e["macs"] for e in report["exits"]] == net.exit_macs
    assert report["backbone_macs"] == net.backbone_macs and report["confidence"] == "max_prob"
    assert [r["threshold"] for r in report["sweep"]] == [0.0, 0.5, 1.0]
    assert len(report["lossless"]["thresholds"]) == 2
    json.loads(json.dumps(report, allow_nan=False))
    logits, labels = collect_logits(net, tiny_loader(40), max_samples=20)
    assert logits.shape == (3, 20, 10) and labels.shape == (20,)
    assert net.training  # restored


def test_calibration_input_errors():
    logits, labels = _synthetic_exits(n=20)
    with pytest.raises(ExitError, match=r"`exit_macs` needs one value per exit \(4\), got 2"):
        exit_profile(logits, labels, [1, 2], 2)
    with pytest.raises(ExitError, match=r"`thresholds\[2\]` must be a number in \[0, 1\], got 2.0"):
        exit_profile(logits, labels, [1, 2, 3, 4], 4, thresholds=(0.1, 0.5, 2.0))
    with pytest.raises(ExitError, match="unknown confidence measure `top1`"):
        exit_profile(logits, labels, [1, 2, 3, 4], 4, confidence="top1")
    with pytest.raises(ExitError, match="`batches` yielded no data"):
        collect_logits(MultiExitNetwork(create_model("resnet20", width=0.25), positions=(0.5,)), [])
    with pytest.raises(ExitError, match="`model` must be a MultiExitNetwork"):
        calibrate(create_model("resnet20", width=0.25), tiny_loader())


def test_a_lossless_claim_on_too_few_samples_warns_with_the_number_needed():
    from nestflex.exits.calibration import _binom_cdf, _upper, loss_bound, samples_needed

    logits, labels = _synthetic_exits(n=120)
    with pytest.warns(UserWarning, match=r"lossless thresholds fitted on 120 samples: .* turned 16 right answers wrong "
                                         r"and 13 wrong answers right, .* may lose up to 15.5% .* HINT: the exits lose "
                                         r"accuracy outright at these thresholds"):
        small = lossless_thresholds(logits, labels, [1, 2, 3, 4], 4, folds=4)
    g = small["guard"]
    assert g["samples"] == 120 and not g["supported"] and g["samples_needed"] is None  # 16 - 13 of 120: -2.5 points
    assert g["loss_bound"] == round(loss_bound(g["harm"], g["rescued"], 120), 6) > 0.01
    # harm and rescue are counted on the held-out folds: they explain the folds' accuracy deltas exactly
    delta = sum((r["final_accuracy"] - r["accuracy"]) * r["samples"] for r in small["cv"])
    assert round(delta) == g["harm"] - g["rescued"]
    # each factor is an exact Clopper-Pearson bound: at it, seeing <= k events has probability alpha
    assert abs(_binom_cdf(3, 120, _upper(3, 120, 0.025)) - 0.025) < 1e-6
    assert samples_needed(tolerance=0.02) < samples_needed() == 368  # rule of three at 97.5%
    assert samples_needed(771 / 5000, 780 / 5000) > 5000  # frequent two-way disagreement needs many samples
    assert samples_needed(0.05, 0.01) is None  # a policy that loses 4 points: no sample size helps
    assert loss_bound(10, 30, 1000) < loss_bound(20, 20, 1000) < loss_bound(30, 10, 1000)
    # a clean, large calibration set supports the claim: exits that are always right harm nothing
    n = 2000
    labels = torch.arange(n) % 4
    sure = torch.nn.functional.one_hot(labels, 4).float() * 20
    logits = torch.stack([sure, sure, sure])
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        big = lossless_thresholds(logits, labels, [1, 2, 3], 3, folds=4)
    assert big["guard"]["harm"] == big["guard"]["rescued"] == 0 and big["guard"]["supported"]
    assert big["guard"]["loss_bound"] < 0.002
