"""Collective importance (FlexDNN sequential backward selection) against reference behaviour."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from nestflex.errors import NestflexError, PruningError
from nestflex.graph import trace
from nestflex.pruning import (
    CollectiveImportance,
    collective_ranking,
    exit_accuracy_curve,
    get_importance,
    list_importances,
    min_filters,
)
from nestflex.pruning.collective import _RidgePath

COPIES = (0, 1, 2, 3)  # four copies of the one filter that sees channel 0
OTHER = 4  # sees channel 1 (a second, different cue)
NOISE = 5  # sees channel 2 (no cue)


def _toy(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """4 classes: channel 0 lights up for classes {1, 3}, channel 1 for {2, 3}; channel 2 is noise."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 4, (n,), generator=g)
    x = 0.6 * torch.randn(n, 3, 8, 8, generator=g)
    x[:, 0] += 1.5 * (y % 2 == 1).float()[:, None, None]
    x[:, 1] += 1.5 * (y >= 2).float()[:, None, None]
    return x, y


def _toy_layer() -> nn.Module:
    model = nn.Sequential(nn.Conv2d(3, 6, 1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(6, 4))
    with torch.no_grad():
        w = torch.zeros(6, 3, 1, 1)
        w[list(COPIES), 0] = 1.0
        w[OTHER, 1] = 1.0
        w[NOISE, 2] = 1.0
        model[0].weight.copy_(w)
        model[0].bias.zero_()
    return model


def test_registered_by_name():
    assert "collective" in list_importances()
    assert isinstance(get_importance("collective"), CollectiveImportance)


def test_keeps_one_copy_and_ranks_duplicates_low_where_l2_ties():
    model = _toy_layer()
    graph = trace(model, input_shape=(3, 8, 8))
    group = graph.prunable_groups[0]
    fit, val = _toy(600, 0), _toy(400, 1)
    crit = get_importance("collective", stop_fraction=0.0, pool=1)
    scores = crit(model, graph, [group], data=([fit], [val]))[group.id]
    order = crit.rankings[group.id].order.tolist()
    # the two distinct cues lead: exactly one copy of the channel-0 filter, and the channel-1 filter
    top = set(order[:2])
    assert OTHER in top and len(top & set(COPIES)) == 1
    kept_copy = (top & set(COPIES)).pop()
    assert all(scores[c] < scores[kept_copy] for c in COPIES if c != kept_copy)
    # three duplicates are redundant once one copy stays: they rank below the informative pair
    assert all(scores[c] < scores[OTHER] for c in COPIES if c != kept_copy)
    # L2 cannot tell the copies apart: identical weights, identical norms
    l2 = get_importance("l2")(model, graph, [group])[group.id]
    assert torch.equal(l2[list(COPIES)], l2[COPIES[0]].expand(len(COPIES)))


def test_block_removal_equals_refitting_from_scratch():
    g = torch.Generator().manual_seed(0)
    fx, fy = torch.randn(80, 5, 2, generator=g, dtype=torch.float64), torch.randint(0, 3, (80,), generator=g)
    vx, vy = torch.randn(30, 5, 2, generator=g, dtype=torch.float64), torch.randint(0, 3, (30,), generator=g)
    path = _RidgePath(fx, fy, vx, vy, 3, 1e-2)
    path.remove(1)
    path.remove(3)
    keep = [0, 2, 4]
    # the reference: standardise on all filters (as the path does), then fit on the kept blocks only
    mean, std = fx.mean(0, keepdim=True), fx.std(0, keepdim=True, unbiased=False)
    x = torch.cat([((fx - mean) / std)[:, keep].reshape(80, -1), torch.ones(80, 1, dtype=torch.float64)], 1)
    xv = torch.cat([((vx - mean) / std)[:, keep].reshape(30, -1), torch.ones(30, 1, dtype=torch.float64)], 1)
    a = x.T @ x + 1e-2 * 80 * torch.eye(x.shape[1], dtype=torch.float64)
    w = torch.linalg.solve(a, x.T @ torch.nn.functional.one_hot(fy, 3).double())
    torch.testing.assert_close(path.logits, xv @ w)


def test_candidates_match_one_refit_per_dropped_filter():
    g = torch.Generator().manual_seed(1)
    fx, fy = torch.randn(60, 4, 1, generator=g, dtype=torch.float64), torch.randint(0, 2, (60,), generator=g)
    vx, vy = torch.randn(40, 4, 1, generator=g, dtype=torch.float64), torch.randint(0, 2, (40,), generator=g)
    alive, acc, _ = _RidgePath(fx, fy, vx, vy, 2, 1e-3).candidates()
    for i, f in enumerate(alive.tolist()):
        ref = _RidgePath(fx, fy, vx, vy, 2, 1e-3)
        ref.remove(f)
        assert acc[i].item() == pytest.approx(ref.accuracy())


def test_min_filters_and_curve():
    fit, val = _toy(600, 0), _toy(400, 1)
    model = _toy_layer()
    graph = trace(model, input_shape=(3, 8, 8))
    from nestflex.pruning import pooled_responses

    (fx,), fy = pooled_responses(model, graph, graph.prunable_groups, [fit], pool=1)[0].values(), fit[1]
    (vx,), vy = pooled_responses(model, graph, graph.prunable_groups, [val], pool=1)[0].values(), val[1]
    r = collective_ranking(fx, fy, vx, vy, stop_fraction=0.0)
    curve = exit_accuracy_curve(fx, fy, vx, vy, r.order)
    torch.testing.assert_close(curve, r.kept_accuracy)
    assert min_filters(curve, tolerance=0.01) == 2  # one copy + the channel-1 filter suffice
    assert r.fits == sum(range(2, 7))
    again, correct = exit_accuracy_curve(fx, fy, vx, vy, r.order, return_correct=True)
    torch.testing.assert_close(again, curve)
    assert correct.shape == (6, vy.shape[0]) and correct.dtype == torch.bool
    torch.testing.assert_close(correct.double().mean(1), curve)


def test_min_filters_rules_differ_only_on_dips():
    dip = torch.tensor([0.5, 0.9, 0.9, 0.88, 0.9])  # flat from 2 filters, one dip at 4
    assert min_filters(dip, 0.005) == 5  # the literal rule: the dip at 4 blocks every smaller count
    assert min_filters(dip, 0.005, rule="first") == 2
    rising = torch.tensor([0.5, 0.7, 0.85, 0.9, 0.9])
    assert min_filters(rising, 0.005) == min_filters(rising, 0.005, rule="first") == 4
    with pytest.raises(PruningError, match=r"`rule` must be 'all_larger' or 'first', got 'any'.*HINT"):
        min_filters(dip, rule="any")


@pytest.mark.parametrize("n, survivors", [(16, 3), (20, 3), (128, 25), (5, 1), (4, 1)])
def test_stop_rule_keeps_fewer_than_a_fifth(n, survivors):
    g = torch.Generator().manual_seed(n)
    y = torch.randint(0, 3, (60,), generator=g)
    x = torch.randn(60, n, 1, generator=g, dtype=torch.float64) + y[:, None, None]
    r = collective_ranking(x[:30], y[:30], x[30:], y[30:], stop_fraction=0.2)
    top = r.scores == r.scores.max()
    assert int(top.sum()) == survivors and survivors < max(2, 0.2 * n + 1e-9)
    assert set(r.order[:survivors].tolist()) == set(top.nonzero().flatten().tolist())


def test_errors_name_the_problem():
    x, y = torch.randn(4, 3, 1), torch.randint(0, 2, (4,))
    with pytest.raises(PruningError, match=r"the validation split is empty \(0 samples\).*HINT"):
        collective_ranking(x, y, x[:0], y[:0])
    with pytest.raises(NestflexError, match=r"`stop_fraction` must be in \[0, 1\), got 1.5.*HINT"):
        CollectiveImportance(stop_fraction=1.5)
    with pytest.raises(PruningError, match=r"`pool` must be a positive int, got 0"):
        CollectiveImportance(pool=0)
    model = _toy_layer()
    graph = trace(model, input_shape=(3, 8, 8))
    with pytest.raises(PruningError, match=r"the validation split is empty \(0 samples\)"):
        get_importance("collective")(model, graph, data=([_toy(8, 0)], torch.utils.data.TensorDataset(*_toy(0, 1))))
    with pytest.raises(PruningError, match=r"needs labelled data.*HINT: pass data=\(fit, validation\)"):
        get_importance("collective")(model, graph)
    with pytest.raises(PruningError, match=r"`order` must be a permutation of the 3 filters"):
        exit_accuracy_curve(x, y, x, y, [0, 0, 1])
    with pytest.raises(PruningError, match=r"`tolerance` is an accuracy fraction"):
        min_filters(torch.ones(3), tolerance=2)
    with pytest.raises(PruningError, match=r"fit and evaluation features differ in shape: \(3, 1\) vs \(3, 2\)\. HINT"):
        exit_accuracy_curve(x, y, torch.randn(4, 3, 2), y, [0, 1, 2])
    with pytest.raises(PruningError, match=r"got a list of \(x, y\) batches, i.e. one split\. HINT: pass data=\(fit, validation\)"):
        get_importance("collective")(model, graph, data=[_toy(8, 0), _toy(8, 1)])
    with pytest.raises(PruningError, match=r"`val_fraction` must be in \(0, 1\), got '0.3'"):
        CollectiveImportance(val_fraction="0.3")


def test_group_responses_are_the_sum_of_their_nodes_activations():
    """A residual group's response sums its blocks' outputs; each node's own map stays available."""
    from nestflex.models import create_model
    from nestflex.pruning import pooled_activations, pooled_responses

    torch.manual_seed(0)
    model = create_model("resnet20", width=0.25).eval()
    graph = trace(model, input_shape=(3, 32, 32))
    group = max(graph.groups, key=lambda g: len(graph.response_nodes(g)))
    nodes = graph.response_nodes(group)
    assert len(nodes) > 1  # a residual stage
    data = [(torch.randn(6, 3, 32, 32), torch.arange(6) % 10)]
    summed, labels = pooled_responses(model, graph, [group], data, pool=2)
    acts, labels2 = pooled_activations(model, graph, nodes, data, pool=2)
    assert torch.equal(labels, labels2)
    torch.testing.assert_close(summed[group.id], sum(acts[n] for n in nodes))
    assert all(acts[n].shape == (6, group.width, 4) for n in nodes)
    assert not torch.allclose(acts[nodes[0]], acts[nodes[-1]])
    with pytest.raises(PruningError, match=r"the fit split is empty \(0 samples\)"):
        pooled_activations(model, graph, nodes, [], name="fit")
    with pytest.raises(PruningError, match=r"`nodes` \['nope'\] are not in the traced graph. HINT"):
        pooled_activations(model, graph, ["nope"], data)
    with pytest.raises(PruningError, match=r"`max_samples` must be a positive int or None \(all\), got -1"):
        pooled_activations(model, graph, nodes, data, max_samples=-1)


def test_the_cost_benchmarks_naive_fit_is_the_same_probe_and_its_estimate_sums_every_step():
    from tests.scripts import load_script

    bench = load_script("benchmarks/exits/collective_cost.py")
    g = torch.Generator().manual_seed(0)
    fx, vx = torch.randn(80, 6, 4, generator=g, dtype=torch.float64), torch.randn(40, 6, 4, generator=g, dtype=torch.float64)
    fy, vy = torch.randint(0, 10, (80,), generator=g), torch.randint(0, 10, (40,), generator=g)
    # the naive algorithm's fit from scratch is the probe the closed-form path starts from
    assert bench.one_exit_fit(fx, fy, vx, vy) == _RidgePath(fx, fy, vx, vy, 10, 1e-3).accuracy()
    # constant fit time: fits x time; linear time t(k) = k: sum over m of m * (m - 1), interpolated exactly
    assert bench.naive_estimate({1: 2.0, 9: 2.0}, 10) == pytest.approx(2.0 * sum(range(2, 11)))
    assert bench.naive_estimate({1: 1.0, 5: 5.0, 9: 9.0}, 10) == pytest.approx(sum(m * (m - 1) for m in range(2, 11)))
    with pytest.raises(ValueError, match="width 6 outside the timed range 1..5"):
        bench.naive_estimate({1: 1.0, 5: 5.0}, 10)
