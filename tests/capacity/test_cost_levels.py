"""Levels spaced in cost: the footprints' recorded cost, or a cost model FreezeAndGrow prices them with."""

from __future__ import annotations

import json

import pytest
import pytorch_lightning as pl

from nestflex.callbacks import FreezeAndGrow
from nestflex.capacity import CapacityError, choose_levels, footprint_costs, plan_levels
from nestflex.graph import trace
from nestflex.pruning import Footprint, LatencyCost, MacsCost, Roadmap, build_latency_table
from tests.capacity.test_freeze import _dm, _module, grow_roadmap  # noqa: F401, F811 - a fixture, found by name


def _road(macs, costs=None):
    fps = [Footprint(s, 0.9, 10, m, {}, {}, cost=None if costs is None else costs[s]) for s, m in enumerate(macs)]
    return Roadmap("M", "l1", 0.9, 0.9, {}, fps)


def test_levels_follow_the_recorded_costs_when_every_footprint_has_one():
    macs = [100, 80, 60, 50, 40, 20]
    # time falls little until step 3, then fast (an overhead-bound start): even spacing in time
    # picks other footprints than even spacing in MACs
    ms = [1.0, 0.98, 0.95, 0.9, 0.5, 0.2]
    assert choose_levels(_road(macs), 3) == [5, 2, 0]
    assert choose_levels(_road(macs, ms), 3) == [5, 4, 0]
    assert choose_levels(_road(macs, ms), 3, costs=dict(enumerate(macs))) == [5, 2, 0]
    partial = _road(macs, ms)
    partial.footprints[2] = Footprint(2, 0.9, 10, 60, {}, {})
    assert footprint_costs(partial) == {s: float(m) for s, m in enumerate(macs)}  # one missing: MACs
    with pytest.raises(CapacityError, match=r"no cost for roadmap steps \[5\]"):
        choose_levels(_road(macs), 3, costs={s: 1.0 for s in range(5)})


def test_the_plan_records_the_costs_it_was_spaced_in():
    road = _road([100, 60, 20], [3.0, 2.0, 1.0])
    road.groups = {}
    plan = plan_levels(road, [2, 0])
    assert plan.costs == (1.0, 3.0) and plan_levels(_road([100, 60, 20]), [2, 0]).costs is None


def test_freeze_and_grow_spaces_levels_in_the_time_a_table_measures(grow_roadmap, tmp_path):
    table = build_latency_table(_module(1).model, (3, 32, 32), repeats=3)
    cb = FreezeAndGrow(grow_roadmap, levels=3, epochs_per_level=1, dirpath=tmp_path / "grow", cost=table)
    module = _module(2)
    trainer = pl.Trainer(max_epochs=2, callbacks=[cb], logger=False, enable_progress_bar=False,
                         enable_model_summary=False, enable_checkpointing=False, default_root_dir=tmp_path)
    trainer.fit(module, datamodule=_dm())
    road = Roadmap.load(grow_roadmap)
    g = trace(_module(1), (3, 32, 32))  # the roadmap names groups from the LightningModule (network "")
    ids = {x.name: x.id for x in g.groups}
    ms = {f.step: LatencyCost(table)(g, {ids[n]: w for n, w in f.widths.items()}) for f in road.footprints}
    assert list(cb.plan.steps) == choose_levels(road, 3, ms)
    assert cb.plan.costs == tuple(round(ms[s], 6) for s in cb.plan.steps)
    assert cb.plan.steps[0] > cb.plan.steps[1] > cb.plan.steps[2] == 0  # nested, whatever the times say
    saved = json.loads((tmp_path / "grow" / "capacity.json").read_text())
    assert saved["plan"]["costs"] == list(cb.plan.costs)
    # MACs by name: the same plan as no cost at all (the roadmap records none)
    assert FreezeAndGrow(grow_roadmap, levels=3, cost="macs").build(_module(1)).steps == \
        FreezeAndGrow(grow_roadmap, levels=3).build(_module(1)).steps
    assert MacsCost().name == "macs"


def test_freeze_and_grow_names_a_bad_cost(grow_roadmap):
    with pytest.raises(CapacityError, match="`cost` must be one of"):
        FreezeAndGrow(grow_roadmap, cost="flops")
