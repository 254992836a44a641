import pytest
import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import Callback

from nestflex.errors import GraphError
from nestflex.exits import ExitError, MultiExitClassifier, OverthinkingSchedule, tau_schedule
from nestflex.training import ImageClassifier
from tests.exits.conftest import tiny_loader


class _Record(Callback):
    """Remembers the loss weights the module trained each step with."""

    def __init__(self):
        self.weights = {}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.weights[trainer.global_step - 1] = list(pl_module.loss_weights)


def _trainer(tmp_path, **kw):
    base = dict(
        accelerator="cpu",
        default_root_dir=tmp_path,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
    )
    return pl.Trainer(**{**base, **kw})


def test_fast_dev_run_trains_every_exit_and_sets_tau(tmp_path):
    module = MultiExitClassifier("resnet20", width=0.25, positions=(0.3, 0.6), max_epochs=1)
    before = {n: p.detach().clone() for n, p in module.named_parameters()}
    trainer = _trainer(tmp_path, fast_dev_run=True, callbacks=[OverthinkingSchedule()])
    trainer.fit(module, tiny_loader(), tiny_loader())
    changed = {n for n, p in module.named_parameters() if not torch.equal(before[n], p)}
    assert any(n.startswith("model.exits.0.") for n in changed) and any(
        n.startswith("model.exits.1.") for n in changed
    )
    assert any(n.startswith("model.backbone.") for n in changed)  # joint mode
    assert module.loss_weights == [0.01, 0.01, 1.0]
    assert trainer.callback_metrics["tau/layer1.2.relu1"] == pytest.approx(0.01)
    result = trainer.test(module, tiny_loader(), verbose=False)[0]
    assert {"test_acc", "test_acc_layer1.2.relu1", "test_acc_layer2.1.relu2", "test_loss"} <= set(result)


class _Kill(Callback):
    def on_train_epoch_start(self, trainer, pl_module):
        if trainer.current_epoch == 1:
            raise RuntimeError("simulated kill")


def test_tau_follows_the_global_step_and_survives_resume(tmp_path):
    from pytorch_lightning.callbacks import ModelCheckpoint

    def fit(*extra, ckpt=None):
        module = MultiExitClassifier("resnet20", width=0.25, positions=(0.3, 0.6), max_epochs=3)
        every_epoch = ModelCheckpoint(
            dirpath=tmp_path, filename="last", save_top_k=1, enable_version_counter=False
        )
        trainer = _trainer(
            tmp_path,
            max_epochs=3,
            limit_val_batches=0,
            enable_checkpointing=True,
            callbacks=[OverthinkingSchedule(), every_epoch, *extra],
        )
        trainer.fit(module, tiny_loader(16), ckpt_path=ckpt)
        return module

    straight = _Record()
    positions = fit(straight).exit_positions
    assert sorted(straight.weights) == list(range(6))  # 3 epochs x 2 batches
    for step, weights in straight.weights.items():
        assert weights == tau_schedule(step, 6, positions)
    # killed after one epoch, resumed from its checkpoint: the schedule continues where it was
    (tmp_path / "last.ckpt").unlink()
    with pytest.raises(RuntimeError, match="simulated kill"):
        fit(_Kill())
    resumed = _Record()
    fit(resumed, ckpt=str(tmp_path / "last.ckpt"))
    assert sorted(resumed.weights) == list(range(2, 6))
    assert all(resumed.weights[s] == straight.weights[s] for s in resumed.weights)


def test_exits_only_freezes_the_backbone_and_its_batchnorm(tmp_path):
    base = ImageClassifier("vgg11", width=0.25)
    module = MultiExitClassifier(
        "vgg11", width=0.25, positions=(0.2, 0.5), mode="exits_only", backbone=base.model, max_epochs=1
    )
    frozen = {k: v.clone() for k, v in module.model.backbone.state_dict().items()}
    heads = {k: v.clone() for k, v in module.model.exits.state_dict().items()}
    trainer = _trainer(tmp_path, max_epochs=1, limit_val_batches=1, callbacks=[OverthinkingSchedule()])
    trainer.fit(module, tiny_loader(32), tiny_loader(16))
    after = module.model.backbone.state_dict()
    assert all(torch.equal(frozen[k], after[k]) for k in frozen), "weights or BatchNorm statistics moved"
    assert any(not torch.equal(heads[k], v) for k, v in module.model.exits.state_dict().items())
    assert not module.model.backbone.training and module.model.exits.training


def test_checkpoint_rebuilds_the_multi_exit_network(tmp_path):
    module = MultiExitClassifier(
        "resnet20", width=0.25, positions=(0.3, "layer3.0.relu2"), head="msdnet", num_classes=7, max_epochs=1
    )
    trainer = _trainer(tmp_path, max_epochs=1, limit_train_batches=1, limit_val_batches=0)
    trainer.fit(module, tiny_loader(16, classes=7))
    trainer.save_checkpoint(tmp_path / "m.ckpt", weights_only=True)
    loaded = MultiExitClassifier.load_from_checkpoint(
        tmp_path / "m.ckpt", map_location="cpu", weights_only=True
    )
    x = torch.randn(2, 3, 32, 32)
    module.eval(), loaded.eval()
    assert all(torch.equal(a, b) for a, b in zip(module(x), loaded(x)))
    assert loaded.model.exit_names == module.model.exit_names


def test_greyscale_input_shape_is_resolved_and_saved(tmp_path):
    base = ImageClassifier("vgg11", width=0.125, input_shape=(1, 32, 32))
    module = MultiExitClassifier("vgg11", width=0.125, positions=(0.5,), backbone=base.model, max_epochs=1)
    assert module.input_shape == module.model.input_shape == (1, 32, 32)  # the backbone's own
    assert module.hparams.input_shape == (1, 32, 32)
    data = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(torch.randn(8, 1, 32, 32), torch.randint(0, 10, (8,))), batch_size=4)
    trainer = _trainer(tmp_path, max_epochs=1, limit_train_batches=1, limit_val_batches=0)
    trainer.fit(module, data)
    trainer.save_checkpoint(tmp_path / "m.ckpt", weights_only=True)
    loaded = MultiExitClassifier.load_from_checkpoint(tmp_path / "m.ckpt", map_location="cpu", weights_only=True)
    x = torch.randn(2, 1, 32, 32)
    module.eval(), loaded.eval()
    assert loaded.input_shape == (1, 32, 32) and all(torch.equal(a, b) for a, b in zip(module(x), loaded(x)))
    fresh = MultiExitClassifier("resnet20", width=0.25, positions=(0.5,), input_shape=(1, 32, 32))
    assert fresh.model.backbone.conv1.in_channels == 1
    with pytest.raises(GraphError, match=r"MultiExitClassifier \(val\) traces the model at per-sample input_shape "
                                        r"\(1, 32, 32\), but the data's samples are \(3, 32, 32\)"):
        fresh.validation_step((torch.randn(2, 3, 32, 32), torch.zeros(2, dtype=torch.long)), 0)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"mode": "frozen"}, r"`mode` must be one of joint, exits_only, got 'frozen'. HINT"),
        ({"head": "resnet"}, r"unknown exit head `resnet`; choose from"),
        (
            {"head": lambda s, c: None},
            r"`head` must be a registered head name, got function. HINT: register it",
        ),
        ({"positions": (0.5, 0.5)}, r"`positions` has the duplicate 0.5"),
        ({"positions": (0.5, 1.5)}, r"`positions\[1\]` must be a MACs fraction in \(0, 1\)"),
        ({"lr": -1}, r"`lr` is out of range, got -1"),
    ],
)
def test_bad_module_arguments(kwargs, match):
    with pytest.raises(ExitError, match=match):
        MultiExitClassifier("resnet20", width=0.25, **kwargs)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"start": 0}, r"`start` must be a number in \(0, 1\], got 0. HINT: SDN starts every exit at 0.01"),
        ({"weighting": "sdn"}, r"`weighting` must be one of overthinking, equal, got 'sdn'"),
        ({"total_steps": 0}, r"`total_steps` must be an int >= 1 or None, got 0"),
    ],
)
def test_bad_callback_arguments(kwargs, match):
    with pytest.raises(ExitError, match=match):
        OverthinkingSchedule(**kwargs)


def test_callback_needs_a_multi_exit_module(tmp_path):
    trainer = _trainer(tmp_path, fast_dev_run=True, callbacks=[OverthinkingSchedule()])
    with pytest.raises(ExitError, match=r"`ImageClassifier` lacks `exit_positions`, `loss_weights`. HINT"):
        trainer.fit(ImageClassifier("resnet20", width=0.25), tiny_loader())


def test_callbacks_module_exports_it():
    from nestflex.callbacks import OverthinkingSchedule as exported

    assert exported is OverthinkingSchedule


def test_joint_mode_trains_a_backbone_handed_over_in_eval_mode(tmp_path):
    base = ImageClassifier("vgg11", width=0.125, max_epochs=1)
    base.model.eval()  # e.g. just evaluated: BatchNorm would train on running statistics
    with pytest.warns(UserWarning, match=r"mode='joint'\): the backbone had \d+ module\(s\) in eval mode"):
        module = MultiExitClassifier(backbone=base.model, positions=(0.5,), mode="joint", max_epochs=1)
    assert all(m.training for m in module.model.backbone.modules())
    base.model.eval()  # ...or put in eval mode after construction: the fit switches it back
    with pytest.warns(UserWarning, match="in eval mode"):
        _trainer(tmp_path, max_epochs=1, limit_train_batches=1, limit_val_batches=1).fit(
            module, tiny_loader(n=16), tiny_loader(n=16))


def test_a_custom_backbone_is_recorded_as_such_and_needs_itself_to_load(tmp_path):
    base = ImageClassifier("vgg11", width=0.125, max_epochs=1)
    module = MultiExitClassifier(backbone=base.model, positions=(0.5,), mode="exits_only", max_epochs=1)
    assert module.hparams.model_name is None and module.hparams.backbone_class == "VGG"
    trainer = _trainer(tmp_path, max_epochs=1, limit_train_batches=1, limit_val_batches=1)
    trainer.fit(module, tiny_loader(n=16), tiny_loader(n=16))
    trainer.save_checkpoint(tmp_path / "m.ckpt")
    with pytest.raises(ExitError, match=r"trained on a backbone of your own \(VGG\).*HINT: pass it again"):
        MultiExitClassifier.load_from_checkpoint(tmp_path / "m.ckpt", weights_only=True)
    fresh = ImageClassifier("vgg11", width=0.125).model
    back = MultiExitClassifier.load_from_checkpoint(tmp_path / "m.ckpt", backbone=fresh, weights_only=True)
    x = torch.randn(2, 3, 32, 32)
    for a, b in zip(back.eval()(x), module.eval()(x)):
        torch.testing.assert_close(a, b)


def test_a_backbone_without_a_shape_needs_input_shape():
    net = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.ReLU(), torch.nn.Conv2d(4, 4, 3), torch.nn.ReLU(),
                              torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(4, 10))
    with pytest.raises(ExitError, match=r"cannot tell the per-sample input shape of the backbone Sequential .* HINT: "
                                        r"pass `input_shape=\(C, H, W\)`"):
        MultiExitClassifier(backbone=net, positions=(0.5,))
    assert MultiExitClassifier(backbone=net, positions=(0.5,), input_shape=(1, 12, 12)).input_shape == (1, 12, 12)


def test_default_positions_fit_a_small_users_cnn_and_explicit_ones_must_fit(tmp_path):
    """Issue 39: SPINN's six default positions on a backbone with five places for exits. The
    default places one exit at each (with a warning naming them), the module trains and its
    checkpoint rebuilds the same exits; the same six positions passed explicitly are refused."""
    from nestflex.exits import DEFAULT_POSITIONS
    from tests.exits.user_cnn import SHAPE, DigitsCNN, loaders, trainer

    train, val = loaders()
    with pytest.warns(UserWarning, match=r"the backbone has 5 places for exits, fewer than the 6 default positions .*"
                                         r"placing 5 exits, one at each place .*: body\.2 \(3%\), body\.5 \(43%\), "
                                         r"body\.9 \(63%\), body\.12 \(90%\), body\.16 \(100%\)\. HINT: pass `positions`"):
        module = MultiExitClassifier(backbone=DigitsCNN(), input_shape=SHAPE, num_classes=10, max_epochs=1)
    assert module.exit_names == ["body.2", "body.5", "body.9", "body.12", "body.16", "final"]
    assert module.hparams.positions is None  # the checkpoint rebuilds the default, not a list that may not fit
    trainer(tmp_path, [OverthinkingSchedule()], fast_dev_run=True).fit(module, train, val)
    assert [tuple(z.shape) for z in module(next(iter(val))[0])] == [(32, 10)] * 6

    with pytest.raises(ExitError, match=r"6 exit positions but the backbone has only 5 places for exits \(body\.2, "
                                        r"body\.5, body\.9, body\.12, body\.16\)\. HINT: pass fewer positions"):
        MultiExitClassifier(backbone=DigitsCNN(), input_shape=SHAPE, positions=DEFAULT_POSITIONS)
