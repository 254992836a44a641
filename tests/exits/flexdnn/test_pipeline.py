"""FlexDNN end to end on a tiny VGG: valid under the shared runtime policy, rebuildable, errors."""

import pytest
import torch

from nestflex.errors import NestflexError
from nestflex.exits import apply_policy, calibrate
from nestflex.exits.flexdnn import FlexDNNConfig, build_flex_network, evaluate_flex, flexdnn, operating_points
from nestflex.exits.flexdnn.search import build_candidates, location_groups
from nestflex.exits.placement import resolve_positions
from nestflex.graph import trace
from nestflex.models import create_model
from tests.conftest import settle_batchnorm

# 20 L-BFGS iterations per refit: the checks here are structural (policy, plan, rebuild), and the
# refits dominated the fixture's time at the default 100
CONFIG = FlexDNNConfig(locations=(0.3, 0.6), exits_per_location=2, epochs=1, rank_samples=64, fit_samples=64,
                       refit_iters=20, input_size=4)


def _batches(n: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(32, 3, 32, 32, generator=g), torch.randint(0, 10, (32,), generator=g)) for _ in range(n)]


@pytest.fixture(scope="module")
def result():
    torch.manual_seed(0)
    backbone = settle_batchnorm(create_model("vgg11", width=0.125)).eval()
    return flexdnn(backbone, _batches(3, 0), _batches(3, 1), CONFIG)


def test_searched_exits_run_under_the_shared_policy(result):
    net, spec = result.network, result.spec
    assert net is not None and len(spec["exits"]) == net.num_exits - 1
    x = torch.randn(16, 3, 32, 32)
    batched = net.early_exit(x, spec["thresholds"], confidence="entropy", fallback="final")
    reference = apply_policy(net(x), spec["thresholds"], confidence="entropy", fallback="final")
    assert torch.equal(batched.exit_index, reference.exit_index)
    torch.testing.assert_close(batched.logits, reference.logits)
    report = calibrate(net, _batches(1, 2), confidence="entropy", folds=2)
    assert len(report["lossless"]["thresholds"]) == net.num_exits - 1


def test_plan_and_profile_are_reported(result):
    plan = result.report["plan"]
    assert plan["mean_macs"] <= plan["all_candidates_macs"]
    assert plan["mean_macs"] < result.report["backbone_macs"] or not plan["kept"]
    points = result.report["profile"]["operating_points"]
    assert [p["mean_macs"] for p in points] == sorted(p["mean_macs"] for p in points)
    assert all(b["accuracy"] > a["accuracy"] for a, b in zip(points, points[1:]))
    for row in result.report["search"]:
        assert row["exit_rate"] >= row["full_exit_rate"] - CONFIG.rate_tolerance
        assert 0 <= row["depth"] <= CONFIG.blocks
    # input_size=4: each exit pools its tapped map down to about 4x4 first (the rebuild test below runs them)
    pools = [(e["in_hw"], e["stem_pool"]) for e in result.spec["exits"]]
    assert pools and all(sp == max(1, min(hw) // 4) for hw, sp in pools) and any(sp > 1 for _, sp in pools)
    # the shipped thresholds are the cross-validated ones, measured on the whole validation split
    cal = result.report["calibration"]
    assert result.spec["thresholds"] == cal["thresholds"] and cal["folds"] == CONFIG.calibration_folds == 5
    assert cal["thresholds"] == [max(col) for col in zip(*(f["thresholds"] for f in cal["cv"]))]
    val = evaluate_flex(result.network, result.spec, _batches(3, 1))
    assert val["accuracy"] == pytest.approx(cal["accuracy"])
    assert val["mean_macs"] == pytest.approx(cal["mean_macs"])


def test_in_sample_thresholds_are_the_plans_when_cross_validation_is_off():
    from dataclasses import replace

    torch.manual_seed(0)
    backbone = settle_batchnorm(create_model("vgg11", width=0.125)).eval()
    result = flexdnn(backbone, _batches(3, 0), _batches(3, 1), replace(CONFIG, calibration_folds=0))
    plan, cal = result.report["plan"], result.report["calibration"]
    assert result.spec["thresholds"] == plan["thresholds"] == cal["thresholds"] and cal["folds"] == 0
    assert cal["split"] == "validation" and "cv" not in cal
    val = evaluate_flex(result.network, result.spec, _batches(3, 1))
    assert val["accuracy"] == pytest.approx(plan["accuracy"]) and val["mean_macs"] == pytest.approx(plan["mean_macs"])


@pytest.mark.parametrize("folds", [0, 2])
def test_a_calibration_split_fits_the_shipped_thresholds(folds):
    """The search and plan see only validation; thresholds and operating points come from the
    held-out calibration split (lossless there, in-sample or cross-validated)."""
    from dataclasses import replace

    from nestflex.exits import collect_logits, lossless_thresholds
    from nestflex.exits.calibration import fit_lossless_thresholds

    torch.manual_seed(0)
    backbone = settle_batchnorm(create_model("vgg11", width=0.125)).eval()
    calib = _batches(3, 2)
    result = flexdnn(backbone, _batches(3, 0), _batches(3, 1), replace(CONFIG, calibration_folds=folds),
                     calibration_batches=calib)
    net, cal = result.network, result.report["calibration"]
    assert cal["split"] == "calibration" == result.report["profile"]["split"] and cal["samples"] == 96
    logits, labels = collect_logits(net, calib)
    if folds:
        expected = lossless_thresholds(logits, labels, net.exit_macs, net.backbone_macs, "entropy", folds=folds)["thresholds"]
    else:
        conf = torch.stack([1 + (p.softmax(-1) * p.log_softmax(-1)).sum(-1) / torch.log(torch.tensor(10.0))
                            for p in logits]).double()
        expected = fit_lossless_thresholds(conf, logits.argmax(-1) == labels[None])
    assert result.spec["thresholds"] == cal["thresholds"] == expected
    on_calib = evaluate_flex(net, result.spec, calib)
    assert on_calib["accuracy"] == pytest.approx(cal["accuracy"]) and on_calib["mean_macs"] == pytest.approx(cal["mean_macs"])
    if not folds:  # in-sample lossless on the calibration split: no accuracy below the final exit's there
        assert cal["accuracy"] >= cal["final_accuracy"]
    # the minimum filter count is read on the calibration split too, not on the one that chose the order
    from nestflex.pruning.collective import exit_accuracy_curve, min_filters, pooled_activations

    graph = trace(backbone)
    points = resolve_positions(graph, list(CONFIG.locations))
    fx, fy = pooled_activations(backbone, graph, [p.node for p in points], _batches(3, 0), pool=CONFIG.pool,
                                max_samples=CONFIG.rank_samples, name="fit")
    cx, cy = pooled_activations(backbone, graph, [p.node for p in points], calib, pool=CONFIG.pool,
                                max_samples=CONFIG.rank_samples, name="calibration")
    for rec, p in zip(result.report["ranking"], points):
        curve = exit_accuracy_curve(fx[p.node], fy, cx[p.node], cy, rec["order"], num_classes=10)
        a = float(curve[-1])
        assert rec["min_filters_split"] == "calibration" and rec["min_filters_samples"] == 64
        assert rec["min_filters_reference_accuracy"] == pytest.approx(a)
        assert rec["min_filters_tolerance"] == pytest.approx(2 * (a * (1 - a) / 64) ** 0.5)
        assert rec["min_filters"] == min_filters(curve, rec["min_filters_tolerance"], rule="first")


def test_default_candidates_sit_after_every_layer_and_the_plan_chooses():
    from dataclasses import replace

    torch.manual_seed(0)
    backbone = settle_batchnorm(create_model("vgg11", width=0.125)).eval()
    result = flexdnn(backbone, _batches(2, 0), _batches(2, 1), replace(CONFIG, locations=FlexDNNConfig().locations))
    every = [p.name for p in trace(backbone).split_points if len(p.tensors[-1][1]) == 3]
    assert [c["location"] for c in result.report["candidates"]] == every == [f"features.relu{i}" for i in range(1, 9)]
    plan = result.report["plan"]
    assert set(plan["kept_locations"]) <= set(every) and plan["mean_macs"] <= plan["all_candidates_macs"]


class _Augmented:
    """Re-iterable batches flipped at random by torch's global generator, as training loaders are."""

    def __init__(self, batches):
        self.batches = batches

    def __iter__(self):
        from nestflex.data._transforms import random_crop_flip

        return iter([(random_crop_flip(x, padding=4), y) for x, y in self.batches])


def test_the_same_config_gives_the_same_exits_whatever_the_global_seed():
    backbone = settle_batchnorm(create_model("vgg11", width=0.125)).eval()
    specs = []
    for outer in (1, 2):
        torch.manual_seed(outer)  # what ran before (e.g. loading a checkpoint) must not matter
        specs.append(flexdnn(backbone, _Augmented(_batches(2, 0)), _batches(2, 1), CONFIG).spec)
        after = torch.rand(4)
        torch.manual_seed(outer)
        assert torch.equal(after, torch.rand(4))  # the caller's generator is where it was before the call
    assert specs[0] == specs[1]


def test_without_a_calibration_split_the_minimum_filters_are_read_on_validation_and_say_so(result):
    for rec in result.report["ranking"]:
        n, a = rec["min_filters_samples"], rec["all_filters_accuracy"]
        assert rec["min_filters_split"] == "validation" and n == 64 and rec["min_filters_reference_accuracy"] == a
        assert rec["min_filters_tolerance"] == pytest.approx(2 * (a * (1 - a) / n) ** 0.5)
        assert 1 <= rec["min_filters"] <= rec["filters"]


def test_every_layer_candidates_on_a_residual_backbone():
    """Several locations of a residual stage share one channel group; each is ranked on its own
    activation (the map its exits read), so they get their own orders."""
    from dataclasses import replace

    torch.manual_seed(0)
    backbone = settle_batchnorm(create_model("resnet20", width=0.25)).eval()
    result = flexdnn(backbone, _batches(2, 0), _batches(2, 1),
                     replace(CONFIG, locations=("all",), exits_per_location=1, rank_samples=32, fit_samples=32))
    every = [p.name for p in trace(backbone).split_points if len(p.tensors[-1][1]) == 3]
    assert [c["location"] for c in result.report["candidates"]] == every and len(every) == 19
    assert result.report["plan"]["mean_macs"] <= result.report["plan"]["all_candidates_macs"]
    graph = trace(backbone)
    groups = location_groups(graph, resolve_positions(graph, every))
    orders = {r["location"]: r["order"] for r in result.report["ranking"]}
    shared = [[name for name, g in zip(every, groups) if g.id == gid] for gid in {g.id for g in groups}]
    shared = [names for names in shared if len(names) > 1]
    assert shared  # residual stages: several locations per group ...
    assert any(len({tuple(orders[n]) for n in names}) > 1 for names in shared)  # ... ranked apart


def test_rebuilt_from_spec_gives_the_same_outputs(result):
    net = result.network
    copy = build_flex_network(create_model("vgg11", width=0.125), result.spec)
    copy.load_state_dict(net.state_dict())
    x = torch.randn(4, 3, 32, 32)
    for a, b in zip(net(x), copy.eval()(x)):
        torch.testing.assert_close(a, b)


def test_operating_points_keep_the_pareto_front():
    rows = [{"threshold": t, "accuracy": a, "mean_macs": m, "mean_macs_fraction": m / 10}
            for t, a, m in [(0.1, 0.5, 2), (0.2, 0.4, 3), (0.3, 0.7, 5), (0.4, 0.7, 6)]]
    assert [p["threshold"] for p in operating_points(rows)] == [0.1, 0.3]


def test_bad_input_errors():
    backbone = create_model("vgg11", width=0.125).eval()
    with pytest.raises(NestflexError, match=r"the validation split is empty \(0 samples\)"):
        flexdnn(backbone, _batches(1, 0), [], CONFIG)
    graph = trace(backbone)
    point = graph.split_points[0]  # 8 filters at width 0.125
    with pytest.raises(NestflexError, match=r"location `features.relu1`: a layer with 8 filters cannot feed M=9"):
        build_candidates([point], [torch.arange(8)], 10, exits_per_location=9)
    with pytest.raises(NestflexError, match=r"`orders` must hold one filter order per location: 1 locations, 2 orders"):
        build_candidates([point], [torch.arange(8), torch.arange(8)], 10)
    with pytest.raises(NestflexError, match=r"`input_size` must be a positive int or None \(no pooling\), got 0"):
        build_candidates([point], [torch.arange(8)], 10, input_size=0)
    with pytest.raises(NestflexError, match=r"`FlexDNNConfig.input_size` must be a positive int or None.*got 0"):
        FlexDNNConfig(input_size=0)
    with pytest.raises(NestflexError, match=r"the FlexDNN spec has no exits.*HINT"):
        build_flex_network(backbone, {"exits": []})
    with pytest.raises(NestflexError, match=r"`calibration_batches` has 0 samples, fewer than one\. HINT"):
        flexdnn(backbone, _batches(1, 0), _batches(1, 1), CONFIG, calibration_batches=[])
    few = [(torch.randn(3, 3, 32, 32), torch.arange(3))]
    with pytest.raises(NestflexError, match=r"`calibration_batches` has 3 samples, fewer than calibration_folds=5\. "
                                            r"HINT: pass at least 5 samples .*, or calibration_folds=0"):
        flexdnn(backbone, _batches(1, 0), _batches(1, 1), CONFIG, calibration_batches=few)
    class Stream(torch.utils.data.IterableDataset):  # no len(): its samples are counted
        def __iter__(self):
            return iter([(torch.randn(3, 32, 32), 0)] * 4)

    with pytest.raises(NestflexError, match=r"`calibration_batches` has 4 samples, fewer than calibration_folds=5"):
        flexdnn(backbone, _batches(1, 0), _batches(1, 1), CONFIG,
                calibration_batches=torch.utils.data.DataLoader(Stream(), batch_size=2))
    with pytest.raises(NestflexError, match=r"`calibration_batches` is a one-shot iterator.*HINT: pass a list"):
        flexdnn(backbone, _batches(1, 0), _batches(1, 1), CONFIG, calibration_batches=iter(_batches(1, 2)))
    with pytest.raises(NestflexError, match=r"`calibration_folds` must be 0 \(in-sample thresholds\) or an int >= 2, got 1"):
        FlexDNNConfig(calibration_folds=1)


@pytest.mark.parametrize("field, value, message", [
    ("locations", (), r"`FlexDNNConfig.locations` must be a non-empty tuple.*got \(\). HINT: \('all',\)"),
    ("exits_per_location", 0, r"`FlexDNNConfig.exits_per_location` must be a positive int, got 0. HINT: the default is 3"),
    ("rank_samples", 0, r"`FlexDNNConfig.rank_samples` must be a positive int, got 0"),
    ("fit_samples", 2.5, r"`FlexDNNConfig.fit_samples` must be a positive int, got 2.5"),
    ("pool", True, r"`FlexDNNConfig.pool` must be a positive int, got True"),
    ("refit_iters", -1, r"`FlexDNNConfig.refit_iters` must be a positive int, got -1"),
    ("p_max", 1.0, r"`FlexDNNConfig.p_max` must be a number in \[0, 1\), got 1.0. HINT: the default is 0.5"),
    ("rate_tolerance", -0.1, r"`FlexDNNConfig.rate_tolerance` must be a number in \[0, 1\), got -0.1"),
    ("lr", 0, r"`FlexDNNConfig.lr` must be a positive number, got 0"),
    ("min_filters_tolerance", 1.5, r"`FlexDNNConfig.min_filters_tolerance` must be an accuracy fraction in \[0, 1\)"),
    ("seed", "0", r"`FlexDNNConfig.seed` must be an int, got '0'"),
    ("confidence", "entrpy", r"unknown confidence measure `entrpy`; choose from: entropy, max_prob"),
])
def test_every_config_field_is_checked_when_the_config_is_built(field, value, message):
    with pytest.raises(NestflexError, match=message):
        FlexDNNConfig(**{field: value})


def test_a_locations_list_becomes_a_tuple():
    assert FlexDNNConfig(locations=[0.3, "all"]).locations == (0.3, "all")


def _bench_flex_plan():
    from tests.scripts import load_script

    return load_script("benchmarks/exits/flex_plan.py")


def test_matched_accuracy_interpolates_along_the_pareto_front():
    bench = _bench_flex_plan()
    pts = [{"accuracy": a, "mean_macs": m} for a, m in [(0.80, 50), (0.70, 60), (0.90, 100), (0.85, 90), (0.95, 200)]]
    assert [p["mean_macs"] for p in bench.pareto(pts)] == [50, 90, 100, 200]  # (0.70, 60) is dominated
    assert bench.macs_at(pts, 0.875) == pytest.approx(95.0)  # halfway from (0.85, 90) to (0.90, 100)
    assert bench.macs_at(pts, 0.5) == 50  # the cheapest point already beats it
    assert bench.macs_at(pts, 0.99) is None  # never reached
