"""FilterPruning(approximate=True) (issue 40 item 3): the LayerNorm-normalised residual stream of a
ViT is pruned too, the roadmap records the setting, and a replay traces the same way."""

import pytest
import pytorch_lightning as pl
import torch
from timm.models.vision_transformer import VisionTransformer

from nestflex.callbacks import FilterPruning
from nestflex.data import SyntheticDataModule
from nestflex.graph import trace
from nestflex.pruning import PruningError, Roadmap, apply_footprint
from nestflex.training import ImageClassifier


def _vit() -> VisionTransformer:
    net = VisionTransformer(img_size=32, patch_size=8, embed_dim=24, depth=2, num_heads=2, num_classes=10)
    net.input_shape = (3, 32, 32)
    return net


def test_approximate_must_be_a_bool():
    with pytest.raises(PruningError, match=r"`approximate` must be True or False, got 1\. HINT: True also prunes"):
        FilterPruning("l1", max_drop=0.1, approximate=1)


def test_filter_pruning_prunes_a_vit_stream_with_approximate_and_replays_it(tmp_path):
    pl.seed_everything(0)
    module = ImageClassifier("vgg11", width=0.125, max_epochs=3, lr=0.01)
    module.model = _vit()  # any network: the classifier only calls it
    start = trace(module.model).macs()
    callback = FilterPruning("l1", target_macs=0.6, step=0.3, allocation="uniform", approximate=True,
                             dirpath=tmp_path / "pruning")
    trainer = pl.Trainer(max_epochs=3, callbacks=[callback], logger=False, enable_progress_bar=False,
                         enable_model_summary=False, enable_checkpointing=False, default_root_dir=tmp_path)
    trainer.fit(module, datamodule=SyntheticDataModule(batch_size=32, train_size=192, test_size=32, val_size=64,
                                                       seed=0))
    roadmap = Roadmap.load(tmp_path / "pruning" / "roadmap.json")
    assert roadmap.approximate and "patch_embed.proj" in roadmap.groups  # the stream, locked without it
    assert roadmap.status == "target_reached" and trace(module.model, approximate=True).macs() <= 0.6 * start
    width = module.model.cls_token.shape[-1]
    assert width < 24 and module.model.norm.normalized_shape == (width,)
    # a fresh network replays the seed's footprint: the roadmap says to trace it with approximate=True
    fresh = apply_footprint(_vit(), roadmap)
    assert {k: v.shape for k, v in fresh.state_dict().items()} == {k: v.shape for k, v in module.model.state_dict().items()}
