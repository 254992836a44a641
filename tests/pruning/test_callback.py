import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import Callback, ModelCheckpoint
from torch.utils.data import DataLoader

from nestflex.callbacks import FilterPruning
from nestflex.data import SyntheticDataModule
from nestflex.graph import trace
from nestflex.pruning import PruningError, Roadmap, load_pruned, shrink
from nestflex.training import ImageClassifier

EPOCHS = 4


def _dm():
    return SyntheticDataModule(batch_size=32, train_size=320, test_size=32, val_size=96, seed=0)


def _module(state=None, epochs=EPOCHS):
    m = ImageClassifier("vgg11", width=0.125, lr=0.05, max_epochs=epochs)
    if state is not None:
        m.load_state_dict(state)
    return m


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    """A few epochs of plain training, so pruning has accuracy to lose."""
    pl.seed_everything(0)
    m = _module(epochs=6)
    trainer = pl.Trainer(max_epochs=6, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, default_root_dir=tmp_path_factory.mktemp("pre"))
    trainer.fit(m, datamodule=_dm())
    return {k: v.clone() for k, v in m.state_dict().items()}


def _trainer(tmp_path, callbacks, epochs=EPOCHS, **kw):
    return pl.Trainer(max_epochs=epochs, callbacks=callbacks, logger=False, enable_progress_bar=False,
                      enable_model_summary=False, default_root_dir=tmp_path, **kw)


def _prune(**kw):
    kw = dict(criterion="trr", max_drop=0.5, step=0.3, allocation="uniform") | kw
    if kw["criterion"] == "trr":
        kw.setdefault("criterion_kwargs", {"triplets": 40})
    return FilterPruning(**kw)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({}, r"pass exactly one of `goal`, `max_drop`, `target_macs` and `target_cost`, got goal=None, "
             r"max_drop=None, target_macs=None, target_cost=None. HINT: `goal` or `max_drop` prune while the "
             r"accuracy holds"),
        ({"goal": 0.9, "max_drop": 0.01}, "pass exactly one of `goal`, `max_drop`, `target_macs` and `target_cost`, "
                                          "got goal=0.9, max_drop=0.01, target_macs=None, target_cost=None"),
        ({"max_drop": 0.01, "target_macs": 0.5}, "pass exactly one of .*max_drop=0.01, target_macs=0.5"),
        ({"target_macs": 1.0}, r"`target_macs` is a fraction of the starting model's MACs in \(0, 1\), got 1.0. "
                               r"HINT: 0.3 keeps 30% of the MACs"),
        ({"target_macs": 0}, r"`target_macs` is a fraction .* got 0\."),
        ({"target_macs": "half"}, r"`target_macs` is a fraction .* got 'half'"),
        ({"goal": 90}, r"`goal` is an accuracy in \(0, 1\], got 90. HINT: 0.9 means 90%"),
        ({"max_drop": -0.1}, r"`max_drop` is an accuracy difference in \[0, 1\)"),
        ({"max_drop": 0.01, "step": 1.5}, r"`step` must be in \(0, 1\), got 1.5"),
        ({"max_drop": 0.01, "epochs_per_step": 0}, "`epochs_per_step` must be an int >= 1"),
        ({"max_drop": 0.01, "allocation": "greedy"}, "`allocation` must be one of"),
        ({"max_drop": 0.01, "backoff": -1}, "`backoff` must be an int >= 0"),
        ({"max_drop": 0.01, "retry_budget": -1}, "`retry_budget` must be None or an int >= 0"),
        ({"max_drop": 0.01, "recover_epochs": -1}, "`recover_epochs` must be an int >= 0"),
        ({"max_drop": 0.01, "finetune_epochs": 1.5}, "`finetune_epochs` must be an int >= 0"),
        ({"max_drop": 0.01, "round_to": 0}, "`round_to` must be an int >= 1"),
        ({"max_drop": 0.01, "criterion": "taylor"}, "`criterion` 'taylor' is not registered"),
    ],
)
def test_arguments_are_validated(kwargs, match):
    with pytest.raises(PruningError, match=match):
        FilterPruning(**kwargs)


def test_roadmap_is_recorded_and_the_module_ends_as_the_seed(tmp_path, pretrained):
    pl.seed_everything(0)
    module = _module(pretrained)
    cb = _prune(allocation="sensitivity", fractions=(0.3, 0.6), sensitivity_batches=1)
    _trainer(tmp_path, [cb]).fit(module, datamodule=_dm())
    road = Roadmap.load(tmp_path / "pruning" / "roadmap.json")
    assert road.status == "max_epochs" and road.criterion == "trr"
    steps = [f.step for f in road.footprints]
    assert steps == list(range(len(steps))) and len(steps) >= 3
    macs = [f.macs for f in road.footprints]
    assert macs == sorted(macs, reverse=True) and macs[-1] < macs[0]
    assert all(f.accuracy >= road.goal for f in road.footprints)
    seed = road.seed
    graph = trace(module.model)  # names are relative to the network; the roadmap says where it lives
    assert road.network == "model" and road.input_shape == [3, 32, 32]
    assert graph.macs() == seed.macs and graph.params() == seed.params  # real, physical reduction
    for name, width in seed.widths.items():
        assert graph.group(name).width == width == road.groups[name] - len(seed.removed[name])
    assert (tmp_path / "pruning" / "sensitivity.json").exists()
    # the seed checkpoint rebuilds the same network in a fresh, unpruned module
    fresh = load_pruned(_module(), tmp_path / "pruning" / "seed.ckpt").eval()
    x = torch.randn(3, 3, 32, 32)
    module.eval()
    torch.testing.assert_close(fresh(x), module(x))
    # ...and in the plain network, from the same Lightning checkpoint
    net = load_pruned(_module().model, tmp_path / "pruning" / "seed.ckpt").eval()
    torch.testing.assert_close(net(x), module(x))


def test_a_step_that_breaks_the_goal_is_rolled_back(tmp_path, pretrained):
    pl.seed_everything(0)
    module = _module(pretrained)
    start = trace(module).macs()
    cb = _prune(criterion="random", max_drop=0.0, step=0.9, min_channels=1, backoff=1, recover_epochs=0)
    trainer = _trainer(tmp_path, [cb], epochs=4)
    trainer.fit(module, datamodule=_dm())
    road = Roadmap.load(tmp_path / "pruning" / "roadmap.json")
    assert road.status == "goal_broken" and len(road.rejected) == 2  # the step, then one retry at half size
    assert all(r.accuracy < road.goal for r in road.rejected)
    assert road.rejected[0].macs < road.rejected[1].macs < start  # the retry removed less
    assert [f.step for f in road.footprints] == [0]
    assert trace(module).macs() == start  # back to the seed: the unpruned model
    assert trainer.current_epoch < 4  # stopped early


def test_a_kept_step_restores_the_step_size_a_retry_halved(tmp_path, pretrained, monkeypatch):
    """Scripted accuracies (start, broken step, kept retry, kept step): the retry removes a half-size
    step, the step after it a full one again, so one early failure does not shrink every later step."""
    import itertools

    pl.seed_everything(0)
    module = _module(pretrained)
    start = trace(module).macs()
    cb = _prune(criterion="l1", max_drop=0.05, step=0.3, max_steps=2, backoff=2, recover_epochs=0)
    script = itertools.chain([0.9, 0.1, 0.9], itertools.repeat(0.9))
    monkeypatch.setattr(cb, "_evaluate", lambda trainer, model, batches: next(script))
    _trainer(tmp_path, [cb], epochs=5).fit(module, datamodule=_dm())
    road = Roadmap.load(tmp_path / "pruning" / "roadmap.json")
    assert len(road.rejected) == 1 and [f.step for f in road.footprints] == [0, 1, 2]
    first, second = road.footprints[1].macs / start, road.footprints[2].macs / road.footprints[1].macs
    # uniform allocation: the retry keeps ~(1 - 0.15)^2 of the MACs, the restored full step ~(1 - 0.3)^2
    assert first > 0.65 and second < 0.6 and cb._scale == 1.0


def test_the_retry_budget_ends_a_roadmap_that_keeps_breaking_the_goal(tmp_path, pretrained, monkeypatch):
    """Scripted accuracies (start, broken, kept retry, broken, ...): with a budget of 2 the third
    broken try ends the roadmap at the last kept step, although ``backoff`` alone would retry it."""
    pl.seed_everything(0)
    module = _module(pretrained)
    cb = _prune(criterion="l1", max_drop=0.05, step=0.3, max_steps=5, backoff=2, retry_budget=2, recover_epochs=0)
    _script(cb, monkeypatch, [0.9, 0.1, 0.9, 0.1, 0.9, 0.1], then=0.9)
    _trainer(tmp_path, [cb], epochs=10).fit(module, datamodule=_dm())
    road = Roadmap.load(tmp_path / "pruning" / "roadmap.json")
    assert len(road.rejected) == 3 and [f.step for f in road.footprints] == [0, 1, 2]
    assert road.status == "goal_broken"
    assert trace(module.model).macs() == road.seed.macs  # the module ends as the last kept step


@pytest.mark.parametrize("kwargs", [{"backoff": 0}, {"backoff": 2, "retry_budget": 0}])
def test_a_roadmap_that_breaks_its_goal_fine_tunes_the_seed_and_prunes_no_further(
        tmp_path, pretrained, monkeypatch, kwargs):
    """Scripted accuracies (start, step 1 kept, step 2 broken, then the fine-tuned seed): the broken
    step ends the roadmap and the seed (step 1) is fine-tuned as it is; no step 3 is pruned while it
    trains (a bug once pruned one more step and fine-tuned that model as the seed)."""
    pl.seed_everything(0)
    module = _module(pretrained)
    cb = _prune(criterion="l1", max_drop=0.05, step=0.3, max_steps=5, recover_epochs=0, finetune_epochs=2, **kwargs)
    _script(cb, monkeypatch, [0.9, 0.9, 0.1, 0.95], then=0.0)
    pruned, prune = [], cb._prune
    monkeypatch.setattr(cb, "_prune", lambda *a: pruned.append(1) or prune(*a))
    recorded, record = [], cb._record
    monkeypatch.setattr(cb, "_record", lambda t, m, graph, *a: recorded.append(graph.macs()) or record(t, m, graph, *a))
    _trainer(tmp_path, [cb], epochs=10).fit(module, datamodule=_dm())
    road = Roadmap.load(tmp_path / "pruning" / "roadmap.json")
    assert road.status == "goal_broken" and len(road.rejected) == 1 and len(pruned) == 2  # steps 1 and 2 only
    assert [f.step for f in road.footprints] == [0, 1] and road.finetune["kept"] and road.finetune["epochs"] == 2
    assert recorded[-1] == recorded[1] == road.seed.macs  # the fine-tuned seed has step 1's architecture
    assert trace(module.model).macs() == road.seed.macs


def test_round_to_keeps_every_footprint_at_multiples(tmp_path, pretrained):
    pl.seed_everything(0)
    module = _module(pretrained)
    cb = _prune(criterion="l1", max_drop=0.9, step=0.3, max_steps=2, round_to=4, recover_epochs=0)
    _trainer(tmp_path, [cb], epochs=3).fit(module, datamodule=_dm())
    road = Roadmap.load(tmp_path / "pruning" / "roadmap.json")
    assert [f.step for f in road.footprints] == [0, 1, 2]
    for prev, fp in zip(road.footprints, road.footprints[1:]):
        pruned = {g: w for g, w in fp.widths.items() if w != road.groups[g]}
        assert pruned and all(w % 4 == 0 for w in pruned.values()), fp.widths
        # the widths follow the unrounded schedule the footprint records: within half a multiple
        # of it, or still at the previous width while the target walks towards the next multiple
        targets, before = fp.targets, prev.targets or prev.widths
        assert all(targets[g] <= before[g] for g in targets)
        assert all(abs(w - targets[g]) <= 2 or w == prev.widths[g] for g, w in fp.widths.items()), fp
    assert trace(module.model).macs() == road.seed.macs


def test_a_rounded_retry_starts_from_the_seeds_widths(tmp_path, pretrained, monkeypatch):
    """Scripted accuracies (start, broken step, kept retry): the retry's half step shrinks the
    seed's widths, not the targets the broken step had already moved."""
    pl.seed_everything(0)
    module = _module(pretrained)
    cb = _prune(criterion="l1", max_drop=0.05, step=0.3, max_steps=1, backoff=1, recover_epochs=0,
                finetune_epochs=0, round_to=4)
    _script(cb, monkeypatch, [0.9, 0.1, 0.9], then=0.9)
    _trainer(tmp_path, [cb], epochs=4).fit(module, datamodule=_dm())
    road = Roadmap.load(tmp_path / "pruning" / "roadmap.json")
    assert [f.step for f in road.footprints] == [0, 1] and len(road.rejected) == 1
    assert road.rejected[0].targets == {g: shrink(w, 1.0, 0.3, cb.min_channels) for g, w in road.groups.items()}
    assert road.seed.targets == {g: shrink(w, 1.0, 0.15, cb.min_channels) for g, w in road.groups.items()}


def test_a_retry_after_kept_steps_restarts_the_schedule_from_the_seeds_widths(tmp_path, pretrained, monkeypatch):
    """Scripted accuracies (start, kept step, broken step, kept retry), widths in multiples of 4: the
    seed (step 1) recorded targets off its widths (8 channels at 0.3: target 6, rounded to 4). A
    retry that shrank those targets took the same widths whatever its step size (the latency
    roadmap's seed 1: three retries, one plan); it now shrinks the seed's widths."""
    pl.seed_everything(0)
    module = _module(pretrained)
    cb = _prune(criterion="l1", max_drop=0.05, step=0.3, max_steps=2, backoff=1, recover_epochs=0,
                finetune_epochs=0, round_to=4)
    _script(cb, monkeypatch, [0.9, 0.9, 0.1, 0.9], then=0.9)
    _trainer(tmp_path, [cb], epochs=5).fit(module, datamodule=_dm())
    road = Roadmap.load(tmp_path / "pruning" / "roadmap.json")
    assert [f.step for f in road.footprints] == [0, 1, 2] and len(road.rejected) == 1
    seed = road.footprints[1]
    assert any(seed.targets[g] != w for g, w in seed.widths.items())  # the case the fix is about
    assert road.footprints[2].targets == {g: shrink(w, 1.0, 0.15, cb.min_channels) for g, w in seed.widths.items()}


def _script(cb, monkeypatch, values, then):
    """Make ``cb``'s evaluations return ``values``, then ``then``; returns the epochs they ran at."""
    import itertools

    script, calls = itertools.chain(values, itertools.repeat(then)), []
    monkeypatch.setattr(cb, "_evaluate", lambda trainer, model, batches: calls.append(trainer.current_epoch)
                        or next(script))
    return calls


@pytest.mark.parametrize(("after_recovery", "kept"), [(0.9, True), (0.1, False)])
def test_a_step_that_misses_the_goal_is_retrained_once_more_before_it_is_judged(
        tmp_path, pretrained, monkeypatch, after_recovery, kept):
    """Scripted accuracies (start, the step after its retraining epoch, the same step after one
    more): the step is judged on the second figure; only then is it kept, or rejected and retried."""
    pl.seed_everything(0)
    module = _module(pretrained)
    cb = _prune(criterion="l1", max_drop=0.05, step=0.3, max_steps=1, backoff=0, recover_epochs=1)
    calls = _script(cb, monkeypatch, [0.9, 0.1, after_recovery], then=0.9)
    _trainer(tmp_path, [cb], epochs=5).fit(module, datamodule=_dm())
    road = Roadmap.load(tmp_path / "pruning" / "roadmap.json")
    assert calls == [0, 1, 2]  # start, after the step's epoch, after the recovery epoch
    if kept:
        assert [f.step for f in road.footprints] == [0, 1] and road.footprints[1].epoch == 2 and not road.rejected
        assert road.status == "max_steps"
    else:  # no back-off: the step broke the goal after recovery too, so the seed is the start
        assert [f.step for f in road.footprints] == [0] and len(road.rejected) == 1 and road.status == "goal_broken"
        assert road.rejected[0].accuracy == 0.1


@pytest.mark.parametrize(("after", "kept"), [(0.95, True), (0.85, False)])
def test_the_seed_is_fine_tuned_once_the_roadmap_ends(tmp_path, pretrained, monkeypatch, after, kept):
    """Scripted accuracies (start, step 1 kept at 0.9, the fine-tuned seed): better weights replace
    the seed's footprint and seed.ckpt; worse ones are dropped and the seed's weights come back."""
    pl.seed_everything(0)
    module = _module(pretrained)
    cb = _prune(criterion="l1", max_drop=0.5, step=0.3, max_steps=1, recover_epochs=0, finetune_epochs=2)
    calls = _script(cb, monkeypatch, [0.95, 0.9, after], then=0.0)
    trainer = _trainer(tmp_path, [cb], epochs=6)
    before = {}
    orig = cb._stop

    def stop(trainer, pl_module, status, finetune=True):
        orig(trainer, pl_module, status, finetune)
        before.update({k: v.clone() for k, v in pl_module.state_dict().items()})

    monkeypatch.setattr(cb, "_stop", stop)
    trainer.fit(module, datamodule=_dm())
    road = Roadmap.load(tmp_path / "pruning" / "roadmap.json")
    assert calls == [0, 1, 3] and trainer.current_epoch < 6  # start, step 1, after 2 epochs of fine-tuning
    assert road.status == "max_steps" and [f.step for f in road.footprints] == [0, 1]
    assert road.finetune == {"epochs": 2, "before": 0.9, "after": after, "kept": kept}
    seed_state = torch.load(tmp_path / "pruning" / "seed.ckpt", weights_only=True)["state_dict"]
    step_state = torch.load(tmp_path / "pruning" / road.seed.checkpoint, weights_only=True)["state_dict"]
    trained = not torch.equal(seed_state["model.features.conv1.weight"], before["model.features.conv1.weight"])
    assert trained == kept and torch.equal(seed_state["model.features.conv1.weight"], step_state["model.features.conv1.weight"])
    assert road.seed.accuracy == (after if kept else 0.9) and road.seed.epoch == (3 if kept else 1)
    # the module ends as the seed the roadmap names
    torch.testing.assert_close(module.state_dict()["model.features.conv1.weight"], seed_state["model.features.conv1.weight"])


def test_the_roadmap_records_its_sample_count_and_warns_when_the_goal_is_within_the_noise(tmp_path, pretrained):
    pl.seed_everything(0)
    module = _module(pretrained)
    # 96 validation images: one accuracy's standard error is ~5 points, so a 2-point goal is noise
    with pytest.warns(UserWarning, match=r"2.00 points, 0.\d standard errors of an accuracy measured on 96"):
        _trainer(tmp_path, [_prune(criterion="l1", max_drop=0.02, max_steps=1)], epochs=2).fit(module, datamodule=_dm())
    road = Roadmap.load(tmp_path / "pruning" / "roadmap.json")
    noise = road.noise()
    assert road.eval_samples == 96 and noise["eval_samples"] == 96 and noise["margin_se"] < 2
    assert noise["warning"].endswith("samples, or a larger `max_drop`")
    # a wide margin on the same split: no warning
    road.goal = road.start_accuracy - 0.5
    assert road.noise()["warning"] is None and road.noise()["margin_se"] > 2


def test_goal_above_start_accuracy_is_an_error(tmp_path, pretrained):
    module = _module(pretrained)
    with pytest.raises(PruningError, match=r"`goal`=0.9999 is above the starting accuracy"):
        _trainer(tmp_path, [_prune(max_drop=None, goal=0.9999)]).fit(module, datamodule=_dm())


def test_empty_eval_loader_is_an_error(tmp_path):
    with pytest.raises(PruningError, match="the evaluation dataloader yielded no samples"):
        _trainer(tmp_path, [_prune(eval_dataloader=[])]).fit(_module(), datamodule=_dm())


def test_model_without_prunable_group_is_an_error(tmp_path):
    class Linear(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(3 * 32 * 32, 10)

        def forward(self, x):
            return self.fc(x.flatten(1))

        def training_step(self, batch, i):
            return torch.nn.functional.cross_entropy(self(batch[0]), batch[1])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    with pytest.raises(PruningError, match="has no prunable channel group"):
        _trainer(tmp_path, [_prune(criterion="l1")]).fit(Linear(), datamodule=_dm())


def test_fast_dev_run(tmp_path):
    cb = _prune(criterion="l2", allocation="sensitivity", fractions=(0.5,))
    _trainer(tmp_path, [cb], fast_dev_run=True).fit(_module(), datamodule=_dm())
    road = Roadmap.load(tmp_path / "pruning" / "roadmap.json")
    assert road.footprints[0].step == 0 and road.status in ("max_epochs", "max_steps")


def test_input_shape_is_validated_and_checked_against_the_data(tmp_path):
    from nestflex.errors import GraphError

    with pytest.raises(GraphError, match=r"`input_shape` must be a sequence of positive integers \(C, H, W\), got "
                                         r"\(0, 32\)"):
        _prune(input_shape=(0, 32))
    # traced at 40x40, fed 32x32: fails at the first evaluation, before anything is pruned
    with pytest.raises(GraphError, match=r"FilterPruning: `input_shape` says the per-sample input is \(3, 40, 40\), "
                                         r"but the DataModule's `input_shape` is \(3, 32, 32\)"):
        _trainer(tmp_path, [_prune(criterion="l1", input_shape=(3, 40, 40))], fast_dev_run=True).fit(
            _module(), datamodule=_dm())
    assert not (tmp_path / "pruning" / "roadmap.json").exists()


def test_greyscale_module_is_traced_at_its_own_shape(tmp_path):
    from nestflex.data import MNISTDataModule
    from tests.data.mnist_files import make_fake_mnist

    data = make_fake_mnist(tmp_path / "mnist", n_train=160, n_test=32)
    dm = MNISTDataModule(data["root"], batch_size=32, val_size=64)
    module = ImageClassifier("vgg11", width=0.125, max_epochs=2, input_shape=dm.input_shape)
    cb = _prune(criterion="l1", allocation="uniform")  # no input_shape: the module's (1, 32, 32)
    _trainer(tmp_path, [cb], epochs=2).fit(module, datamodule=dm)
    road = Roadmap.load(tmp_path / "pruning" / "roadmap.json")
    vanilla = trace(ImageClassifier("vgg11", width=0.125, input_shape=(1, 32, 32)))
    assert road.footprints[0].macs == vanilla.macs() and road.footprints[0].params == vanilla.params()
    assert module.model.features.conv1.in_channels == 1


class _Kill(Callback):
    def __init__(self, at):
        self.at = at

    def on_train_epoch_start(self, trainer, pl_module):
        if trainer.current_epoch == self.at:
            raise RuntimeError("killed")


def test_killed_and_resumed_run_gives_the_same_roadmap(tmp_path, pretrained):
    def run(root, kill=None, ckpt=None):
        pl.seed_everything(0)
        cbs = [_prune(), ModelCheckpoint(dirpath=root / "ckpt", save_last=True)]
        if kill is not None:
            cbs.append(_Kill(kill))
        _trainer(root, cbs).fit(_module(pretrained), datamodule=_dm(), ckpt_path=ckpt)
        return json.loads((root / "pruning" / "roadmap.json").read_text())

    whole = run(tmp_path / "a")
    with pytest.raises(RuntimeError, match="killed"):
        run(tmp_path / "b", kill=2)
    assert json.loads((tmp_path / "b" / "pruning" / "roadmap.json").read_text())["status"] == "running"
    resumed = run(tmp_path / "b", ckpt=tmp_path / "b" / "ckpt" / "last.ckpt")
    assert resumed == whole


KILL_BEFORE_CHECKPOINT = textwrap.dedent(
    """
    import os, signal, sys
    from pathlib import Path
    import pytorch_lightning as pl
    from pytorch_lightning.callbacks import Callback, ModelCheckpoint
    from tests.pruning.test_callback import _dm, _module, _prune, _trainer

    class SigKill(Callback):  # mid-way through epoch 0: the roadmap is started, no checkpoint exists yet
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if trainer.current_epoch == 0 and batch_idx == 3:
                os.kill(os.getpid(), signal.SIGKILL)

    root = Path(sys.argv[1])
    pl.seed_everything(0)
    cbs = [_prune(), ModelCheckpoint(dirpath=root / "ckpt", save_last=True), SigKill()]
    _trainer(root, cbs).fit(_module(), datamodule=_dm())
    """
)


def test_a_run_killed_before_its_first_checkpoint_reruns_to_the_same_roadmap(tmp_path):
    """SIGKILL before ModelCheckpoint ever wrote: nothing to resume from, so the stage runs again
    (as the recipe does without last.ckpt) over what the killed run left, and ends where an
    uninterrupted run ends."""
    def run(root):
        pl.seed_everything(0)
        _trainer(root, [_prune(), ModelCheckpoint(dirpath=root / "ckpt", save_last=True)]).fit(
            _module(), datamodule=_dm())
        return json.loads((root / "pruning" / "roadmap.json").read_text())

    whole = run(tmp_path / "a")
    root = Path(__file__).resolve().parents[2]
    killed = subprocess.run([sys.executable, "-c", KILL_BEFORE_CHECKPOINT, str(tmp_path / "b")], cwd=root,
                            env={**os.environ, "PYTHONPATH": str(root)}, capture_output=True, text=True, timeout=600)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    left = json.loads((tmp_path / "b" / "pruning" / "roadmap.json").read_text())
    assert left["status"] == "running" and len(left["footprints"]) == 1  # started, then killed
    assert not (tmp_path / "b" / "ckpt").exists() or not any((tmp_path / "b" / "ckpt").iterdir())
    assert run(tmp_path / "b") == whole


DDP_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import pytorch_lightning as pl
    from nestflex.callbacks import FilterPruning
    from nestflex.data import SyntheticDataModule
    from nestflex.training import ImageClassifier

    out = sys.argv[1]
    pl.seed_everything(0)
    dm = SyntheticDataModule(batch_size=32, train_size=256, test_size=32, val_size=64, seed=0)
    module = ImageClassifier("vgg11", width=0.125, max_epochs=3)
    cb = FilterPruning("trr", max_drop=0.5, step=0.3, allocation="uniform", criterion_kwargs={"triplets": 40})
    trainer = pl.Trainer(max_epochs=3, accelerator="cpu", devices=2, strategy="ddp", callbacks=[cb], logger=False,
                         enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
                         default_root_dir=out)
    trainer.fit(module, datamodule=dm)
    with open(f"{out}/rank{trainer.global_rank}.json", "w") as f:
        json.dump(cb.roadmap.to_dict(), f)
    """
)


def test_two_process_ddp_gives_the_same_roadmap_on_both_ranks(tmp_path):
    script = tmp_path / "ddp_prune.py"
    script.write_text(DDP_SCRIPT)
    proc = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True, text=True, timeout=600,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert r0 == r1
    assert len(r0["footprints"]) >= 2 and r0["footprints"][-1]["macs"] < r0["footprints"][0]["macs"]
