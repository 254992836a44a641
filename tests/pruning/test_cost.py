"""One cost abstraction for pruning: MACs and measured latency priced the same way, the allocation
reweighted by what a step saves, the widths the table says are fast, and FilterPruning(cost=...)."""

from __future__ import annotations

import pytest
import pytorch_lightning as pl
import torch

from nestflex.graph import trace
from nestflex.models import create_model
from nestflex.profiling import LatencyTable, LayerSpec
from nestflex.pruning import (
    LatencyCost,
    MacsCost,
    PruningError,
    Roadmap,
    build_latency_table,
    cost_allocation,
    get_cost,
    latency_specs,
    plan_step,
)
from tests.pruning.test_callback import _dm, _module, _prune, _script, _trainer


@pytest.fixture(scope="module")
def table():
    return build_latency_table(create_model("vgg11", width=0.125), (3, 32, 32), repeats=3)


def _blocks(w: int) -> int:
    return -(-int(w) // 16)


def stepped_table(table: LatencyTable) -> LatencyTable:
    """``table``'s layers and sweep points with times that step every 16 channels, as this CPU's
    3x3 convs do, minus the timer's noise: a plan judged on it cannot turn on a noisy sample."""
    entries = {}
    for key, e in table.entries.items():
        entries[key] = {**e, "fine_ms": [0.01 * _blocks(w) for w in e["fine"]],
                        "grid_ms": [[0.01 * _blocks(i) * _blocks(o) for o in e["grid_out"]] for i in e["grid_in"]]}
    return LatencyTable(entries, table.threads, table.batch, table.backend, table.meta)


@pytest.fixture(scope="module")
def stepped(table):
    return stepped_table(table)


def test_macs_cost_is_the_graphs_macs_at_any_widths():
    g = trace(create_model("vgg11", width=0.125))
    widths = {x.id: max(1, x.width // 2) for x in g.prunable_groups}
    assert MacsCost()(g) == g.macs() and MacsCost()(g, widths) == g.macs(widths)
    assert MacsCost().widths_for(g, g.prunable_groups[0].id) is None


def test_latency_cost_sums_the_measured_layers_at_the_pruned_widths(table, stepped):
    net = create_model("vgg11", width=0.125)
    g = trace(net)
    cost = LatencyCost(table)
    specs = latency_specs(net, (3, 32, 32))
    assert set(table.entries) == {s.key for s in specs}  # one entry per distinct layer shape
    assert cost(g) == pytest.approx(sum(table.layer_time(s) for s in [*specs]) + _repeated(g, table, specs))
    half = {x.id: max(1, x.width // 2) for x in g.prunable_groups}
    # halving every width is faster on the noiseless table (the measured one can order two sub-ms
    # sums either way on a busy CPU)
    assert LatencyCost(stepped)(g, half) < LatencyCost(stepped)(g)
    # the cost of a model pruned for real equals the full model's cost at those widths (the lookup
    # finds the measured layer of the same shape that covers the pruned one)
    from nestflex.graph.surgery import prune_channels
    pruned = create_model("vgg11", width=0.125)
    for x in trace(pruned).prunable_groups:
        prune_channels(pruned, x, torch.arange(half[x.id]))
    assert cost(trace(pruned)) == pytest.approx(cost(g, half))


def _repeated(g, table, specs):
    """The time of the layers whose shape repeats an earlier one (measured once, counted each time)."""
    from nestflex.pruning.cost import _specs

    every = _specs(g)
    return sum(table.layer_time(s) for s in every) - sum(table.layer_time(s) for s in specs)


def test_the_fast_widths_of_a_group_are_measured_and_end_at_its_width(table):
    g = trace(create_model("vgg11", width=0.125))
    cost = LatencyCost(table)
    for x in g.prunable_groups:
        widths = cost.widths_for(g, x.id)
        assert widths[-1] == x.width and widths == sorted(set(widths))
        # each is faster than every larger one, beyond the noise margin
        times = [cost(g, {x.id: w}) for w in widths]
        assert all(a < b for a, b in zip(times, times[1:]))


def test_the_allocation_goes_to_the_groups_whose_step_saves_most_per_accuracy_risked():
    g = trace(create_model("vgg11", width=0.0625))  # 4..32 channels
    tolerant = {x.id: 1.0 for x in g.prunable_groups}
    # a fake cost: only the first group's channels cost time
    first = g.prunable_groups[0]

    class FirstOnly(MacsCost):
        def __call__(self, graph, widths=None):
            return float((widths or {}).get(first.id, first.width))

    weights, allowed = cost_allocation(g, tolerant, FirstOnly(), 0.25)
    assert weights[first.id] == 1.0 and all(w == 0.0 for i, w in weights.items() if i != first.id)
    assert all(v is None for v in allowed.values())  # MACs-like: any width
    # the accuracy side: a group that tolerates half as much takes half the share at equal saving
    weights, _ = cost_allocation(g, tolerant | {first.id: 0.5}, MacsCost(), 0.25)
    assert max(weights.values()) == 1.0 and 0 < weights[first.id] < 1.0
    with pytest.raises(PruningError, match="no group's next width saves any"):
        cost_allocation(g, tolerant, type("Flat", (MacsCost,), {"__call__": lambda self, graph, widths=None: 1.0})(),
                        0.25)


def test_plan_step_keeps_the_allowed_width_nearest_the_target():
    g = trace(create_model("vgg11", width=0.125))
    x = g.prunable_groups[0]  # 8 channels
    scores = {x.id: torch.arange(8, dtype=torch.float64)}
    plan = plan_step(g, scores, {x.id: 1.0}, 0.25, allowed={x.id: [3, 8]})
    assert x.id not in plan  # 8 - 2 = 6 is nearer 8 than 3: the group waits
    plan = plan_step(g, scores, {x.id: 1.0}, 0.25, targets={x.id: 5}, allowed={x.id: [3, 8]})
    assert plan[x.id].tolist() == [5, 6, 7]  # its target went on shrinking (5 - 1 = 4): nearest is 3
    plan = plan_step(g, scores, {x.id: 1.0}, 0.25, allowed={x.id: [4, 8]})
    assert plan[x.id].tolist() == [4, 5, 6, 7]  # 6 is as near 4 as 8: the tie goes to the smaller
    with pytest.raises(PruningError, match="not both"):
        plan_step(g, scores, {x.id: 1.0}, 0.25, round_to=4, allowed={x.id: [4, 8]})


def test_plan_step_snapping_up_drops_a_group_only_once_its_target_reaches_the_width():
    g = trace(create_model("vgg11", width=0.125))
    x = g.prunable_groups[0]  # 8 channels
    scores = {x.id: torch.arange(8, dtype=torch.float64)}
    # the target 4 is nearer 3 than 8 ('nearest' jumps to 3), but has not reached 3: 'up' waits
    assert plan_step(g, scores, {x.id: 1.0}, 0.2, targets={x.id: 5}, allowed={x.id: [3, 8]})[x.id].numel() == 3
    assert x.id not in plan_step(g, scores, {x.id: 1.0}, 0.2, targets={x.id: 5}, allowed={x.id: [3, 8]}, snap="up")
    plan = plan_step(g, scores, {x.id: 1.0}, 0.2, targets={x.id: 4}, allowed={x.id: [3, 8]}, snap="up")
    assert plan[x.id].tolist() == [5, 6, 7]  # 4 - 1 = 3: reached
    plan = plan_step(g, scores, {x.id: 1.0}, 0.25, targets={x.id: 7}, allowed={x.id: [2, 6, 8]}, snap="up")
    assert plan[x.id].tolist() == [2, 3, 4, 5, 6, 7]  # 7 - 2 = 5: the smallest width at or above it, 6
    # a multiple of round_to likewise: 8 - 2 = 6 rounds to 4 by 'nearest' (the tie), stays at 8 by 'up'
    assert plan_step(g, scores, {x.id: 1.0}, 0.25, round_to=4)[x.id].numel() == 4
    assert x.id not in plan_step(g, scores, {x.id: 1.0}, 0.25, round_to=4, snap="up")
    assert plan_step(g, scores, {x.id: 1.0}, 0.25, round_to=4, targets={x.id: 5}, snap="up")[x.id].numel() == 4
    with pytest.raises(PruningError, match="`snap` must be one of"):
        plan_step(g, scores, {x.id: 1.0}, 0.25, snap="down")


def test_plan_step_caps_the_cost_one_step_cuts_most_overdue_groups_first():
    """Groups that reach their next width together can cut far more than the step asks for
    (ResNet-50's same-width bottlenecks: 0.15 of the time in one 5% step): under ``max_cut`` the
    most overdue go first and the rest wait; the first always goes, so a roadmap never stalls."""
    g = trace(create_model("vgg11", width=0.125))
    xs = g.prunable_groups[:4]
    scores = {x.id: torch.arange(x.width, dtype=torch.float64) for x in xs}
    allowed = {x.id: [x.width // 2, x.width] for x in xs}
    # every target at half the width, the third group's past it: all four drop at once
    targets = {x.id: x.width // 2 - (2 if i == 2 else 0) for i, x in enumerate(xs)}
    macs = MacsCost()

    def price(widths):
        return macs(g, widths)

    full = plan_step(g, scores, {x.id: 1.0 for x in xs}, 0.05, targets=targets, allowed=allowed, snap="up")
    assert set(full) == {x.id for x in xs}
    cut_of = {x.id: price({}) - price({x.id: x.width // 2}) for x in xs}
    whole = price({}) - price({gid: k.numel() for gid, k in full.items()})
    kwargs = dict(targets=targets, allowed=allowed, snap="up", price=price)
    # a cap above the whole plan's cut changes nothing
    assert plan_step(g, scores, {x.id: 1.0 for x in xs}, 0.05, max_cut=whole + 1, **kwargs).keys() == full.keys()
    # a cap below any one group's cut: only the most overdue group goes (the third)
    assert list(plan_step(g, scores, {x.id: 1.0 for x in xs}, 0.05, max_cut=1, **kwargs)) == [xs[2].id]
    # a cap that holds the third and one more: the third, then the first in order that fits
    cap = cut_of[xs[2].id] + min(cut_of[x.id] for x in xs if x is not xs[2])
    capped = plan_step(g, scores, {x.id: 1.0 for x in xs}, 0.05, max_cut=cap, **kwargs)
    assert xs[2].id in capped and 1 < len(capped) < 4
    assert price({}) - price({gid: k.numel() for gid, k in capped.items()}) <= cap
    with pytest.raises(PruningError, match="`price` and a `max_cut` > 0 together"):
        plan_step(g, scores, {x.id: 1.0 for x in xs}, 0.05, price=price)
    with pytest.raises(PruningError, match="max_cut=0"):
        plan_step(g, scores, {x.id: 1.0 for x in xs}, 0.05, price=price, max_cut=0)


def test_get_cost_names_its_choices(table, tmp_path):
    assert isinstance(get_cost(None), MacsCost) and isinstance(get_cost(table), LatencyCost)
    assert isinstance(get_cost("latency", table.save(tmp_path / "t.json")), LatencyCost)
    assert get_cost(str(tmp_path / "t.json")).table.to_dict() == table.to_dict()  # a path, as a YAML config gives it
    with pytest.raises(PruningError, match="needs a latency table. HINT: pass `table=`"):
        get_cost("latency")
    with pytest.raises(PruningError, match="`cost` must be one of"):
        get_cost("flops")


def test_a_grouped_conv_is_refused_by_the_latency_cost(table):
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.Conv2d(8, 8, 3, groups=2))
    with pytest.raises(PruningError, match="grouped conv .* HINT: use the MACs cost"):
        latency_specs(net, (3, 16, 16))
    assert LayerSpec("conv", 3, 8).key != LayerSpec("conv", 3, 8, depthwise=False, in_hw=(2, 2)).key


def test_filter_pruning_with_a_latency_cost_plans_in_measured_time(tmp_path, pretrained, monkeypatch, stepped):
    table = stepped
    pl.seed_everything(0)
    module = _module(pretrained)
    cb = _prune(max_drop=0.5, step=0.5, criterion="l1", max_steps=2, cost=table)
    _script(cb, monkeypatch, [0.9], then=0.9)  # every step meets the goal: the plan alone is tested
    _trainer(tmp_path, [cb], epochs=4).fit(module, datamodule=_dm())
    road = Roadmap.load(tmp_path / "pruning" / "roadmap.json")
    assert road.cost["model"] == "latency" and road.cost["unit"] == "ms" and road.cost["batch"] == 1
    assert len(road.footprints) == 3
    for fp in road.footprints:  # every kept width is one the table says is fast
        assert all(w in road.cost["widths"][n] for n, w in fp.widths.items())
    costs = [fp.cost for fp in road.footprints]
    assert costs[0] > costs[1] > costs[2]
    # the recorded cost is the table's price of the footprint
    g = trace(create_model("vgg11", width=0.125))
    ids = {x.name: x.id for x in g.groups}
    assert costs[2] == pytest.approx(LatencyCost(table)(g, {ids[n]: w for n, w in road.seed.widths.items()}), abs=1e-5)


def test_a_step_where_every_group_waits_for_its_next_fast_width_does_not_end_the_roadmap(tmp_path, pretrained,
                                                                                         monkeypatch, stepped):
    """With widths in blocks of 16 a 5% step moves no group to its next fast width: the targets move
    on until one gets there (the default recipe's latency roadmap stopped at step 1, nothing_left)."""
    pl.seed_everything(0)
    module = _module(pretrained)
    cb = _prune(max_drop=0.5, step=0.05, criterion="l1", max_steps=3, cost=stepped)
    _script(cb, monkeypatch, [0.9], then=0.9)
    _trainer(tmp_path, [cb], epochs=6).fit(module, datamodule=_dm())
    road = Roadmap.load(tmp_path / "pruning" / "roadmap.json")
    assert road.status != "nothing_left" and len(road.footprints) == 4
    costs = [fp.cost for fp in road.footprints]
    assert all(a > b for a, b in zip(costs, costs[1:]))
    for fp in road.footprints:
        assert all(w in road.cost["widths"][n] for n, w in fp.widths.items())


def test_filter_pruning_snapping_up_never_runs_ahead_of_its_schedule(tmp_path, pretrained, monkeypatch, stepped):
    pl.seed_everything(0)
    module = _module(pretrained)
    cb = _prune(max_drop=0.5, step=0.25, criterion="l1", max_steps=3, cost=stepped, snap="up")
    _script(cb, monkeypatch, [0.9], then=0.9)
    _trainer(tmp_path, [cb], epochs=6).fit(module, datamodule=_dm())
    road = Roadmap.load(tmp_path / "pruning" / "roadmap.json")
    assert road.cost["snap"] == "up" and len(road.footprints) >= 2
    for fp in road.footprints[1:]:  # each kept width is a fast one at or above the schedule's target
        assert all(w in road.cost["widths"][n] and w >= fp.targets[n] for n, w in fp.widths.items())
    costs = [fp.cost for fp in road.footprints]
    assert all(a > b for a, b in zip(costs, costs[1:]))
    with pytest.raises(PruningError, match="`snap` must be one of"):
        _prune(cost=stepped, snap="floor")


def test_filter_pruning_with_a_step_cap_cuts_at_most_its_share_per_step(tmp_path, pretrained, monkeypatch,
                                                                       stepped):
    pl.seed_everything(0)
    module = _module(pretrained)
    cb = _prune(max_drop=0.5, step=0.25, criterion="l1", max_steps=3, cost=stepped, snap="up", step_cap=1.0)
    _script(cb, monkeypatch, [0.9], then=0.9)
    _trainer(tmp_path, [cb], epochs=6).fit(module, datamodule=_dm())
    road = Roadmap.load(tmp_path / "pruning" / "roadmap.json")
    assert road.cost["step_cap"] == 1.0 and len(road.footprints) >= 3
    for before, after in zip(road.footprints, road.footprints[1:]):  # within the cap, or one group alone
        changed = [n for n, w in after.widths.items() if w != before.widths[n]]
        assert before.cost - after.cost <= 0.25 * before.cost + 1e-6 or len(changed) == 1, (before, after)
    for bad in (0.5, True, "2"):
        with pytest.raises(PruningError, match="`step_cap` must be None or a number >= 1"):
            _prune(cost=stepped, step_cap=bad)
    with pytest.raises(PruningError, match="with a `cost` model, got step_cap=2"):
        _prune(step_cap=2)


def test_filter_pruning_refuses_a_cost_with_round_to(table):
    with pytest.raises(PruningError, match="`round_to`=8 would too"):
        _prune(cost=table, round_to=8)


def test_a_table_for_another_model_is_named_in_the_error(tmp_path, pretrained):
    other = LatencyTable({})
    module = _module(pretrained)
    cb = _prune(max_drop=0.5, criterion="l1", cost=other)
    with pytest.raises(Exception, match="the latency table has no layer"):
        _trainer(tmp_path, [cb], epochs=2).fit(module, datamodule=_dm())


def test_a_width_counts_by_the_time_of_the_layers_it_moves_not_the_whole_model():
    """On the proportional table (a layer's time is in x out channels), the first group's width moves
    conv 0 (flat here: its sweep shows no faster width, as a noisy or overhead-bound draw can) and
    conv 1. Its consumer's time still falls with every channel, a few % of the moved layers' time
    but well under 3% of the whole model's: the old rule (producer-fast widths, judged on the whole
    model) left the group no width at all, and a roadmap stalled there."""
    from tests.pruning.test_budget import proportional_table

    table = proportional_table()
    g = trace(create_model("vgg11", width=0.125))
    first = g.prunable_groups[0]
    conv0 = next(s for s in latency_specs(create_model("vgg11", width=0.125), (3, 32, 32)) if s.in_channels == 3)
    e = table.entries[conv0.key]
    table.entries[conv0.key] = {**e, "fine_ms": [e["fine_ms"][-1]] * len(e["fine"])}  # flat
    cost = LatencyCost(table)
    assert table.fast_widths(conv0) == [first.width]  # the producer alone offers nothing smaller
    saving = cost(g) - cost(g, {first.id: first.width - 1})
    assert 0 < saving < 0.03 * cost(g)
    widths = cost.widths_for(g, first.id)
    assert widths[-1] == first.width and len(widths) > 1
    # each kept width beats the next larger kept one by the margin, on the moved layers' time
    from nestflex.pruning.cost import _specs

    moved = [sum(table.layer_time(s) for s in _specs(g, {first.id: w})[:2]) for w in widths]  # conv 0 and 1
    assert all(a < b * (1 - cost.margin) for a, b in zip(moved, moved[1:]))
