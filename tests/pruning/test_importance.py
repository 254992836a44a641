import pytest
import torch

from nestflex.graph import trace
from nestflex.models import create_model
from nestflex.pruning import Importance, PruningError, WeightNorm, get_importance, list_importances, register_importance


def test_registry_lists_builtins_and_rejects_unknown_names():
    assert {"l1", "l2", "random", "trr"} <= set(list_importances())
    with pytest.raises(PruningError, match=r"`criterion` 'l3' is not registered; choose from .*l1"):
        get_importance("l3")
    with pytest.raises(PruningError, match="already registered"):
        register_importance("l1", WeightNorm)
    crit = WeightNorm(2)
    assert get_importance(crit) is crit
    with pytest.raises(PruningError, match="`p` must be 1 or 2"):
        WeightNorm(3)


def test_l1_l2_are_filter_norms_summed_over_residual_producers():
    model = create_model("resnet20", width=0.25)
    graph = trace(model)
    stem = graph.group("conv1")  # written by the stem and every conv2 of stage 1
    producers = [m.module for m in stem.members if m.role == "out" and m.attr == "weight"]
    assert len(producers) == 4
    expect = sum(model.get_submodule(p).weight.detach().double().abs().flatten(1).sum(1) for p in producers)
    torch.testing.assert_close(get_importance("l1").score(model, graph, stem), expect)
    w = model.get_submodule("layer1.0.conv1").weight.detach().double()
    torch.testing.assert_close(get_importance("l2").score(model, graph, "layer1.0.conv1"), w.flatten(1).norm(dim=1))


def test_random_is_seeded_fresh_per_call_and_resumable():
    model = create_model("vgg11", width=0.125)
    graph = trace(model)
    a, b = get_importance("random", seed=1), get_importance("random", seed=1)
    first = a(model, graph)
    assert all(torch.equal(first[k], v) for k, v in b(model, graph).items())
    second = a(model, graph)
    assert not torch.equal(first[0], second[0])
    c = get_importance("random", seed=1)
    c.load_state_dict(a.state_dict())
    assert torch.equal(c(model, graph)[0], a(model, graph)[0])


def test_user_criteria_plug_in_by_subclassing():
    class Index(Importance):
        name = "index"

        def scores(self, model, graph, groups=None, data=None, **kw):
            return {g.id: torch.arange(g.width, dtype=torch.float64) for g in (groups or graph.prunable_groups)}

    model = create_model("vgg11", width=0.125)
    graph = trace(model)
    assert Index().score(model, graph, 0).tolist() == list(range(8))
