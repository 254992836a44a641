"""FilterPruning's budget mode (``target_macs``, ``target_cost``): the pure rule, then real Trainers on a tiny VGG."""

import json

import pytest
import pytorch_lightning as pl
from pytorch_lightning.callbacks import ModelCheckpoint

from nestflex.callbacks import FilterPruning
from nestflex.graph import trace
from nestflex.models import create_model
from nestflex.profiling import LatencyTable
from nestflex.profiling.latency import coarse_widths, fine_widths
from nestflex.pruning import (
    LatencyCost,
    PruningError,
    Roadmap,
    budget_limit,
    budget_reached,
    budget_scale,
    latency_specs,
)
from tests.pruning.test_callback import _dm, _Kill, _module, _prune, _script, _trainer


# ---------------------------------------------------------------- the pure rule
def test_the_limit_is_the_target_share_of_the_start_rounded_down():
    assert budget_limit(1000, 0.5) == 500 and budget_limit(1001, 0.3) == 300
    assert budget_reached(500, 500) and not budget_reached(501, 500)
    assert budget_limit(2.5, 0.3) == pytest.approx(0.75)  # a cost (ms) is not whole: not rounded


def test_a_full_step_that_stays_above_the_budget_is_taken_whole():
    assert budget_scale(lambda s: 1000 - int(200 * s), limit=700) == 1.0
    assert budget_scale(lambda s: 1000, limit=700) == 1.0  # a step that prunes nothing: the caller sees it


@pytest.mark.parametrize("limit", [999, 900, 750, 601, 600])
def test_a_step_that_would_overshoot_is_scaled_to_land_at_the_budget(limit):
    calls = []

    def macs_at(share):  # a full step removes 400 MACs, in whole channels of 10 MACs
        calls.append(share)
        return 1000 - 10 * round(40 * share)

    share = budget_scale(macs_at, limit)
    assert 0 < share <= 1 and macs_at(share) <= limit
    assert macs_at(share) > limit - 10  # within one channel's MACs of the budget, not a full step under it
    assert len(calls) <= 13  # a bisection, not a scan


def test_a_coarse_step_lands_at_the_first_granule_under_the_budget():
    # rounding makes the step move in jumps of 100 MACs: the budget is met at the first jump under it
    def macs_at(share):
        return 1000 - 100 * round(4 * share)

    share = budget_scale(macs_at, 850)
    assert macs_at(share) == 800 and macs_at(share / 2) > 850


# ---------------------------------------------------------------- FilterPruning(target_macs=...)
@pytest.mark.parametrize("target", [0.5])
def test_the_budget_mode_prunes_to_the_target_and_records_the_accuracies(tmp_path, pretrained, monkeypatch, target):
    """Step 0.2 uniform: a full step keeps ~0.64 of the MACs, two ~0.41, so the second step is scaled
    to land at 0.5. Scripted accuracies far below any goal: no step is judged on them."""
    pl.seed_everything(0)
    module = _module(pretrained)
    cb = _prune(max_drop=None, target_macs=target, step=0.2, criterion="l1")
    calls = _script(cb, monkeypatch, [0.9, 0.12, 0.11], then=0.10)
    _trainer(tmp_path, [cb], epochs=6).fit(module, datamodule=_dm())
    road = Roadmap.load(tmp_path / "pruning" / "roadmap.json")
    assert (road.mode, road.target_macs, road.status, road.goal) == ("macs", target, "target_reached", 0.0)
    assert not road.rejected and calls == [0, 1, 2]  # the start, then one evaluation per step: no recovery
    assert [f.step for f in road.footprints] == [0, 1, 2]
    assert [f.accuracy for f in road.footprints] == [0.9, 0.12, 0.11]  # recorded, not judged
    fractions = [f.macs / road.footprints[0].macs for f in road.footprints]
    full_step = fractions[0] - fractions[1]  # the first step was a full one
    assert fractions[1] > target >= fractions[2] > target - full_step
    assert fractions[1] - fractions[2] < full_step  # the last step was scaled down
    assert trace(module.model).macs() == road.seed.macs  # the module ends as the seed


def test_the_budget_mode_logs_its_mode_target_and_accuracy(tmp_path, pretrained, caplog):
    pl.seed_everything(0)
    cb = _prune(max_drop=None, target_macs=0.8, step=0.2, criterion="l1")
    with caplog.at_level("INFO"):
        _trainer(tmp_path, [cb], epochs=3).fit(_module(pretrained), datamodule=_dm())
    road = Roadmap.load(tmp_path / "pruning" / "roadmap.json")
    assert road.status == "target_reached" and len(road.footprints) == 2
    done = next(r.getMessage() for r in caplog.records if "pruning: done" in r.getMessage())
    assert "budget mode" in done and "target 0.8 reached" in done and f"accuracy {road.seed.accuracy:.4f}" in done


def test_the_budget_mode_says_when_max_steps_ends_it_short_of_the_target(tmp_path, pretrained, caplog):
    pl.seed_everything(0)
    cb = _prune(max_drop=None, target_macs=0.2, step=0.2, criterion="l1", max_steps=1)
    with caplog.at_level("INFO"):
        _trainer(tmp_path, [cb], epochs=3).fit(_module(pretrained), datamodule=_dm())
    assert Roadmap.load(tmp_path / "pruning" / "roadmap.json").status == "max_steps"
    assert any("target 0.2 NOT reached" in r.getMessage() for r in caplog.records)


def test_a_killed_budget_run_resumes_to_the_same_roadmap(tmp_path, pretrained):
    def run(root, kill=None, ckpt=None):
        pl.seed_everything(0)
        cbs = [_prune(max_drop=None, target_macs=0.5, step=0.2), ModelCheckpoint(dirpath=root / "ckpt", save_last=True)]
        if kill is not None:
            cbs.append(_Kill(kill))
        _trainer(root, cbs, epochs=5).fit(_module(pretrained), datamodule=_dm(), ckpt_path=ckpt)
        return json.loads((root / "pruning" / "roadmap.json").read_text())

    whole = run(tmp_path / "a")
    assert whole["status"] == "target_reached" and whole["mode"] == "macs"
    with pytest.raises(RuntimeError, match="killed"):
        run(tmp_path / "b", kill=2)
    resumed = run(tmp_path / "b", ckpt=tmp_path / "b" / "ckpt" / "last.ckpt")
    assert resumed == whole


def test_the_mode_is_part_of_the_state():
    budget, accuracy = _prune(max_drop=None, target_macs=0.5), _prune()
    assert budget.state_key != accuracy.state_key and "target_macs" in budget.state_key
    assert "target_macs" not in accuracy.state_key  # checkpoints of the accuracy mode keep their key
    state = accuracy.state_dict()
    assert (state["mode"], state["target_macs"]) == ("accuracy", None)
    with pytest.raises(PruningError, match=r"the checkpoint's FilterPruning ran in mode 'accuracy' \(target_macs=None\), "
                                           r"this one in 'macs' \(target_macs=0.5\). HINT: resume with the arguments"):
        budget.load_state_dict(state)


# ---------------------------------------------------------------- FilterPruning(target_cost=..., cost=...)
def proportional_table() -> LatencyTable:
    """A hand-made latency table of the tests' VGG (vgg11, width 0.125, 3x32x32; nothing measured): a
    layer's time is its input x output channels, whatever its input size, so a step's share of the
    time differs from its share of the MACs (which the early, large-input layers dominate)."""
    entries = {}
    for spec in latency_specs(create_model("vgg11", width=0.125), (3, 32, 32)):
        fine, grid_in, grid_out = fine_widths(spec.out_channels), coarse_widths(spec.in_channels), \
            coarse_widths(spec.out_channels)
        entries[spec.key] = {"spec": spec.to_dict(), "fine": fine,
                             "fine_ms": [1e-3 * spec.in_channels * w for w in fine], "grid_in": grid_in,
                             "grid_out": grid_out, "grid_ms": [[1e-3 * i * o for o in grid_out] for i in grid_in]}
    return LatencyTable(entries)


@pytest.fixture(scope="module")
def cost():
    return LatencyCost(proportional_table())


def test_the_cost_budget_prunes_to_the_target_in_the_cost_models_units(tmp_path, pretrained, monkeypatch, cost,
                                                                       caplog):
    """As the MACs budget, measured by the latency table: every step kept, the run ends at the first
    footprint at or below the target share of the start's cost, the last step scaled to land there."""
    pl.seed_everything(0)
    module = _module(pretrained)
    cb = _prune(max_drop=None, target_cost=0.5, step=0.2, criterion="l1", cost=cost)
    _script(cb, monkeypatch, [0.9, 0.12], then=0.11)
    with caplog.at_level("INFO"):
        _trainer(tmp_path, [cb], epochs=8).fit(module, datamodule=_dm())
    road = Roadmap.load(tmp_path / "pruning" / "roadmap.json")
    assert (road.mode, road.target_cost, road.target_macs, road.status, road.goal) == ("cost", 0.5, None,
                                                                                      "target_reached", 0.0)
    assert not road.rejected and [f.step for f in road.footprints] == list(range(len(road.footprints)))
    assert [f.accuracy for f in road.footprints[:2]] == [0.9, 0.12]  # recorded, not judged
    shares = [f.cost / road.footprints[0].cost for f in road.footprints]
    assert len(shares) >= 3 and shares[-2] > 0.5 >= shares[-1]  # ends within one step of the budget
    assert shares[-2] - shares[-1] < shares[0] - shares[1]  # the last step was scaled down
    assert road.seed.cost == pytest.approx(cost(trace(module.model)), abs=1e-5)  # the module ends as the seed
    macs = [f.macs / road.footprints[0].macs for f in road.footprints]
    assert abs(macs[-1] - shares[-1]) > 0.02  # the budget was the time's, not the MACs'
    assert Roadmap.from_dict(json.loads(json.dumps(road.to_dict()))) == road
    done = next(r.getMessage() for r in caplog.records if "pruning: done" in r.getMessage())
    assert "of the latency cost, target 0.5 reached" in done


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"target_cost": 0.5}, r"`target_cost`=0.5 is a share of the model's cost under `cost`, and no `cost` was given. "
                           r"HINT: pass cost= a latency table"),
    ({"target_cost": 1.0, "cost": "macs"}, r"`target_cost` is a fraction of the starting model's cost under `cost` "
                                           r"in \(0, 1\), got 1.0. HINT"),
    ({"target_cost": 0, "cost": "macs"}, r"`target_cost` is a fraction .* got 0\."),
    ({"target_cost": 0.5, "target_macs": 0.5}, r"pass exactly one of .*target_macs=0.5, target_cost=0.5"),
    ({"target_cost": 0.5, "max_drop": 0.01}, r"pass exactly one of .*max_drop=0.01, target_macs=None, target_cost=0.5"),
    ({"target_cost": 0.5, "cost": "macs", "decision": "paired"}, r"`decision`='paired' judges steps against an "
                                                                  r"accuracy goal; the budget mode \(`target_cost`\)"),
])
def test_the_cost_budgets_arguments_name_the_argument(kwargs, match):
    with pytest.raises(PruningError, match=match):
        FilterPruning(**{"criterion": "l1"} | kwargs)


def test_the_cost_budget_is_part_of_the_state(cost):
    budget = _prune(max_drop=None, target_cost=0.5, cost=cost)
    assert "target_cost" in budget.state_key and budget.state_key != _prune(max_drop=None, target_macs=0.5).state_key
    state = budget.state_dict()
    assert (state["mode"], state["target_macs"], state["target_cost"]) == ("cost", None, 0.5)
    _prune(max_drop=None, target_cost=0.5, cost=cost).load_state_dict(state)  # the same run resumes
    with pytest.raises(PruningError, match=r"ran in mode 'cost' \(target_cost=0.5\), this one in 'cost' "
                                           r"\(target_cost=0.4\). HINT: resume with the arguments"):
        _prune(max_drop=None, target_cost=0.4, cost=cost).load_state_dict(state)
    with pytest.raises(PruningError, match=r"ran in mode 'cost' \(target_macs=None, target_cost=0.5\), this one in "
                                           r"'macs' \(target_macs=0.5, target_cost=None\)"):
        _prune(max_drop=None, target_macs=0.5).load_state_dict(state)
    macs = _prune(max_drop=None, target_macs=0.5)
    older = {k: v for k, v in macs.state_dict().items() if k != "target_cost"}  # saved before target_cost
    _prune(max_drop=None, target_macs=0.5).load_state_dict(older)
