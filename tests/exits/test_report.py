"""nestflex.exits.report: what the recipes write about a multi-exit network (issue 43, item 8).

evaluate_exits is checked against its parts run by hand (calibrate on validation, exit_profile on
test with the validation thresholds), so a wiring mistake (the wrong split, the wrong thresholds,
the wrong fallback) shows as a mismatch; cheapest_within and exits_summary on hand-made rows.
"""

from __future__ import annotations

import json

import pytest
import torch

from nestflex.exits import MultiExitNetwork, calibrate, collect_logits, exit_profile
from nestflex.exits.report import cheapest_within, evaluate_exits, exits_summary
from nestflex.models import create_model
from tests.exits.conftest import tiny_loader

THRESHOLDS = (0.0, 0.3, 0.6, 1.0)


def _row(threshold, accuracy, macs):
    return {"threshold": threshold, "accuracy": accuracy, "mean_macs_fraction": macs}


# ---------------------------------------------------------------------------------------- cheapest_within


def test_cheapest_within_picks_the_lowest_macs_row_inside_the_accuracy_drop():
    sweep = [_row(0.0, 0.60, 0.2), _row(0.5, 0.78, 0.5), _row(0.8, 0.795, 0.7), _row(1.0, 0.80, 1.0)]
    assert cheapest_within(sweep, 0.80, 0.01)["threshold"] == 0.8  # 0.78 is 2 points down: too far
    assert cheapest_within(sweep, 0.80, 0.05)["threshold"] == 0.5
    assert cheapest_within(sweep, 0.80, 0.0)["threshold"] == 1.0
    assert cheapest_within(sweep, 0.80, 1.0)["threshold"] == 0.0  # any accuracy: the cheapest row


def test_cheapest_within_counts_a_row_exactly_at_the_limit_despite_float_rounding():
    # 0.10 - 0.01 is 0.09000000000000001 in binary: a row measured at 0.09 must still count
    sweep = [_row(0.5, 0.09, 0.5), _row(1.0, 0.10, 1.0)]
    assert 0.09 < 0.10 - 0.01
    assert cheapest_within(sweep, 0.10, 0.01)["threshold"] == 0.5


def test_cheapest_within_breaks_a_macs_tie_by_accuracy_and_returns_none_when_nothing_fits():
    sweep = [_row(0.4, 0.70, 0.5), _row(0.6, 0.75, 0.5), _row(1.0, 0.76, 1.0)]
    assert cheapest_within(sweep, 0.76, 0.1)["threshold"] == 0.6  # same MACs, the more accurate
    assert cheapest_within(sweep, 0.90, 0.01) is None  # every row is more than a point below
    assert cheapest_within([], 0.5, 0.01) is None


# ---------------------------------------------------------------------------------------- evaluate_exits


@pytest.fixture(scope="module")
def net():
    torch.manual_seed(0)
    return MultiExitNetwork(create_model("resnet20", width=0.25), positions=(0.3, 0.6)).eval()


@pytest.mark.parametrize("fallback, other", [("most_confident", "final"), ("final", "most_confident")])
def test_evaluate_exits_calibrates_on_validation_and_profiles_test_with_those_thresholds(net, fallback, other):
    val, test_split = tiny_loader(40, seed=0), tiny_loader(32, seed=1)
    calibration, test = evaluate_exits(net, val, test_split, fallback=fallback, thresholds=THRESHOLDS, folds=2)

    # the calibration is calibrate() on the validation batches, labelled as such
    want_cal = calibrate(net, tiny_loader(40, seed=0), thresholds=THRESHOLDS, fallback=fallback, folds=2, seed=0)
    assert calibration["split"] == "validation" and calibration["samples"] == 40
    assert calibration["lossless"]["thresholds"] == want_cal["lossless"]["thresholds"]
    assert calibration["sweep"] == want_cal["sweep"]

    # the test profile: the test batches, the validation's lossless thresholds applied to them
    logits, labels = collect_logits(net, tiny_loader(32, seed=1))
    want = exit_profile(logits, labels, net.exit_macs, net.backbone_macs, net.exit_names, net.positions,
                        thresholds=THRESHOLDS, fallback=fallback,
                        at_thresholds=calibration["lossless"]["thresholds"])
    assert test["split"] == "test" and test["fallback"] == fallback
    assert test["sweep"] == want["sweep"] and test["exits"] == want["exits"]
    assert test["at_thresholds"] == want["at_thresholds"]
    assert test["at_thresholds"]["thresholds"] == calibration["lossless"]["thresholds"]

    # the same sweep with the other fallback, for comparison
    assert test["sweep_other_fallback"]["fallback"] == other
    other_sweep = exit_profile(logits, labels, net.exit_macs, net.backbone_macs, thresholds=THRESHOLDS,
                               fallback=other)["sweep"]
    assert test["sweep_other_fallback"]["sweep"] == other_sweep

    # the operating point is chosen on validation and only measured on test
    pick = cheapest_within(calibration["sweep"], calibration["final_accuracy"], 0.01)
    if pick is None:
        assert "chosen_on_validation" not in test
    else:
        chosen = test["chosen_on_validation"]
        assert chosen["threshold"] == pick["threshold"] and "within 1 point" in chosen["rule"]
        assert chosen == {"rule": chosen["rule"],
                          **next(r for r in want["sweep"] if r["threshold"] == pick["threshold"])}
    json.dumps([calibration, test], allow_nan=False)  # it goes into summary.json


# ---------------------------------------------------------------------------------------- exits_summary


def test_exits_summary_condenses_the_test_figures_rounded_and_names_the_early_exits(net):
    calibration, test = evaluate_exits(net, tiny_loader(40, seed=0), tiny_loader(32, seed=1),
                                       thresholds=THRESHOLDS, folds=2)
    s = exits_summary(net, calibration, test)
    assert s["layers"] == net.exit_names[:-1] and len(s["layers"]) == 2  # the final exit is not a layer
    assert s["positions"] == [round(p, 4) for p in net.positions]
    assert (s["confidence"], s["fallback"]) == (test["confidence"], test["fallback"])
    assert s["accuracy"] == [round(e["accuracy"], 4) for e in test["exits"]]
    assert s["backbone"] == {"accuracy": round(test["final_accuracy"], 4), "macs": net.backbone_macs}
    assert [r["threshold"] for r in s["sweep"]] == list(THRESHOLDS)
    assert [r["macs_fraction"] for r in s["sweep"]] == [round(r["mean_macs_fraction"], 4) for r in test["sweep"]]
    lossless = test["at_thresholds"]
    assert s["lossless"] == {"thresholds": lossless["thresholds"], "fallback": lossless["fallback"],
                             "accuracy": round(lossless["accuracy"], 4),
                             "macs_fraction": round(lossless["mean_macs_fraction"], 4),
                             "cv_accuracy_delta": round(calibration["lossless"]["cv_accuracy_delta_mean"], 4)}
    assert s["overthinking_rate"] == round(test["overthinking_rate"], 4)
    json.dumps(s, allow_nan=False)


def test_exits_summary_reports_within_1pt_only_when_validation_chose_a_point(net):
    calibration, test = evaluate_exits(net, tiny_loader(40, seed=0), tiny_loader(32, seed=1),
                                       thresholds=THRESHOLDS, folds=2)
    chosen = {"rule": "r", "threshold": 0.3, "accuracy": 0.123456, "mean_macs_fraction": 0.654321}
    with_pick = exits_summary(net, calibration, {**test, "chosen_on_validation": chosen})
    assert with_pick["within_1pt"] == {"threshold": 0.3, "accuracy": 0.1235, "macs_fraction": 0.6543}
    without = {k: v for k, v in test.items() if k != "chosen_on_validation"}
    assert "within_1pt" not in exits_summary(net, calibration, without)
