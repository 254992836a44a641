import pytest
import pytorch_lightning as pl
import torch

from nestflex.exits import MultiExitClassifier, OverthinkingSchedule
from tests.exits.conftest import tiny_loader


def test_two_process_cpu_ddp_trains_every_exit(tmp_path):
    # ddp_spawn pickles the module into two worker processes (the fx stages are rebuilt there)
    # and hands the trained weights back to this process
    module = MultiExitClassifier("resnet20", width=0.25, positions=(0.3, 0.6), max_epochs=1)
    before = {n: p.detach().clone() for n, p in module.named_parameters()}
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp_spawn",
        max_epochs=1,
        limit_val_batches=1,
        callbacks=[OverthinkingSchedule()],
        default_root_dir=tmp_path,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
    )
    trainer.fit(module, tiny_loader(32), tiny_loader(16))
    assert trainer.world_size == 2
    changed = {n.split(".")[1] for n, p in module.named_parameters() if not torch.equal(before[n], p)}
    assert changed == {"backbone", "exits"}
    metrics = trainer.callback_metrics
    assert 0.0 <= float(metrics["val_acc"]) <= 1.0 and "val_acc_layer1.2.relu1" in metrics
    # logged at the last step: global step 1 of 2 (32 samples / 2 ranks / batch 8), halfway up
    c0 = module.exit_positions[0]
    assert float(metrics["tau/layer1.2.relu1"]) == pytest.approx(0.01 + (c0 - 0.01) * 0.5)
