"""Exits on transformers, end to end (issue 40, item 2 and its acceptance): token heads on a tiny
ViT trained by a real Lightning Trainer, exported as a bundle whose onnxruntime runtime agrees
with the trained network on every exit, and a split on the token stream answered by the tail
server over gRPC on 127.0.0.1 with the bundle's own logits. Also the heads' layout rules."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

import nestflex.deploy as nd
from nestflex.deploy.codec import encode, fake_quantize
from nestflex.deploy.split.client import TailClient
from nestflex.deploy.split.runtime import SplitRuntime
from nestflex.exits import (
    ExitError,
    FilterSubsetExit,
    MultiExitClassifier,
    MultiExitNetwork,
    OverthinkingSchedule,
    calibrate,
    create_head,
    fine_grained_exit,
)
from nestflex.exits.heads import TokenHead
from nestflex.export import ExportError, export_bundle
from nestflex.profiling import profile_split_quantization
from nestflex.serve import TailServer
from tests.exits.tiny_vit import SHAPE, TinyViT, tokens_task

POSITIONS = (0.3, 0.55, 0.8)


def test_token_heads_read_tokens_and_channels_last_maps_and_map_heads_refuse_them():
    torch.manual_seed(0)
    x = torch.randn(3, 17, 8)
    cls_head = create_head("token", (17, 8), 5, layout="tokens", pool="cls")
    with torch.no_grad():
        torch.testing.assert_close(cls_head(x), cls_head.linear(cls_head.norm(x[:, 0])))
        mean_head = create_head("token", (4, 4, 8), 5, layout="channels_last")
        grid = torch.randn(3, 4, 4, 8)
        torch.testing.assert_close(mean_head(grid), mean_head.linear(mean_head.norm(grid.mean((1, 2)))))
    with pytest.raises(ExitError, match=r"'sdn' reads channels_first tensors, not tokens.*head='token'"):
        create_head("sdn", (17, 8), 5, layout="tokens")
    with pytest.raises(ExitError, match=r"'token' reads tokens or channels_last tensors, not channels_first"):
        create_head("token", (8, 4, 4), 5)
    with pytest.raises(ExitError, match=r"attach to \(T, C\) token streams, got a tensor of per-sample shape \(8, 4, 4\)"):
        create_head("token", (8, 4, 4), 5, layout="tokens")
    with pytest.raises(ExitError, match="`layout` must be one of"):
        create_head("token", (17, 8), 5, layout="nhwc")
    with pytest.raises(ExitError, match="`pool` must be 'mean' or 'cls'"):
        TokenHead((17, 8), 5, pool="max")


def test_a_flexdnn_exit_on_tokens_reads_the_chosen_channels_of_the_last_dim():
    torch.manual_seed(0)
    ex = fine_grained_exit((16, 12), [7, 2, 9], 5, layout="tokens")
    assert ex.dim == 2 and isinstance(ex.head, TokenHead) and ex.head.linear.in_features == 3
    x = torch.randn(4, 16, 12)
    with torch.no_grad():
        torch.testing.assert_close(ex(x), ex.head(x[:, :, [7, 2, 9]]))
    with pytest.raises(ExitError, match=r"outside the tapped tensor's 12 channels"):
        fine_grained_exit((16, 12), [12], 5, layout="tokens")
    with pytest.raises(ExitError, match="`dim` must be a positive int"):
        FilterSubsetExit([0], ex.head, dim=-1)


def test_flexdnn_token_exits_export_and_run_in_the_bundle_runtime(tmp_path):
    """The channel subset of a token exit is an ``index_select`` on the last dim in the program."""
    torch.manual_seed(0)
    vit = TinyViT().eval()
    net = MultiExitNetwork(vit, positions=(0.3, 0.6), head=lambda shape, n: fine_grained_exit(
        shape, [3, 0, 9, 12], n, layout="tokens")).eval()
    info = export_bundle(tmp_path / "flex.nfx", vit, exits=net, thresholds=[1.0, 1.0], input_shape=SHAPE)
    rt = nd.ProgressiveRuntime(nd.load(info["bundle"]), exit_set="exits")
    x = tokens_task(5, 1)[0]
    with torch.no_grad():
        for k, (got, want) in enumerate(zip(rt.all_exits(x.numpy()), net(x))):
            np.testing.assert_allclose(got, want.numpy(), atol=1e-5, rtol=0, err_msg=f"exit {k}")


def test_a_transformer_that_reads_shapes_in_its_forward_is_refused_at_export_with_the_reason(tmp_path):
    timm = pytest.importorskip("timm")
    vit = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=5, img_size=32, patch_size=8,
                            depth=1, embed_dim=24, num_heads=2).eval()
    with pytest.raises(ExportError, match=r"node 'getattr_1': reads a tensor's shape .* HINT: write the model's sizes"):
        export_bundle(tmp_path / "t.nfx", vit, input_shape=(3, 32, 32), onnx=False)


def test_exits_on_a_vit_sit_at_block_ends_spaced_by_macs_with_token_heads():
    torch.manual_seed(0)
    net = MultiExitNetwork(TinyViT(), positions=POSITIONS)
    assert net.exit_names == ["blocks.0", "blocks.1", "blocks.2", "final"]
    assert all(isinstance(h, TokenHead) for h in net.exits)
    assert net.exit_macs == sorted(net.exit_macs)
    with pytest.raises(ExitError, match="head='token'"):
        MultiExitNetwork(TinyViT(), positions=POSITIONS, head="sdn")


def test_exits_on_swin_read_its_channels_last_maps_and_the_final_exit_is_the_model():
    timm = pytest.importorskip("timm")
    torch.manual_seed(0)
    from timm.models.swin_transformer import SwinTransformer

    model = SwinTransformer(img_size=32, patch_size=2, window_size=4, embed_dim=8, depths=(2, 1), num_heads=(1, 2),
                            num_classes=5).eval()
    assert timm is not None
    net = MultiExitNetwork(model, positions=(0.3, 0.6), input_shape=(3, 32, 32)).eval()
    assert all(isinstance(h, TokenHead) and h.grid for h in net.exits)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        outs = net(x)
        assert [tuple(z.shape) for z in outs] == [(2, 5)] * 3 and torch.equal(outs[-1], model(x))


def _loaders():
    train = DataLoader(TensorDataset(*tokens_task(96, 0)), batch_size=16, shuffle=True,
                       generator=torch.Generator().manual_seed(0))
    return train, DataLoader(TensorDataset(*tokens_task(48, 1)), batch_size=16)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """The tiny ViT with three exits trained jointly (one epoch of six steps, the overthinking
    schedule), calibrated, split-profiled and exported with everything."""
    tmp = tmp_path_factory.mktemp("vit")
    torch.manual_seed(0)
    module = MultiExitClassifier(backbone=TinyViT(), num_classes=4, positions=POSITIONS, max_epochs=1, lr=0.05)
    before = {n: p.detach().clone() for n, p in module.named_parameters()}
    train, val = _loaders()
    pl.Trainer(max_epochs=1, accelerator="cpu", default_root_dir=tmp, logger=False, enable_checkpointing=False,
               enable_progress_bar=False, enable_model_summary=False,
               callbacks=[OverthinkingSchedule()]).fit(module, train, val)
    net = module.model.eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "lossless on 48 samples" is not what this test checks
        calibration = calibrate(net, val, folds=2)
    profile = profile_split_quantization(net.backbone, val, bitwidths=(8,), size_samples=4)
    info = export_bundle(tmp / "vit.nfx", net.backbone, exits=net, calibration=calibration, split_profile=profile,
                         input_shape=SHAPE)
    return before, module, net, nd.load(info["bundle"])


def test_training_moves_the_backbone_and_every_token_head(trained):
    before, module, _, _ = trained
    changed = {n for n, p in module.named_parameters() if not torch.equal(before[n], p)}
    for k in range(len(POSITIONS)):
        assert any(n.startswith(f"model.exits.{k}.") for n in changed), k
    assert any(n.startswith("model.backbone.blocks.") for n in changed)


def test_the_bundles_runtime_agrees_with_training_on_every_exit(trained):
    _, _, net, bundle = trained
    rt = nd.ProgressiveRuntime(bundle, exit_set="exits")
    assert rt.backend == "onnxruntime" and [s.name for s in bundle.spec.splits] == [f"blocks.{i}" for i in range(4)]
    x = tokens_task(24, 2)[0]
    with torch.no_grad():
        ref = [z.numpy() for z in net(x)]
    for k, (got, want) in enumerate(zip(rt.all_exits(x.numpy()), ref)):
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=0, err_msg=f"exit {k}")
    # the policy: the shipped (calibrated) thresholds, and ones that stop half the samples at exit
    # 0 (halfway between two of its confidences, so float rounding cannot flip a sample) and most
    # of the rest at exit 1 (four classes: a top probability is at least 0.25)
    conf = np.sort(torch.softmax(torch.from_numpy(ref[0]), 1).max(1).values.numpy())
    for thresholds in (list(rt.thresholds), [float(conf[11] + conf[12]) / 2, 0.251, 0.251]):
        with torch.no_grad():
            ours = net.early_exit(x, thresholds, rt.confidence, rt.fallback)
        answer = rt(x.numpy(), thresholds=thresholds)
        np.testing.assert_array_equal(answer.exit_index, ours.exit_index.numpy())
        np.testing.assert_allclose(answer.logits, ours.logits.numpy(), atol=1e-5, rtol=0)
    assert len(set(answer.exit_index.tolist())) > 1  # low thresholds: samples left at several exits


def test_a_split_on_the_token_stream_through_the_tail_server_gives_the_bundles_logits(trained):
    _, _, _, bundle = trained
    x = tokens_task(6, 3)[0].numpy()
    thr = [1.0] * len(POSITIONS)  # every sample crosses the split
    ref = nd.ProgressiveRuntime(bundle, exit_set="exits")(x, thresholds=thr)
    with TailServer(bundle, max_wait_ms=1.0).run_in_thread() as server, TailClient(server.address, bundle) as client:
        for split in ("blocks.1", "blocks.2"):
            rt = SplitRuntime(bundle, split, "exits")
            head = rt.head(x, thr)
            assert [c.shape for c in head.crossing] == [(6, 16, 16)]
            for bits in (None, 8):  # float, and ISQuant on the tokens
                reply = client.submit(encode(list(head.crossing), bits=bits), split=split, exit_set="exits", n=6,
                                      num_exits=rt.num_exits, thresholds=thr, deadline_s=10.0).result()
                if bits is None:
                    out = rt.combine(head, reply.result)
                    np.testing.assert_allclose(out.logits, ref.logits, atol=1e-5, rtol=0, err_msg=split)
                    np.testing.assert_array_equal(out.answer_index, ref.answer_index)
                else:
                    local = rt.tail([fake_quantize(t, bits) for t in head.crossing], thr)
                    np.testing.assert_allclose(reply.result.logits, local.logits, atol=1e-5, rtol=0)
    quantization = bundle.spec.splits[1].quantization
    assert quantization is not None  # the split profile measured the token stream
