import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from nestflex.graph import trace
from nestflex.models import create_model
from nestflex.pruning import (
    PruningError,
    accuracy,
    allocation_weights,
    get_importance,
    plan_step,
    plot_sensitivity,
    pruned_copy,
    sensitivity_profile,
    shrink,
)


def _loader(n=32, classes=10):
    g = torch.Generator().manual_seed(0)
    return DataLoader(TensorDataset(torch.randn(n, 3, 32, 32, generator=g), torch.arange(n) % classes), batch_size=16)


def test_profile_shape_and_original_untouched(tmp_path):
    model = create_model("vgg11", width=0.125).eval()
    graph = trace(model)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    scores = get_importance("l1")(model, graph)
    loader = _loader()
    prof = sensitivity_profile(graph, scores, lambda m: accuracy(m, loader), fractions=(0.25, 0.5), criterion="l1")
    assert prof["fractions"] == [0.25, 0.5] and prof["criterion"] == "l1"
    assert [r["group"] for r in prof["layers"]] == [g.name for g in graph.prunable_groups]
    assert prof["layers"][0]["removed"] == [2, 4]  # 8 channels
    assert all(0.0 <= a <= 1.0 for r in prof["layers"] for a in r["accuracy"])
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    plot_sensitivity([prof], tmp_path / "s.png", title="t")
    assert (tmp_path / "s.png").stat().st_size > 0
    with pytest.raises(PruningError, match=r"`fractions` must be non-empty, each in \(0, 1\)"):
        sensitivity_profile(graph, scores, lambda m: 0.5, fractions=(0.0, 1.0))


def test_pruned_copy_is_smaller_and_agrees_with_masking():
    torch.manual_seed(0)
    model = create_model("vgg11", width=0.125).eval()
    graph = trace(model)
    g = graph.group("features.conv3")
    keep = torch.tensor([0, 2, 5, 7, 9, 12])
    small = pruned_copy(graph, g, keep)
    assert small.get_submodule("features.conv3").out_channels == 6
    x = torch.randn(4, 3, 32, 32)
    # masked: zero the removed filters and their BatchNorm affine, so those channels are 0 after ReLU
    drop = torch.tensor(sorted(set(range(g.width)) - set(keep.tolist())))
    with torch.no_grad():
        model.features.conv3.weight[drop] = 0
        model.features.bn3.weight[drop] = 0
        model.features.bn3.bias[drop] = 0
    torch.testing.assert_close(small(x), model(x), rtol=1e-5, atol=1e-5)


def test_allocation_weights_follow_the_tolerance_rule():
    prof = {
        "baseline_accuracy": 0.9,
        "fractions": [0.2, 0.4, 0.6],
        "layers": [
            {"id": 0, "accuracy": [0.90, 0.89, 0.80]},  # tolerates 0.4
            {"id": 1, "accuracy": [0.85, 0.90, 0.90]},  # first point already too low: 0
            {"id": 2, "accuracy": [0.90, 0.90, 0.895]},  # tolerates 0.6
        ],
    }
    w = allocation_weights(prof, max_drop=0.02)
    assert w == pytest.approx({0: 0.4 / 0.6, 1: 0.0, 2: 1.0})
    fragile = dict(prof, layers=[{"id": 0, "accuracy": [0.5, 0.4, 0.3]}, {"id": 1, "accuracy": [0.6, 0.5, 0.1]}])
    with pytest.warns(UserWarning, match="allocating pruning uniformly"):
        assert allocation_weights(fragile, max_drop=0.02) == {0: 1.0, 1: 1.0}
    with pytest.raises(PruningError, match="`max_drop`"):
        allocation_weights(prof, max_drop=2)


def test_plan_step_removes_lowest_scores_in_proportion_and_keeps_a_floor():
    graph = trace(create_model("vgg11", width=0.125))
    ids = [g.id for g in graph.prunable_groups]
    scores = {i: torch.arange(graph.group(i).width, dtype=torch.float64).flip(0) for i in ids}
    plan = plan_step(graph, scores, {ids[0]: 1.0, ids[1]: 0.5, ids[2]: 0.0}, step=0.5, min_channels=2)
    assert plan[ids[0]].tolist() == [0, 1, 2, 3]  # 8 channels, 4 removed: the highest indices score lowest
    assert plan[ids[1]].numel() == 16 - 4
    assert ids[2] not in plan  # weight 0: never pruned
    tiny = plan_step(graph, scores, {ids[0]: 1.0}, step=0.99, min_channels=7)
    assert tiny[ids[0]].numel() == 7


@pytest.mark.parametrize(("step", "round_to", "kept"), [
    (0.25, 4, [4, 12, 24, 24]),       # asks 6, 12, 24, 24: 6 is a tie, rounded to fewer channels
    (0.2, 8, [None, None, 24, 24]),   # asks 6 of 8 and 13 of 16 (nearest multiple: the width: left alone), 26 -> 24
    (0.95, 8, [None, 8, 8, 8]),       # never below the smallest multiple >= min_channels (8: the first group's width)
])
def test_plan_step_rounds_kept_counts_to_a_multiple(step, round_to, kept):
    graph = trace(create_model("vgg11", width=0.125))  # widths 8, 16, 32, 32, 64, ...
    groups = graph.prunable_groups[:4]
    scores = {g.id: torch.arange(g.width, dtype=torch.float64) for g in groups}
    plan = plan_step(graph, scores, {g.id: 1.0 for g in groups}, step=step, round_to=round_to)
    assert [plan[g.id].numel() if g.id in plan else None for g in groups] == kept
    for g in groups:
        if g.id in plan:  # the lowest scores go, as without rounding
            assert plan[g.id].tolist() == list(range(g.width - plan[g.id].numel(), g.width))
    with pytest.raises(PruningError, match="`round_to` must be an int >= 1, got 0"):
        plan_step(graph, scores, {}, step=0.5, round_to=0)


def test_rounded_groups_follow_the_unrounded_schedule_through_their_targets():
    """A group whose step is smaller than half a multiple waits, but its target keeps shrinking,
    so it reaches the next multiple when the unrounded schedule does (it used to wait forever)."""
    graph = trace(create_model("vgg11", width=0.125))
    g = graph.prunable_groups[1]  # 16 channels
    scores = {g.id: torch.arange(16, dtype=torch.float64)}
    target, kept_at = 16, []
    for _ in range(8):
        plan = plan_step(graph, scores, {g.id: 0.2}, step=0.25, round_to=8, targets={g.id: target})
        kept_at.append(plan[g.id].numel() if g.id in plan else None)
        if g.id in plan:
            break
        target = shrink(target, 0.2, 0.25)
    # unrounded widths 15, 14, 13 round back to 16; the fourth step's 12 is a tie: 8
    assert kept_at == [None, None, None, 8]
    assert [shrink(w, 0.2, 0.25) for w in (16, 15, 14, 13)] == [15, 14, 13, 12]
    # without targets (each step from the current width) the group never moves
    assert g.id not in plan_step(graph, scores, {g.id: 0.2}, step=0.25, round_to=8)
    # a target above the width (rounded down past it) shrinks on its own schedule, never growing
    # the group; without rounding the targets are the widths and are ignored
    assert g.id not in plan_step(graph, scores, {g.id: 1.0}, step=0.1, round_to=8, targets={g.id: 40})
    assert plan_step(graph, scores, {g.id: 1.0}, step=0.25, targets={g.id: 40})[g.id].numel() == 12
