import math

import pytest
import torch

from nestflex.deploy.exits import (
    ExitError,
    apply_policy,
    check_thresholds,
    decide,
    early_exit,
    get_confidence,
    list_confidences,
    register_confidence,
)


def test_confidence_registry_has_spinn_and_flexdnn_measures():
    assert {"max_prob", "entropy"} <= set(list_confidences())
    with pytest.raises(
        ExitError, match=r"unknown confidence measure `margin`; choose from: entropy, max_prob.*HINT"
    ):
        get_confidence("margin")
    with pytest.raises(ExitError, match="confidence measure `max_prob` is already registered"):
        register_confidence("max_prob")(lambda z: z)


def test_max_prob_and_entropy_match_their_formulas():
    logits = torch.randn(50, 10, dtype=torch.float64) * 3
    y = torch.softmax(logits, -1)
    torch.testing.assert_close(
        get_confidence("max_prob")(logits).double(), y.max(-1).values, rtol=1e-6, atol=1e-6
    )
    flexdnn = 1 + (y * y.log()).sum(-1) / math.log(10)  # Conf(y) = 1 + (1/log C) sum y log y
    torch.testing.assert_close(get_confidence("entropy")(logits).double(), flexdnn, rtol=1e-5, atol=1e-5)
    ends = get_confidence("entropy")(torch.tensor([[0.0, 0.0, 0.0], [100.0, 0.0, 0.0]]))
    torch.testing.assert_close(ends, torch.tensor([0.0, 1.0]), atol=1e-6, rtol=0)


@pytest.mark.parametrize(
    "thresholds, match",
    [
        (1.5, r"`thresholds\[0\]` must be a number in \[0, 1\], got 1.5. HINT"),
        ([0.5, -0.1], r"`thresholds\[1\]` must be a number in \[0, 1\], got -0.1"),
        ([0.5, float("nan")], r"`thresholds\[1\]` must be a number in \[0, 1\], got nan"),
        ([0.5, "0.7"], r"`thresholds\[1\]` must be a number in \[0, 1\], got '0.7'"),
        ([0.5], r"`thresholds` needs one value per early exit \(2\), got 1: \[0.5\]"),
    ],
)
def test_bad_thresholds_are_explained(thresholds, match):
    with pytest.raises(ExitError, match=match):
        check_thresholds(thresholds, 2)
    with pytest.raises(ExitError, match=match):
        apply_policy(torch.randn(3, 4, 5), thresholds)


def test_bad_fallback_and_shapes():
    with pytest.raises(ExitError, match="`fallback` must be one of most_confident, final, got 'last'"):
        decide(torch.rand(3, 4), 0.5, fallback="last")
    with pytest.raises(
        ExitError, match="`stages` and `heads` must be non-empty and of equal length, got 2 and 1"
    ):
        early_exit([lambda x: (x,)] * 2, [lambda s: s[0]], torch.randn(2, 3), 0.5)


def _reference(conf: torch.Tensor, thresholds: list[float], fallback: str) -> tuple[list[int], list[int]]:
    """The policy as the papers state it, one sample at a time."""
    stops, answers = [], []
    k_exits = conf.shape[0]
    for i in range(conf.shape[1]):
        seen = []
        for k in range(k_exits):
            seen.append(float(conf[k, i]))
            if k < k_exits - 1 and conf[k, i] > thresholds[k]:
                stops.append(k)
                answers.append(k)
                break
        else:
            stops.append(k_exits - 1)
            answers.append(seen.index(max(seen)) if fallback == "most_confident" else k_exits - 1)
    return stops, answers


@pytest.mark.parametrize("fallback", ["most_confident", "final"])
def test_decide_matches_the_stated_policy(fallback):
    g = torch.Generator().manual_seed(3)
    conf = torch.rand(5, 300, generator=g)
    conf[:, :10] = 0.5  # ties: the earliest exit wins
    thresholds = [0.9, 0.8, 0.7, 0.95]
    stop, answer = decide(conf, thresholds, fallback)
    ref_stop, ref_answer = _reference(conf, thresholds, fallback)
    assert stop.tolist() == ref_stop and answer.tolist() == ref_answer
    assert decide(conf, 1.0)[0].eq(4).all()  # threshold 1: nobody exits early
    assert decide(conf, 0.0)[0].eq(0).all()  # threshold 0: everybody exits at the first exit


def _toy_network(k_exits: int = 4, classes: int = 6):
    """Stages that carry two tensors (like a skip connection) and heads that read one."""
    g = torch.Generator().manual_seed(0)
    mats = [torch.randn(8, 8, generator=g) / 3 for _ in range(k_exits)]
    heads_w = [torch.randn(8, classes, generator=g) * 2 for _ in range(k_exits)]

    def stage(k):
        return lambda a, b=None: (torch.tanh(a @ mats[k]) + (0 if b is None else b), a)

    stages = [stage(k) for k in range(k_exits)]
    heads = [lambda s, w=w: s[0] @ w for w in heads_w]
    return stages, heads


def _all_logits(stages, heads, x):
    state, out = (x,), []
    for stage, head in zip(stages, heads):
        state = stage(*state)
        out.append(head(state))
    return torch.stack(out)


@pytest.mark.parametrize("confidence", ["max_prob", "entropy"])
@pytest.mark.parametrize("fallback", ["most_confident", "final"])
def test_batched_early_exit_equals_per_sample_and_full_evaluation(confidence, fallback):
    stages, heads = _toy_network()
    x = torch.randn(200, 8, generator=torch.Generator().manual_seed(1))
    conf = torch.stack([get_confidence(confidence)(z) for z in _all_logits(stages, heads, x)])
    thresholds = [float(q) for q in conf[:-1].quantile(0.6, dim=1)]  # ~40% leave at every exit
    batched = early_exit(stages, heads, x, thresholds, confidence, fallback)
    assert len(set(batched.exit_index.tolist())) == 4, "every exit should be used"
    singles = [
        early_exit(stages, heads, x[i : i + 1], thresholds, confidence, fallback) for i in range(len(x))
    ]
    full = apply_policy(_all_logits(stages, heads, x), thresholds, confidence, fallback)
    for other in (full,):
        assert torch.equal(batched.exit_index, other.exit_index)
        assert torch.equal(batched.answer_index, other.answer_index)
        torch.testing.assert_close(batched.logits, other.logits)
    assert batched.exit_index.tolist() == [s.exit_index.item() for s in singles]
    assert batched.answer_index.tolist() == [s.answer_index.item() for s in singles]
    torch.testing.assert_close(batched.logits, torch.cat([s.logits for s in singles]))
    torch.testing.assert_close(batched.confidence, torch.cat([s.confidence for s in singles]))


@pytest.mark.parametrize("fallback", ["most_confident", "final"])
def test_one_sample_at_a_time_ties_and_float32_thresholds_as_the_batch(fallback):
    # thresholds exactly at some samples' confidences (ties must not exit) and ones float32 rounds
    stages, heads = _toy_network()
    x = torch.randn(64, 8, generator=torch.Generator().manual_seed(2))
    conf = torch.stack([get_confidence("max_prob")(z) for z in _all_logits(stages, heads, x)])
    for thresholds in ([float(conf[k, 5]) for k in range(3)], [0.3 + 1e-9, 0.45 + 1e-9, 0.6 + 1e-9]):
        batched = early_exit(stages, heads, x, thresholds, "max_prob", fallback)
        singles = [early_exit(stages, heads, x[i: i + 1], thresholds, "max_prob", fallback) for i in range(len(x))]
        assert batched.exit_index.tolist() == [s.exit_index.item() for s in singles]
        assert batched.answer_index.tolist() == [s.answer_index.item() for s in singles]
        torch.testing.assert_close(batched.logits, torch.cat([s.logits for s in singles]))
        assert batched.confidence.dtype == singles[0].confidence.dtype


def test_batched_early_exit_only_runs_the_samples_still_in():
    stages, heads = _toy_network(k_exits=3)
    seen = []

    def counting(stage):
        def run(*state):
            seen.append(state[0].shape[0])
            return stage(*state)

        return run

    x = torch.randn(64, 8)
    out = early_exit([counting(s) for s in stages], heads, x, [0.0, 0.0])  # all leave at exit 0
    assert seen == [64] and out.exit_index.eq(0).all()
    seen.clear()
    out = early_exit([counting(s) for s in stages], heads, x, [1.0, 1.0])
    assert seen == [64, 64, 64] and out.exit_index.eq(2).all()
    assert out.mean_cost([1, 2, 10]) == 10.0


def test_deploy_exits_is_pure_torch():
    import nestflex.deploy.exits as mod

    source = open(mod.__file__).read()
    for heavy in ("lightning", "timm", "torchmetrics", "onnx", "nestflex.exits", "nestflex.graph"):
        assert f"import {heavy}" not in source and f"from {heavy}" not in source
