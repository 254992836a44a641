"""Frozen = bit-identical: the nesting invariant (DESIGN.md invariant 1) under SGD + weight decay + momentum."""

import copy

import pytest
import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from pytorch_lightning.callbacks import Callback, ModelCheckpoint

from nestflex.capacity import CapacityError, FreezeAndGrow, LevelFreezer, MultiCapacityModel, get_level, set_level
from nestflex.capacity.nested import level_regions
from nestflex.data import SyntheticDataModule
from nestflex.errors import PruningError
from nestflex.pruning import Roadmap
from nestflex.training import ImageClassifier
from tests.capacity.conftest import make_roadmap

X = torch.randn(6, 3, 32, 32, generator=torch.Generator().manual_seed(3))


def _level_state(model, level):
    """Outputs (eval) and every tensor entry level ``level`` computes with."""
    was, cur = model.training, get_level(model)
    set_level(model, level)
    model.eval()
    with torch.no_grad():
        out = model(X).clone()
    model.train(was)
    set_level(model, cur)
    regions = level_regions(model)
    params = {n: p.detach()[regions[n][level]].clone() for n, p in model.named_parameters() if regions[n][level] is not None}
    buffers = {n: b.clone() for n, b in model.named_buffers() if f".levels.{level}." in n}
    return out, params, buffers


def _assert_same(a, b):
    assert torch.equal(a[0], b[0])
    assert a[1].keys() == b[1].keys() and all(torch.equal(a[1][k], b[1][k]) for k in a[1])
    assert a[2].keys() == b[2].keys() and all(torch.equal(a[2][k], b[2][k]) for k in a[2])


@pytest.mark.parametrize("optim", ["sgd", "adam"])
def test_level_freezer_keeps_smaller_levels_bit_identical(vgg_roadmap, optim):
    net, path = vgg_roadmap
    mc = MultiCapacityModel.from_roadmap(net, path, levels=3)
    g = torch.Generator().manual_seed(0)
    for level in (1, 2):
        before = {j: _level_state(mc.net, j) for j in range(level)}
        top = _level_state(mc.net, level)
        mc.set_level(level).train()
        freezer = LevelFreezer(mc.net, level)
        opt = (torch.optim.SGD(mc.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-3, nesterov=True) if optim == "sgd"
               else torch.optim.AdamW(mc.parameters(), lr=0.01, weight_decay=0.1))
        opt.register_step_post_hook(lambda *_: freezer.restore())
        for _ in range(4):
            x, y = torch.randn(8, 3, 32, 32, generator=g), torch.randint(0, 10, (8,), generator=g)
            opt.zero_grad()
            F.cross_entropy(mc(x), y).backward()
            opt.step()
        assert freezer.changed() == []
        for j in range(level):
            _assert_same(before[j], _level_state(mc.net, j))
        assert not torch.equal(top[0], _level_state(mc.net, level)[0])  # the grown level did train


def test_without_restore_weight_decay_would_break_nesting(vgg_roadmap):
    """The check above can fail: plain SGD with weight decay moves the seed's weights."""
    net, path = vgg_roadmap
    mc = MultiCapacityModel.from_roadmap(net, path, levels=3)
    before = _level_state(mc.net, 0)
    mc.set_level(1).train()
    opt = torch.optim.SGD(mc.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-3)
    for _ in range(2):
        opt.zero_grad()
        F.cross_entropy(mc(X), torch.zeros(6, dtype=torch.long)).backward()
        opt.step()
    assert not torch.equal(before[0], _level_state(mc.net, 0)[0])


class _Recorder(Callback):
    """Before each level trains, record every smaller level; compare them all at the end."""

    def __init__(self):
        self.seen = {}

    def on_train_epoch_start(self, trainer, pl_module):
        for j in range(get_level(pl_module)):
            self.seen.setdefault(j, []).append(_level_state(pl_module, j))


def _dm():
    return SyntheticDataModule(batch_size=32, train_size=192, test_size=32, val_size=64, seed=0)


def _module(epochs):
    return ImageClassifier("vgg11", width=0.125, lr=0.05, max_epochs=epochs, restart_epochs=1)


@pytest.fixture
def grow_roadmap(tmp_path):
    torch.manual_seed(0)
    make_roadmap(tmp_path / "prune", _module(1), steps=3)
    return tmp_path / "prune" / "roadmap.json"


def test_callback_nesting_invariant(grow_roadmap, tmp_path):
    rec = _Recorder()
    cb = FreezeAndGrow(grow_roadmap, levels=3, epochs_per_level=1, dirpath=tmp_path / "grow")
    module = _module(2)
    trainer = pl.Trainer(max_epochs=2, callbacks=[cb, rec], logger=False, enable_progress_bar=False,
                         enable_model_summary=False, enable_checkpointing=False, default_root_dir=tmp_path)
    trainer.fit(module, datamodule=_dm())
    assert get_level(module) == 2 and sorted(rec.seen) == [0, 1] and len(rec.seen[0]) == 2
    for j, states in rec.seen.items():
        for s in states:  # level j after every later level grew == level j when it was done
            _assert_same(s, _level_state(module, j))
    report = [r["level"] for r in cb.records]
    assert report == [0, 1, 2] and (tmp_path / "grow" / "capacity.json").exists()
    assert cb.records[0]["macs"] < cb.records[1]["macs"] < cb.records[2]["macs"]


def test_callback_resume_mid_growth_matches_uninterrupted(grow_roadmap, tmp_path):
    def run(root, ckpt=None, epochs=3):
        pl.seed_everything(0, workers=True)
        module = _module(epochs)
        cb = FreezeAndGrow(grow_roadmap, levels=4, epochs_per_level=1, dirpath=root / "grow")
        trainer = pl.Trainer(max_epochs=epochs, callbacks=[cb, ModelCheckpoint(dirpath=root, save_top_k=-1, every_n_epochs=1)],
                             logger=False, enable_progress_bar=False, enable_model_summary=False, default_root_dir=root)
        trainer.fit(module, datamodule=_dm(), ckpt_path=ckpt)
        return module, cb

    full, cb_full = run(tmp_path / "a")
    ckpt = sorted((tmp_path / "a").glob("epoch=1*.ckpt"))[0]  # killed after level 2
    resumed, cb_res = run(tmp_path / "b", ckpt=str(ckpt))
    a, b = full.state_dict(), resumed.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert cb_full.records == cb_res.records


def test_callback_bad_input(grow_roadmap, tmp_path):
    with pytest.raises(CapacityError, match=r"`levels`=9 but the roadmap has only 4 footprints"):
        FreezeAndGrow(grow_roadmap, levels=9).build(_module(1))
    with pytest.raises(CapacityError, match=r"HINT: the roadmap comes from another model"):
        FreezeAndGrow(grow_roadmap, levels=3).build(ImageClassifier("resnet20", width=0.25))
    road = Roadmap.load(grow_roadmap)  # FilterPruning records the shape it traced at; this helper's roadmap does not
    road.input_shape = [3, 32, 32]
    road.save(tmp_path / "shaped" / "roadmap.json")
    with pytest.raises(CapacityError, match=r"traces at per-sample input_shape \(3, 40, 40\), but the roadmap was "
                                            r"made at \(3, 32, 32\)"):
        FreezeAndGrow(tmp_path / "shaped" / "roadmap.json", levels=3, input_shape=(3, 40, 40)).build(_module(1))
    with pytest.raises(CapacityError, match=r"`epochs_per_level` must be an int >= 1, got 0"):
        FreezeAndGrow(grow_roadmap, epochs_per_level=0)
    with pytest.raises(CapacityError, match=r"`init` must be one of \('footprint', 'vanilla', 'random'\), got 'zeros'"):
        FreezeAndGrow(grow_roadmap, init="zeros")
    with pytest.raises(PruningError, match=r"roadmap .*missing.json does not exist. HINT: run the pruning stage first"):
        FreezeAndGrow(tmp_path / "missing.json").build(_module(1))
