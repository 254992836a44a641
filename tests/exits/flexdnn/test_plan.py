"""FlexDNN insertion plan: greedy removal on Q = G / C never raises total MACs."""

import pytest
import torch

from nestflex.errors import NestflexError
from nestflex.exits.flexdnn import insertion_plan, subset_cost


def _case(seed: int, k: int = 5, n: int = 300):
    g = torch.Generator().manual_seed(seed)
    conf = torch.rand(k + 1, n, generator=g)
    correct = torch.rand(k + 1, n, generator=g) < torch.linspace(0.4, 0.9, k + 1)[:, None]
    taps = sorted(torch.randint(1, 90, (k,), generator=g).tolist())
    heads = torch.randint(1, 20, (k,), generator=g).tolist()
    return conf, correct, taps, heads


@pytest.mark.parametrize("seed", range(20))
def test_plan_never_increases_total_macs(seed):
    conf, correct, taps, heads = _case(seed)
    plan = insertion_plan(conf, correct, taps, heads, backbone_macs=100)
    assert plan.mean_macs <= plan.all_candidates_macs
    macs = [plan.all_candidates_macs] + [s["mean_macs"] for s in plan.steps if s["accepted"]]
    assert all(b < a for a, b in zip(macs, macs[1:]))
    refused = [s for s in plan.steps if not s["accepted"]]
    assert len(refused) <= 1 and (not refused or refused[0]["mean_macs"] >= plan.mean_macs)
    again = subset_cost(plan.kept, conf, correct, taps, heads, 100)
    assert again["mean_macs"] == pytest.approx(plan.mean_macs)
    assert again["thresholds"] == plan.thresholds


def test_useless_exit_is_removed_and_useful_one_kept():
    conf = torch.tensor([[0.9] * 6 + [0.1] * 4, [0.0] * 10, [1.0] * 10])
    correct = torch.ones(3, 10, dtype=torch.bool)
    correct[1] = False  # exit 1 is never right: it only costs
    correct[0, 6:] = False
    plan = insertion_plan(conf, correct, [10, 50], [2, 5], 100)
    assert plan.kept == [0]
    assert plan.steps[0]["removed"] == 1


def test_plan_input_errors():
    with pytest.raises(NestflexError, match=r"the insertion plan got no candidate exits.*HINT"):
        insertion_plan(torch.ones(1, 5), torch.ones(1, 5, dtype=torch.bool), [], [], 100)
    with pytest.raises(NestflexError, match=r"the calibration split is empty \(N = 0\)"):
        insertion_plan(torch.ones(2, 0), torch.ones(2, 0, dtype=torch.bool), [1], [1], 100)
    with pytest.raises(NestflexError, match=r"`taps` must follow execution order.*HINT: sort the candidates"):
        insertion_plan(torch.ones(3, 4), torch.ones(3, 4, dtype=torch.bool), [5, 1], [1, 1], 100)
