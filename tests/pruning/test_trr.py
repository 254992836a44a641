import pytest
import torch
from torch import nn
from torch.utils.data import Subset, TensorDataset

from nestflex.graph import trace
from nestflex.models import create_model
from nestflex.pruning import TRR, PruningError, dataset_targets, get_importance, sample_triplets


def test_triplets_are_class_balanced_valid_and_seeded():
    targets = torch.arange(10).repeat_interleave(7)
    t = sample_triplets(targets, 1000, seed=3)
    assert t.shape == (1000, 3)
    a, p, n = targets[t[:, 0]], targets[t[:, 1]], targets[t[:, 2]]
    assert torch.equal(a, p) and bool((a != n).all()) and bool((t[:, 0] != t[:, 1]).all())
    assert torch.bincount(a, minlength=10).tolist() == [100] * 10
    assert torch.equal(t, sample_triplets(targets, 1000, seed=3))
    assert not torch.equal(t, sample_triplets(targets, 1000, seed=4))


def test_single_sample_class_never_anchors_but_can_be_negative():
    targets = torch.tensor([0, 0, 0, 1, 1, 1, 2])
    with pytest.warns(UserWarning, match=r"classes \[2\] have a single sample"):
        t = sample_triplets(targets, 300, seed=0)
    assert 2 not in targets[t[:, 0]].tolist()
    assert 2 in targets[t[:, 2]].tolist()


@pytest.mark.parametrize(
    ("targets", "count", "match"),
    [
        (torch.tensor([1, 1, 1]), 5, "at least two classes"),
        (torch.tensor([0, 1, 2]), 5, "no class has two samples"),
        (torch.tensor([0, 0, 1]), 0, "`triplets` must be a positive int"),
    ],
)
def test_triplet_errors(targets, count, match):
    with pytest.raises(PruningError, match=match):
        sample_triplets(targets, count)


def test_dataset_targets_reads_subsets_and_plain_datasets():
    ds = TensorDataset(torch.zeros(5, 3, 4, 4), torch.tensor([3, 1, 4, 1, 5]))
    assert dataset_targets(Subset(ds, [4, 0])).tolist() == [5, 3]
    with pytest.raises(PruningError, match="empty"):
        dataset_targets(Subset(ds, []))


class _Toy(nn.Module):
    """Filter 0 reads the class channel, filter 1 an equally strong noise channel."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 2, 1, bias=False)
        with torch.no_grad():
            self.conv.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0]]).view(2, 2, 1, 1))
        self.relu = nn.ReLU()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(2, 2)

    def forward(self, x):
        return self.fc(self.pool(self.relu(self.conv(x))).flatten(1))


def _toy_data(n=200, seed=0):
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % 2
    signal = (y.float() * 2).view(n, 1, 1, 1) + 0.1 * torch.randn(n, 1, 4, 4, generator=g)
    noise = 2 * torch.rand(n, 1, 4, 4, generator=g)
    return TensorDataset(torch.cat([signal, noise], 1), y)


def test_trr_ranks_the_class_filter_above_the_noise_filter_l1_cannot():
    model, data = _Toy(), _toy_data()
    graph = trace(model, input_shape=(2, 4, 4))
    gid = graph.group("conv").id
    trr = TRR(triplets=200, seed=0).score(model, graph, gid, data)
    assert trr[0] > 10 * trr[1].abs()
    l1 = get_importance("l1").score(model, graph, gid)
    assert l1[0] == l1[1]  # weight norms are identical: L1 has no way to tell them apart


def _reference_trr(model, graph, group, data, triplets, seed):
    """Brute force: all responses kept, the TRR formula term by term."""
    responses = {}
    nodes = graph.response_nodes(group)
    trip = sample_triplets(dataset_targets(data), triplets, seed)
    model.eval()
    total = torch.zeros(group.width, dtype=torch.float64)
    from torch.fx import Interpreter

    class Keep(Interpreter):
        def run_node(self, n):
            out = super().run_node(n)
            if n.name in nodes:
                responses[n.name] = out.double()
            return out

    with torch.no_grad():
        for a, p, n in trip.tolist():
            resp = []
            for i in (a, p, n):
                Keep(graph.gm).run(data[i][0][None])
                resp.append(dict(responses))
            for node in nodes:
                fa, fp, fn = (r[node][0] for r in resp)
                total += ((fa - fn) ** 2).flatten(1).sum(1) - ((fa - fp) ** 2).flatten(1).sum(1)
    return total


def test_trr_matches_the_formula_on_a_residual_model_and_shards_add_up():
    torch.manual_seed(0)
    model = create_model("resnet20", width=0.25, num_classes=3).eval()
    data = TensorDataset(torch.randn(30, 3, 32, 32), torch.arange(30) % 3)
    graph = trace(model)
    crit = TRR(triplets=6, seed=1, batch_size=4)
    full = crit(model, graph, data=data)
    for group in (graph.groups[0], graph.groups[1]):  # the residual stem group and a plain one
        ref = _reference_trr(model, graph, group, data, 6, 1)
        torch.testing.assert_close(full[group.id], ref, rtol=1e-4, atol=1e-3)
    halves = [crit(model, graph, data=data, rank=r, world_size=2) for r in (0, 1)]
    for gid in full:
        torch.testing.assert_close(halves[0][gid] + halves[1][gid], full[gid], rtol=1e-5, atol=1e-4)


def test_trr_leaves_global_rng_and_train_mode_alone():
    model = create_model("vgg11", width=0.125).train()
    data = TensorDataset(torch.randn(20, 3, 32, 32), torch.arange(20) % 4)
    graph = trace(model)
    torch.manual_seed(5)
    state = torch.get_rng_state()
    TRR(triplets=8)(model, graph, data=data)
    assert torch.equal(state, torch.get_rng_state())
    assert all(m.training for m in model.modules())


def test_trr_without_data_is_an_error():
    model = create_model("vgg11", width=0.125)
    with pytest.raises(PruningError, match="`trr` needs labelled data"):
        TRR()(model, trace(model))
