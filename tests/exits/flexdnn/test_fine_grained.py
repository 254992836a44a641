"""Fine-grained (top-k filter) exits, ranked dropout and the compact search head."""

import pytest
import torch

from nestflex.errors import NestflexError
from nestflex.exits.flexdnn import CompactHead, FilterSubsetExit, RankedDropout, exit_filter_counts, fine_grained_exit


def test_filter_counts_follow_ceil_k_n_over_m():
    assert exit_filter_counts(64, 3) == [22, 43, 64]
    assert exit_filter_counts(5, 5) == [1, 2, 3, 4, 5]


def test_layer_with_fewer_filters_than_m_is_refused():
    with pytest.raises(NestflexError, match=r"a layer with 2 filters cannot feed M=3 distinct exits.*HINT: lower"):
        exit_filter_counts(2, 3)
    with pytest.raises(NestflexError, match=r"`exits_per_location` \(M\) must be a positive int, got 0"):
        exit_filter_counts(8, 0)


def test_exit_reads_only_its_filters():
    head = CompactHead(2, [4], num_classes=3, in_hw=(4, 4)).eval()
    ex = FilterSubsetExit(torch.tensor([5, 1]), head).eval()
    x = torch.randn(2, 8, 4, 4)
    torch.testing.assert_close(ex(x), head(x[:, [5, 1]]))
    x2 = x.clone()
    x2[:, [0, 2, 3, 4, 6, 7]] = 100.0  # unselected filters do not matter
    torch.testing.assert_close(ex(x2), ex(x))


def test_registry_head_and_bad_index():
    assert fine_grained_exit((16, 8, 8), [3, 2], 10, head="sdn")(torch.randn(2, 16, 8, 8)).shape == (2, 10)
    with pytest.raises(NestflexError, match=r"selects channels outside the tapped map's 16 channels"):
        fine_grained_exit((16, 8, 8), [16], 10)
    with pytest.raises(NestflexError, match=r"`index` must list distinct"):
        FilterSubsetExit([1, 1], torch.nn.Identity())


def test_ranked_dropout_spares_the_top_filter_and_is_identity_in_eval():
    drop = RankedDropout(4, p_max=0.9)
    x = torch.ones(2000, 4, 2, 2)
    torch.manual_seed(0)
    y = drop.train()(x)
    zeros = (y[:, :, 0, 0] == 0).float().mean(0)
    assert zeros[0] == 0 and zeros[1] < zeros[2] < zeros[3]
    assert torch.equal(drop.eval()(x), x)
    with pytest.raises(NestflexError, match=r"`p_max` \(ranked dropout\) must be in \[0, 1\), got 1.0"):
        RankedDropout(4, p_max=1.0)


def test_stem_pool_cuts_every_block_to_a_quarter_of_the_positions_per_factor_of_two():
    from nestflex.exits.model import _head_macs

    plain = CompactHead(4, [8, 16], num_classes=10, in_hw=(32, 32)).eval()
    pooled = CompactHead(4, [8, 16], num_classes=10, in_hw=(32, 32), stem_pool=4).eval()
    x = torch.randn(3, 4, 32, 32)
    assert pooled(x).shape == (3, 10)
    # the same blocks on the 8x8 average of the map: what the pooled head computes
    pooled.load_state_dict(plain.state_dict())
    torch.testing.assert_close(pooled(x), plain.linear(plain.features(torch.nn.functional.avg_pool2d(x, 4))))
    conv_macs = lambda head: _head_macs(head, (4, 32, 32)) - head.linear.weight.numel()  # noqa: E731
    assert conv_macs(pooled) * 16 == conv_macs(plain)
    assert "stem_pool=4" in repr(pooled)
    # a side the factor does not divide: the last window is partial (ceil mode), as in the bundle's program
    odd = CompactHead(4, [8], num_classes=10, in_hw=(7, 7), stem_pool=2).eval()
    y = torch.randn(2, 4, 7, 7)
    ref = odd.linear(torch.flatten(odd.pool(odd.blocks(torch.nn.functional.avg_pool2d(y, 2, ceil_mode=True))), 1))
    torch.testing.assert_close(odd(y), ref)
    assert torch.nn.functional.avg_pool2d(y, 2, ceil_mode=True).shape[-1] == 4
    with pytest.raises(NestflexError, match=r"`stem_pool` must be a positive int \(1: no pooling\), got 0"):
        CompactHead(4, [8], num_classes=10, in_hw=(8, 8), stem_pool=0)
