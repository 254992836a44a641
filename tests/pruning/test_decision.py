"""The paired keep/reject rule, tested as the pure function it is, and in FilterPruning."""

import numpy as np
import pytest
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader

from nestflex.callbacks import FilterPruning
from nestflex.pruning import PairedDecision, PruningError, Roadmap, confirm_seed, paired_decision
from tests.pruning.test_callback import _dm, _module, _prune, _trainer


def _pairs(rng, n, acc_start, drop, disagree):
    """Correlated correct flags: the start model right with ``acc_start``, the step ``drop`` lower,
    the two disagreeing on ``disagree`` of the images (iid images)."""
    lost, won = (disagree + drop) / 2, (disagree - drop) / 2
    cells = np.array([acc_start - lost, lost, won, 1 - acc_start - won])  # (1,1) (1,0) (0,1) (0,0)
    k = rng.choice(4, size=n, p=cells)
    return np.isin(k, (0, 1)), np.isin(k, (0, 2))


def test_identical_predictions_are_kept_even_at_zero_allowed_drop():
    a = np.random.default_rng(0).random(500) < 0.8
    d = paired_decision(a, a, max_drop=0.0)
    assert isinstance(d, PairedDecision) and not d.broken
    assert d.estimate == 0.0 and d.n == 500
    # no discordant image: the variance floor (one image) keeps the standard error above 0
    assert d.se == pytest.approx(1 / 500) and d.bound > 0


def test_a_large_real_drop_is_broken_and_a_small_one_near_the_goal_is_kept():
    rng = np.random.default_rng(1)
    a, b = _pairs(rng, 5000, 0.87, 0.05, 0.08)
    d = paired_decision(a, b, max_drop=0.01)
    assert d.broken and d.bound < -0.01 and d.estimate == pytest.approx(b.mean() - a.mean())
    # a step a hair under the goal (measured): the threshold rule rejects it, the paired rule keeps it
    b = a.copy()
    flip = np.flatnonzero(a)[:55]  # 55 of 5000 lost: 1.1 points
    b[flip] = False
    b[np.flatnonzero(~a)[:3]] = True  # 3 won back: net -1.04 points
    d = paired_decision(a, b, max_drop=0.01)
    assert b.mean() < a.mean() - 0.01 and not d.broken and d.estimate == pytest.approx(-0.0104)
    assert d.se == pytest.approx(np.sqrt(np.var(b.astype(float) - a, ddof=1) / 5000))


def test_the_bound_covers_the_true_difference_at_its_confidence():
    rng = np.random.default_rng(2)
    covered = [paired_decision(*_pairs(rng, 2000, 0.87, 0.01, 0.067), max_drop=0.01).bound >= -0.01
               for _ in range(1000)]
    assert 0.87 <= np.mean(covered) <= 0.93  # one-sided 90%; 1000 draws: sd 0.01


def test_the_bound_carries_a_continuity_correction_of_one_image():
    # 40 of 1000 images lost, 10 won: without the correction the bound sits just under -0.01
    # (broken); one image's worth (1/n) lifts it over, so a step on the lattice edge is kept
    a = np.zeros(1000, dtype=bool)
    a[:900] = True
    b = a.copy()
    b[:40] = False
    b[900:910] = True
    d = paired_decision(a, b, max_drop=0.0)
    z = 1.2815515655446004
    assert d.bound == pytest.approx(d.estimate + z * d.se + 1 / 1000)
    mid = -(d.bound - 1 / 1000 + d.bound) / 2  # an allowed drop between the plain and the corrected bound
    assert not paired_decision(a, b, max_drop=mid).broken
    assert d.estimate + z * d.se < -mid  # the uncorrected rule would have rejected it


def test_torch_flags_and_the_json_record():
    a = torch.tensor([True, False, True, True])
    d = paired_decision(a, torch.tensor([1, 0, 0, 1]), max_drop=0.0, confidence=0.95)
    assert d.to_dict() == {"estimate": -0.25, "bound": round(d.bound, 6), "se": round(d.se, 6), "n": 4,
                           "max_drop": 0.0, "confidence": 0.95, "broken": False}


@pytest.mark.parametrize(("args", "match"), [
    (([1, 0], [1, 0], 0.01, 0.5), r"`confidence` must be in \(0.5, 1\), got 0.5. HINT: 0.9 rejects"),
    (([1, 0], [1, 0], 0.01, 1), r"`confidence` must be in \(0.5, 1\), got 1\."),
    (([1, 0], [1, 0], -0.1, 0.9), r"`max_drop` is an accuracy difference in \[0, 1\), got -0.1"),
    (([1, 0], [1], 0.01, 0.9), r"`start` and `step` must score the same images, got 2 and 1 flags. HINT"),
    (([], [], 0.01, 0.9), r"`start` and `step` hold no samples"),
    (([[1, 0]], [[1, 0]], 0.01, 0.9), r"`start` must be a 1-D array of per-sample correct flags"),
    (([1, 0], [2, 0], 0.01, 0.9), r"`step` must be a 1-D array of per-sample correct flags"),
])
def test_arguments_are_validated(args, match):
    with pytest.raises(PruningError, match=match):
        paired_decision(*args)


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"max_drop": 0.01, "decision": "bayes"}, (r"`decision` must be one of \('threshold', 'paired'\), got 'bayes'. "
                                               r"HINT: 'paired' keeps")),
    ({"target_macs": 0.5, "decision": "paired"}, (r"`decision`='paired' judges steps against an accuracy goal; "
                                                  r"the budget mode \(`target_macs`\) judges none. HINT")),
    ({"max_drop": 0.01, "decision": "paired", "confidence": 0.3}, r"`confidence` must be in \(0.5, 1\), got 0.3"),
    ({"max_drop": 0.01, "confidence": True}, r"`confidence` must be in \(0.5, 1\), got True"),
])
def test_filter_pruning_validates_the_decision_arguments(kwargs, match):
    with pytest.raises(PruningError, match=match):
        FilterPruning(**kwargs)


def test_paired_refuses_a_shuffling_eval_loader(tmp_path, pretrained):
    dm = _dm()
    dm.setup("fit")
    loader = DataLoader(dm.val_dataset, batch_size=32, shuffle=True)
    cb = _prune(criterion="l1", max_drop=0.05, decision="paired", eval_dataloader=loader)
    with pytest.raises(PruningError, match=r"the evaluation loader shuffles \(RandomSampler\). HINT: evaluate on a "
                                           r"loader with `shuffle=False`"):
        _trainer(tmp_path, [cb], epochs=2).fit(_module(pretrained), datamodule=dm)


def _scripted_hits(cb, monkeypatch, accuracies_lost):
    """Make ``cb``'s evaluations score a fixed 96-image split: the start model right on 90 images,
    each later evaluation losing the given number of them (then 0)."""
    import itertools

    start = torch.zeros(96, dtype=torch.bool)
    start[:90] = True
    script = itertools.chain([0], accuracies_lost, itertools.repeat(0))

    def evaluate(trainer, model, batches):
        hits = start.clone()
        hits[:next(script)] = False
        cb._last_hits, cb._eval_samples = hits, 96
        return hits.double().mean().item()

    monkeypatch.setattr(cb, "_evaluate", evaluate)


@pytest.mark.parametrize(("decision", "kept"), [("threshold", [0]), ("paired", [0, 1])])
def test_a_step_rejected_by_a_hair_is_kept_by_the_paired_rule(tmp_path, pretrained, monkeypatch, decision, kept):
    """Scripted hits: step 1 loses 6 of 96 images (6.25 points) under a 5-point goal. The threshold
    rule rejects it (and its retry, equally lost); the paired rule cannot tell it from the goal on
    96 images and keeps it, recording the statistics it decided on."""
    pl.seed_everything(0)
    cb = _prune(criterion="l1", max_drop=0.05, max_steps=1, backoff=1, recover_epochs=0, decision=decision)
    _scripted_hits(cb, monkeypatch, [6, 6])
    _trainer(tmp_path, [cb], epochs=3).fit(_module(pretrained), datamodule=_dm())
    road = Roadmap.load(tmp_path / "pruning" / "roadmap.json")
    assert [f.step for f in road.footprints] == kept
    if decision == "threshold":
        assert road.status == "goal_broken" and all(r.decision is None for r in road.rejected)
        return
    stats = road.footprints[1].decision
    assert road.footprints[1].accuracy < road.goal  # measured below the goal, yet kept
    assert stats["n"] == 96 and stats["estimate"] == pytest.approx(-6 / 96, abs=1e-6) and not stats["broken"]
    assert stats["bound"] >= -stats["max_drop"] and stats["confidence"] == 0.9
    assert stats == paired_decision(torch.arange(96) < 90, (torch.arange(96) < 90) & (torch.arange(96) >= 6), 0.05).to_dict() | {
        "max_drop": stats["max_drop"]}
    assert road.footprints[0].decision is None


def test_paired_decision_on_real_evaluations(tmp_path, pretrained):
    """A real Trainer: every judged step records the paired statistics on the whole 96-image split,
    and a large drop (random pruning, 90% per step, no drop allowed) is broken by the paired rule too."""
    pl.seed_everything(0)
    cb = _prune(criterion="random", max_drop=0.0, step=0.9, backoff=0, recover_epochs=0, decision="paired")
    _trainer(tmp_path, [cb], epochs=3).fit(_module(pretrained), datamodule=_dm())
    road = Roadmap.load(tmp_path / "pruning" / "roadmap.json")
    assert road.status == "goal_broken" and len(road.rejected) == 1
    stats = road.rejected[0].decision
    assert stats["broken"] and stats["n"] == 96 and stats["bound"] < 0
    assert stats["estimate"] == pytest.approx(road.rejected[0].accuracy - road.start_accuracy, abs=1e-5)


@pytest.mark.parametrize(("lost_after", "kept"), [(5, True), (7, False)])
def test_a_seed_kept_below_the_goal_keeps_a_fine_tuning_that_raises_it(tmp_path, pretrained, monkeypatch,
                                                                        lost_after, kept):
    """Scripted hits: the paired rule keeps step 1 at 84 of 96 images, under the 5-point goal (85.2
    images). Fine-tuned to 85 images it is still under the goal but better: kept (it was dropped for
    missing the goal, and the worse weights came back). Fine-tuned to 83, it is not."""
    pl.seed_everything(0)
    cb = _prune(criterion="l1", max_drop=0.05, max_steps=1, recover_epochs=0, decision="paired", finetune_epochs=2)
    _scripted_hits(cb, monkeypatch, [6, lost_after])
    _trainer(tmp_path, [cb], epochs=5).fit(_module(pretrained), datamodule=_dm())
    road = Roadmap.load(tmp_path / "pruning" / "roadmap.json")
    assert [f.step for f in road.footprints] == [0, 1] and road.finetune["before"] == pytest.approx(84 / 96, abs=1e-6)
    assert road.finetune["after"] == pytest.approx((90 - lost_after) / 96, abs=1e-6) and road.finetune["kept"] is kept
    assert road.seed.accuracy == pytest.approx((90 - lost_after if kept else 84) / 96, abs=1e-6)


def test_confirm_seed_mirrors_the_paired_rule():
    a = np.arange(5000) < 4350
    b = a.copy()
    b[:130], b[4350:4450] = False, True  # 130 images lost, 100 gained: -0.6 points
    c = confirm_seed(a, b, max_drop=0.01)
    d = paired_decision(a, b, max_drop=0.01)
    assert c.estimate == d.estimate and c.se == d.se and not d.broken and not c.confirmed
    assert c.lower == pytest.approx(c.estimate - (d.bound - d.estimate))  # the same margin, the other side
    assert confirm_seed(a, b, max_drop=0.015).confirmed and confirm_seed(a, b, max_drop=0.01, confidence=0.6).confirmed
    with pytest.raises(PruningError, match=r"`start` and `seed` must score the same images, got 5000 and 4 flags"):
        confirm_seed(a, [1, 0, 1, 1], max_drop=0.01)


@pytest.mark.parametrize("finetune", [1, 0])
def test_an_unconfirmed_seed_gives_way_to_the_footprint_before_it(tmp_path, pretrained, monkeypatch, finetune):
    """Scripted hits on 96 images, 6-point goal: steps 1 and 2 lose 2 and 3 images (both kept by the
    threshold rule); the seed at step 2, 3 images down (fine-tuned or not), is not confidently within
    the goal (lower bound -6.45 points); step 1, 1 image down after its own fine-tuning (or 2
    without: -5.0), is. The seed becomes step 1, its weights in seed.ckpt; both verdicts are recorded."""
    pl.seed_everything(0)
    cb = _prune(criterion="l1", max_drop=0.06, max_steps=2, recover_epochs=0, finetune_epochs=finetune, confirm=0.9)
    _scripted_hits(cb, monkeypatch, [2, 3, 3, 1] if finetune else [2, 3, 3, 2])
    _trainer(tmp_path, [cb], epochs=8).fit(_module(pretrained), datamodule=_dm())
    road = Roadmap.load(tmp_path / "pruning" / "roadmap.json")
    assert road.status == "max_steps" and [f.step for f in road.footprints] == [0, 1]
    assert [(c["step"], c["confirmed"]) for c in road.confirm] == [(2, False), (1, True)]
    assert road.confirm[0]["estimate"] == pytest.approx(-3 / 96, abs=1e-6) and road.confirm[0]["lower"] < -0.06
    assert road.seed.accuracy == pytest.approx((89 if finetune else 88) / 96, abs=1e-6)
    if finetune:  # the last fine-tuning is step 1's
        assert road.finetune["before"] == pytest.approx(88 / 96, abs=1e-6) and road.finetune["kept"]
    seed = torch.load(tmp_path / "pruning" / "seed.ckpt", weights_only=True)["state_dict"]
    step = torch.load(tmp_path / "pruning" / road.seed.checkpoint, weights_only=True)["state_dict"]
    assert all(torch.equal(seed[k], step[k]) for k in step)


def test_a_confirmed_seed_stays_and_confirm_needs_an_accuracy_goal(tmp_path, pretrained, monkeypatch):
    pl.seed_everything(0)
    cb = _prune(criterion="l1", max_drop=0.05, max_steps=1, recover_epochs=0, confirm=0.9)
    _scripted_hits(cb, monkeypatch, [1, 1])
    _trainer(tmp_path, [cb], epochs=4).fit(_module(pretrained), datamodule=_dm())
    road = Roadmap.load(tmp_path / "pruning" / "roadmap.json")
    assert [f.step for f in road.footprints] == [0, 1] and [c["confirmed"] for c in road.confirm] == [True]
    with pytest.raises(PruningError, match=r"`confirm` checks the seed against the accuracy goal; the budget mode "
                                           r"\(`target_macs`\) has none. HINT"):
        FilterPruning(target_macs=0.5, confirm=0.9)
    for bad in (1.0, 0.5, True, "0.9"):
        with pytest.raises(PruningError, match=r"`confirm` must be None or a confidence in \(0.5, 1\), got "):
            FilterPruning(max_drop=0.01, confirm=bad)


def test_an_unconfirmed_seed_backs_off_at_most_confirm_backoffs_times(tmp_path, pretrained, monkeypatch):
    """Every seed is 3 images down (lower bound -6.45 points, goal 6): steps 5, 4, 3 give way, step 2's
    verdict is the fourth and last, and step 2 stays, unconfirmed."""
    from nestflex.pruning.callback import CONFIRM_BACKOFFS

    pl.seed_everything(0)
    cb = _prune(criterion="l1", max_drop=0.06, step=0.2, max_steps=5, recover_epochs=0, confirm=0.9)
    _scripted_hits(cb, monkeypatch, [3] * 9)
    _trainer(tmp_path, [cb], epochs=12).fit(_module(pretrained), datamodule=_dm())
    road = Roadmap.load(tmp_path / "pruning" / "roadmap.json")
    assert CONFIRM_BACKOFFS == 3 and road.status == "max_steps"
    assert [(c["step"], c["confirmed"]) for c in road.confirm] == [(5, False), (4, False), (3, False), (2, False)]
    assert [f.step for f in road.footprints] == [0, 1, 2] and road.finetune is None


def test_confirm_needs_room_under_the_start():
    with pytest.raises(PruningError, match=r"`confirm` needs room under the start to be confident in, got max_drop=0"):
        FilterPruning(max_drop=0.0, confirm=0.9)
