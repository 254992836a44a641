import pytest

from nestflex.exits import DEFAULT_POSITIONS, ExitError, MultiExitNetwork, resolve_positions
from nestflex.exits.placement import ALL, parse_positions
from nestflex.graph import trace
from nestflex.models import create_model


def _boundaries(graph) -> list[float]:
    total, running, out = graph.macs(), 0, []
    for layer in graph.layers:
        running += layer.macs
        out.append(running / total)
    return out


@pytest.mark.parametrize("name", ["vgg16", "resnet56", "timm:resnet18"])
def test_equal_mac_placement_lands_within_one_layer(name):
    graph = trace(create_model(name, width=1.0))
    points = resolve_positions(graph, DEFAULT_POSITIONS)
    bounds = _boundaries(graph)
    for f, p in zip(DEFAULT_POSITIONS, points):
        lo, hi = sorted((f, p.macs_fraction))
        crossed = [b for b in bounds if lo < b < hi]  # layer ends strictly between request and exit
        assert len(crossed) <= 1, (f, p.name, p.macs_fraction, crossed)
    assert [p.index for p in points] == sorted(p.index for p in points)


def test_placement_picks_the_nearest_split_point():
    graph = trace(create_model("vgg16"))
    for f in (0.05, 0.33, 0.5, 0.77, 0.95):
        (point,) = resolve_positions(graph, [f])
        best = min(abs(s.macs_fraction - f) for s in graph.split_points if len(s.tensors[-1][1]) == 3)
        assert abs(point.macs_fraction - f) == best


def test_crowded_fractions_get_distinct_split_points():
    graph = trace(create_model("vgg11"))  # 8 activations: 0.6 and 0.75 are both nearest to relu5
    fractions = {p.name: p.macs_fraction for p in graph.split_points}
    points = resolve_positions(graph, DEFAULT_POSITIONS)
    names = [p.name for p in points]
    assert len(set(names)) == 6 and [p.index for p in points] == sorted(p.index for p in points)
    assert names[3:5] == ["features.relu5", "features.relu6"] and fractions["features.relu6"] > 0.75
    # the nearest split points where they are distinct
    (alone,) = resolve_positions(graph, [0.75])
    assert alone.name == "features.relu5"


def test_names_and_fractions_mix():
    net = MultiExitNetwork(
        create_model("resnet20", width=0.25), positions=("layer1.2.relu2", 0.5, "layer3_1_relu2")
    )
    assert net.exit_names == ["layer1.2.relu2", "layer2.1.relu1", "layer3.1.relu2", "final"]
    assert net.positions == sorted(net.positions) and all(0 < p < 1 for p in net.positions)


def test_all_is_every_feature_map_split_point():
    graph = trace(create_model("vgg16", width=0.25))
    points = resolve_positions(graph, [ALL])
    assert [p.name for p in points] == [f"features.relu{i}" for i in range(1, 14)]  # not classifier.relu (1-D)
    assert parse_positions("all") == [ALL]
    net = MultiExitNetwork(create_model("resnet20", width=0.25), positions=[ALL])
    assert len(net.exit_names) == 1 + len(resolve_positions(trace(net.backbone), [ALL])) and net.exit_names[-1] == "final"


@pytest.mark.parametrize(
    "positions, match",
    [
        (
            (0.0, 0.5),
            r"`positions\[0\]` must be a MACs fraction in \(0, 1\) \(exclusive\) or a layer name, got 0.0",
        ),
        (
            (0.5, 1.0),
            r"`positions\[1\]` must be a MACs fraction in \(0, 1\) \(exclusive\) or a layer name, got 1.0",
        ),
        ((-0.2,), r"`positions\[0\]` must be a MACs fraction in \(0, 1\).*got -0.2"),
        ((0.3, 0.3), r"`positions` has the duplicate 0.3 \(at index 1\)"),
        (("features.relu3", "features.relu3"), r"`positions` has the duplicate 'features.relu3'"),
        ((), r"`positions` must be a non-empty sequence"),
        (0.5, r"`positions` must be a non-empty sequence .* got 0.5. HINT: the SPINN default"),
        ((True,), r"`positions\[0\]` must be a MACs fraction"),
        (
            ("features.conv3",),
            r"no split point named `features.conv3`; exits attach at activation outputs: features.relu1",
        ),
        (
            ("classifier.relu",),
            r"split point `classifier.relu` has per-sample shape \(128,\), not a \(C, H, W\)",
        ),
        (
            (0.6, 0.3),
            r"`positions` must follow execution order: `positions\[1\]`=0.3 comes before `positions\[0\]`=0.6",
        ),
        (
            ("features.relu9", 0.3),
            r"`positions` must follow execution order: `positions\[1\]`=0.3 comes before",
        ),
        (
            tuple(i / 20 for i in range(1, 15)),
            r"14 exit positions but the backbone has only 13 places for exits",
        ),
        ((0.01, 0.02, "features.relu2"), r"cannot each get their own split point in execution order"),
        (("all", 0.5), r"'all' means every split point and stands alone. HINT: pass \['all'\]"),
    ],
)
def test_bad_positions_are_explained(positions, match):
    with pytest.raises(ExitError, match=match):
        MultiExitNetwork(create_model("vgg16", width=0.25), positions=positions)


def test_default_positions_are_spinns_where_they_fit_and_every_place_where_not():
    import warnings

    from nestflex.exits.placement import default_positions
    from tests.exits.user_cnn import SHAPE, DigitsCNN

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # room for six: no warning
        assert default_positions(trace(create_model("vgg11", width=0.25))) == list(DEFAULT_POSITIONS)
        net = MultiExitNetwork(create_model("vgg11", width=0.25))
    assert len(net.exits) == len(DEFAULT_POSITIONS)
    small = trace(DigitsCNN(), SHAPE)
    with pytest.warns(UserWarning, match=r"the backbone has 5 places for exits"):
        assert default_positions(small) == ["body.2", "body.5", "body.9", "body.12", "body.16"]
    with pytest.warns(UserWarning, match=r"placing 5 exits, one at each place"):
        assert [p.name for p in resolve_positions(small)] == ["body.2", "body.5", "body.9", "body.12", "body.16"]
    with pytest.warns(UserWarning, match=r"placing 5 exits"):
        assert MultiExitNetwork(DigitsCNN(), input_shape=SHAPE).num_exits == 6
