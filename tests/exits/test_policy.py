import ast
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import nestflex.deploy.exits as exits_module
from nestflex.deploy.exits import (
    FALLBACKS,
    ExitError,
    ExitResult,
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
    return np.stack(out) if isinstance(out[0], np.ndarray) else torch.stack(out)


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


def test_deploy_exits_imports_no_torch_and_no_training_package():
    # no import of torch anywhere in the module, function bodies included: the runtime runs it on numpy
    tree = ast.parse(Path(exits_module.__file__).read_text())
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    heavy = ("torch", "lightning", "timm", "torchmetrics", "onnx", "nestflex.exits", "nestflex.graph")
    assert not [m for m in imported if m.startswith(heavy)], imported


# a fresh interpreter in which importing torch fails; `nestflex.deploy` is a bare package there, so
# what is checked is this module's own imports and numpy code paths, whatever the package's __init__ pulls in
_NO_TORCH = """
import importlib.abc, sys, types
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError("torch is blocked in this test")
sys.meta_path.insert(0, Block())
import nestflex
if {bare}:
    pkg = types.ModuleType("nestflex.deploy")
    pkg.__path__ = [nestflex.__path__[0] + "/deploy"]
    sys.modules["nestflex.deploy"] = pkg
import numpy as np
import nestflex.deploy.exits as ex
z = np.random.default_rng(0).normal(size=(3, 8, 5)).astype(np.float32)
out = ex.apply_policy(z, 0.5, "entropy")
ex.decide(np.stack([ex.max_prob(a) for a in z]), [0.5, 0.6])
ex.early_exit([lambda a: a] * 3, [lambda s: s[0][:, :5]] * 3, z[0], 0.5, fallback="final")
ex.early_exit([lambda a: a] * 3, [lambda s: s[0]] * 3, z[0, :1], 0.5)
ex.check_thresholds(np.array([0.5, 0.6]), 2)
out.mean_cost([1, 2, 3])
print("torch" in sys.modules)
"""


def _run_without_torch(bare: bool) -> subprocess.CompletedProcess:
    code = _NO_TORCH.format(bare=bare)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)


def test_the_policy_runs_on_numpy_with_torch_blocked():
    out = _run_without_torch(bare=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_importing_deploy_exits_leaves_torch_out():
    out = _run_without_torch(bare=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_confidences_give_back_the_array_type_they_get():
    z = torch.randn(20, 7, generator=torch.Generator().manual_seed(4)) * 3
    for name in ("max_prob", "entropy"):
        fn = get_confidence(name)
        from_numpy, from_torch = fn(z.numpy()), fn(z)
        assert isinstance(from_numpy, np.ndarray) and from_numpy.dtype == np.float32
        assert isinstance(from_torch, torch.Tensor) and from_torch.dtype == torch.float32
        np.testing.assert_array_equal(from_torch.numpy(), from_numpy)
        # float64, float16, integer and grad-requiring logits: computed in float32 all the same
        np.testing.assert_array_equal(fn(z.double()).numpy(), from_numpy)
        assert fn(z.clone().requires_grad_()).requires_grad is False
        assert fn(z.half()).dtype == torch.float32 and fn(z.bfloat16()).dtype == torch.float32
        assert fn(np.array([[1, 0], [0, 0]])).dtype == np.float32
        assert fn(z[0]).shape == ()  # one sample's logits (C,): one confidence


def test_confidences_stay_close_to_torch_float32_softmax():
    # torch rounds its float32 exp and sums in another order: values agree to a few ulp
    z = torch.randn(2000, 10, generator=torch.Generator().manual_seed(5)) * 4
    want = torch.softmax(z, -1).amax(-1)
    torch.testing.assert_close(get_confidence("max_prob")(z), want, rtol=0, atol=5e-7)
    logp = torch.log_softmax(z, -1)
    want = (1 + (logp.exp() * logp).sum(-1) / math.log(10)).clamp(0, 1)
    torch.testing.assert_close(get_confidence("entropy")(z), want, rtol=0, atol=1e-6)
    # a probability that underflows to 0 adds 0 (not nan); an infinite logit gives nan, as in torch
    with pytest.warns(RuntimeWarning, match="invalid value"):  # numpy says so, torch does not
        got = get_confidence("entropy")(np.array([[200, 0, -200], [np.inf, 0, 0]], dtype=np.float32))
    assert got[0] == 1.0 and np.isnan(got[1])


def test_thresholds_are_compared_in_the_confidences_dtype():
    c = np.float32(0.7)  # 0.699999988...
    just_below = float(c) - 1e-12  # below c as a float64, equal to c once rounded to float32
    conf = np.array([[c, c], [0.1, 0.9]], dtype=np.float32)
    for confidences in (conf, torch.from_numpy(conf)):
        assert decide(confidences, just_below)[0].tolist() == [1, 1]  # a tie: nobody exits
        assert decide(confidences, float(c) - 1e-7)[0].tolist() == [0, 0]
    # a float64 confidence is compared in float64
    assert decide(conf.astype(np.float64), just_below)[0].tolist() == [0, 0]
    logits = [np.array([[1.0, 1.0]], dtype=np.float32), np.array([[0.0, 5.0]], dtype=np.float32)]
    heads = [lambda s, z=z: np.repeat(z, len(s[0]), axis=0) for z in logits]
    for n in (1, 2):  # one sample and a batch: max_prob is 0.5 exactly, a tie
        for threshold, stop in ((0.5 - 1e-12, 1), (0.5 - 1e-7, 0)):
            out = early_exit([lambda a: a] * 2, heads, np.zeros((n, 1)), threshold)
            assert out.exit_index.tolist() == [stop] * n


def test_decide_and_apply_policy_give_back_the_array_type_they_get():
    g = torch.Generator().manual_seed(6)
    conf = torch.rand(4, 50, generator=g)
    logits = torch.randn(4, 50, 6, generator=g) * 3
    for fallback in FALLBACKS:
        t_exit, t_answer = decide(conf, [0.8, 0.7, 0.9], fallback)
        n_exit, n_answer = decide(conf.numpy(), [0.8, 0.7, 0.9], fallback)
        assert isinstance(t_exit, torch.Tensor) and t_exit.dtype == torch.long
        assert isinstance(n_exit, np.ndarray) and n_exit.dtype == np.int64
        assert t_exit.tolist() == n_exit.tolist() and t_answer.tolist() == n_answer.tolist()
        for as_list in (False, True):
            t_in = list(logits) if as_list else logits
            n_in = [z.numpy() for z in logits] if as_list else logits.numpy()
            t_out = apply_policy(t_in, 0.8, "entropy", fallback)
            n_out = apply_policy(n_in, 0.8, "entropy", fallback)
            _assert_same_result(t_out, n_out)
    assert apply_policy(logits.requires_grad_(), 0.8).logits.requires_grad is False


def _assert_same_result(from_torch: ExitResult, from_numpy: ExitResult) -> None:
    """``from_torch`` holds CPU tensors, ``from_numpy`` numpy arrays, of the same dtypes and values."""
    for field in ("logits", "exit_index", "answer_index", "confidence"):
        t, n = getattr(from_torch, field), getattr(from_numpy, field)
        assert isinstance(t, torch.Tensor) and isinstance(n, np.ndarray), field
        assert t.device.type == "cpu" and t.numpy().dtype == n.dtype, field
        np.testing.assert_array_equal(t.numpy(), n, err_msg=field)
    assert from_numpy.exit_index.dtype == np.int64 and from_numpy.confidence.dtype == np.float32


def _elementwise_network(array, k_exits: int = 4, classes: int = 5):
    """Stages that carry two arrays (like a skip connection) and heads that read one, in elementwise
    float32 arithmetic, which numpy and torch round alike: one network for either array type
    (``array`` makes a parameter: ``np.asarray`` or ``torch.from_numpy``). Each stage checks that
    it gets its own array type."""
    rng = np.random.default_rng(0)
    scale = [array(rng.uniform(0.5, 1.5, 8).astype(np.float32)) for _ in range(k_exits)]
    shift = [array(rng.normal(0, 1, 8).astype(np.float32)) for _ in range(k_exits)]
    head_w = [array(rng.normal(0, 2, classes).astype(np.float32)) for _ in range(k_exits)]
    kind = type(scale[0])

    def stage(k):
        def run(a, b=None):
            assert type(a) is kind, f"stage {k} got a {type(a).__name__}"
            return a * scale[k] + shift[k] + (0 if b is None else b), a

        return run

    return [stage(k) for k in range(k_exits)], [lambda s, w=w: s[0][:, :classes] * w for w in head_w]


@pytest.mark.parametrize("confidence", ["max_prob", "entropy"])
@pytest.mark.parametrize("fallback", ["most_confident", "final"])
def test_early_exit_on_numpy_stages_equals_early_exit_on_torch_stages(confidence, fallback):
    x = np.random.default_rng(1).normal(0, 1, (300, 8)).astype(np.float32)
    n_stages, n_heads = _elementwise_network(np.asarray)
    t_stages, t_heads = _elementwise_network(torch.from_numpy)
    conf = np.stack([get_confidence(confidence)(z) for z in _all_logits(n_stages, n_heads, x)])
    thresholds = np.quantile(conf[:-1], 0.6, axis=1).tolist()
    n_out = early_exit(n_stages, n_heads, x, thresholds, confidence, fallback)
    t_out = early_exit(t_stages, t_heads, torch.from_numpy(x), thresholds, confidence, fallback)
    assert len(set(n_out.exit_index.tolist())) == 4, "every exit should be used"
    _assert_same_result(t_out, n_out)
    full = apply_policy(_all_logits(n_stages, n_heads, x), thresholds, confidence, fallback)
    for field in ("logits", "exit_index", "answer_index", "confidence"):
        np.testing.assert_array_equal(getattr(n_out, field), getattr(full, field), err_msg=field)
    for i in range(0, 300, 37):  # one sample at a time: the same answers, in the same types
        one = early_exit(n_stages, n_heads, x[i:i + 1], thresholds, confidence, fallback)
        t_one = early_exit(t_stages, t_heads, torch.from_numpy(x[i:i + 1]), thresholds, confidence, fallback)
        _assert_same_result(t_one, one)
        assert (one.exit_index[0], one.answer_index[0]) == (n_out.exit_index[i], n_out.answer_index[i])
        np.testing.assert_array_equal(one.logits[0], n_out.logits[i])


def test_a_registered_confidence_gets_the_callers_array_type(monkeypatch):
    monkeypatch.setattr(exits_module._CONFIDENCES, "_entries", dict(exits_module._CONFIDENCES._entries))
    seen = []

    @register_confidence("test_policy_first_logit")
    def first(z):
        seen.append(type(z))
        return z[:, 0].clamp(0, 1) if isinstance(z, torch.Tensor) else np.clip(z[:, 0], 0, 1)

    z = torch.rand(3, 4, 2, generator=torch.Generator().manual_seed(7))
    apply_policy(z, 0.5, "test_policy_first_logit")
    apply_policy(z.numpy(), 0.5, "test_policy_first_logit")
    stages, heads = _elementwise_network(torch.from_numpy, k_exits=2, classes=2)
    early_exit(stages, heads, torch.zeros(3, 8), 0.5, "test_policy_first_logit")
    assert seen == [torch.Tensor] * 3 + [np.ndarray] * 3 + [torch.Tensor] * 2


def test_torch_stages_run_without_autograd():
    grad_enabled = []
    lin = torch.nn.Linear(4, 4)

    def stage(a):
        grad_enabled.append(torch.is_grad_enabled())
        return lin(a)

    for n in (5, 1):  # batched and one sample
        out = early_exit([stage, stage], [lambda s: s[0]] * 2, torch.randn(n, 4), 1.0)
        assert out.logits.requires_grad is False
    assert grad_enabled == [False] * 4 and torch.is_grad_enabled()


def test_mean_cost_reads_either_array_type():
    for index in (np.array([0, 2, 2]), torch.tensor([0, 2, 2])):
        result = ExitResult(None, index, index, None)
        assert result.mean_cost([1.0, 2.0, 4.0]) == 3.0
    assert ExitResult(None, np.zeros(0, dtype=np.int64), None, None).mean_cost([1.0]) == 0.0


def test_thresholds_may_be_arrays_or_numpy_numbers():
    assert check_thresholds(np.array([0.25, 0.5]), 2) == [0.25, 0.5]
    assert check_thresholds(torch.tensor([0.25, 0.5]), 2) == [0.25, 0.5]
    assert check_thresholds(np.float32(0.5), 3) == check_thresholds(torch.tensor(0.5), 3) == [0.5] * 3
    with pytest.raises(ExitError, match=r"`thresholds\[0\]` must be a number in \[0, 1\], got True"):
        check_thresholds([True], 1)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("n", [64, 1])
def test_early_exit_on_cuda_stages_answers_on_cuda_as_on_the_cpu(n):
    stages, heads = _elementwise_network(torch.from_numpy)
    x = torch.randn(n, 8, generator=torch.Generator().manual_seed(8))
    cpu = early_exit(stages, heads, x, [0.5, 0.6, 0.7])
    on_cuda = _elementwise_network(lambda a: torch.from_numpy(a).cuda())
    got = early_exit(*on_cuda, x.cuda(), [0.5, 0.6, 0.7])
    for field in ("logits", "exit_index", "answer_index", "confidence"):
        value = getattr(got, field)
        assert value.is_cuda, field
        torch.testing.assert_close(value.cpu(), getattr(cpu, field), rtol=0, atol=1e-6, msg=field)
    assert got.exit_index.dtype == torch.long
