"""Early-exit confidence measures and the exit policy, on numpy (no torch, no training dependency).

One implementation serves both sides: the training side (:mod:`nestflex.exits`) calibrates
thresholds with it on torch tensors, and the runtime runs it on numpy arrays. Arrays follow the
runtime's one rule (:mod:`nestflex.deploy._arrays`): numpy in, numpy out; torch in, torch out (on
the tensor's device). Whatever comes in, the policy is computed on numpy, so both sides get the
same numbers and the runtime needs no torch.

* **Confidence registry**: ``max_prob`` (top-1 softmax value, SPINN) and ``entropy``
  (``1 + (1/log C) * sum_c y_c log y_c``, one minus the normalised entropy, FlexDNN). Both map
  logits ``(N, C)`` to a float32 confidence in ``[0, 1]`` per sample. Add your own with
  :func:`register_confidence`; a registered measure gets the logits in the caller's array type.
* **Policy** (SPINN): a sample exits at the first *early* exit whose confidence exceeds that
  exit's threshold (strictly: a threshold of 1 never exits, 0 exits unless the confidence is
  exactly 0). A sample that passes no threshold runs to the final exit and is answered, by
  default, by the most confident exit seen (``fallback="most_confident"``; ties go to the
  earliest), or by the final exit (``fallback="final"``). A threshold is rounded to the
  confidences' dtype before it is compared, everywhere, so a float32 confidence equal to a
  threshold's float32 value does not exit.
* :func:`apply_policy` applies the policy to the logits of every exit at once (what calibration
  sweeps use); :func:`early_exit` runs it *batched*: samples that exit leave the batch and only
  the rest go through the next stage. Both give exactly the per-sample answers.

Numerics: the confidences are float32, as torch's softmax of float32 logits; ``exp`` and ``log``
are evaluated in float64 and rounded to float32, so every platform gets the same (almost always
the correctly rounded) value, where numpy's own float32 ``exp`` depends on the CPU's SIMD path.
The values agree with ``torch.softmax`` / ``torch.log_softmax`` in float32 to a few ulp (torch
rounds its ``exp`` and sums in another order).

Examples:
    >>> import numpy as np
    >>> logits = np.array([[[4.0, 0.0], [0.1, 0.0]],    # exit 0: sample 0 confident
    ...                    [[0.0, 0.2], [0.0, 3.0]]])   # exit 1 (final)
    >>> out = apply_policy(logits, thresholds=0.9)
    >>> out.exit_index.tolist(), out.answer_index.tolist()
    ([0, 1], [0, 1])
"""

from __future__ import annotations

import math
import numbers
import sys
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from nestflex.deploy._arrays import is_torch, like, to_numpy
from nestflex.deploy._registry import Registry
from nestflex.errors import NestflexError

__all__ = [
    "ExitError",
    "ExitResult",
    "FALLBACKS",
    "register_confidence",
    "list_confidences",
    "get_confidence",
    "check_thresholds",
    "decide",
    "apply_policy",
    "early_exit",
]

#: What answers a sample that passed no early exit's threshold.
FALLBACKS: tuple[str, ...] = ("most_confident", "final")

#: A numpy array, or a torch tensor where the caller passed tensors (:mod:`nestflex.deploy._arrays`).
Array = Any
ConfidenceFn = Callable[[Array], Array]
State = tuple[Array, ...]


class ExitError(NestflexError, ValueError):
    """An exit position, head, confidence measure, threshold or policy argument is invalid."""


_CONFIDENCES: Registry[ConfidenceFn] = Registry(
    "confidence measure", ExitError, accepts=callable, register_hint="register your own with `register_confidence(name)`"
)


def register_confidence(name: str, *, overwrite: bool = False) -> Callable[[ConfidenceFn], ConfidenceFn]:
    """Decorator that registers ``fn(logits (N, C)) -> confidence (N,) in [0, 1]`` under ``name``.

    ``fn`` gets the logits in the array type the policy's caller holds (torch tensors from torch
    heads, numpy arrays at the runtime) and may return either type.

    Args:
        name: registry key.
        overwrite: replace an existing entry instead of raising.

    Raises:
        ExitError: ``name`` is already registered (and ``overwrite`` is false) or empty.
    """
    return _CONFIDENCES.register(name, overwrite=overwrite)


def list_confidences() -> list[str]:
    """Names accepted by :func:`get_confidence`, sorted."""
    return _CONFIDENCES.names()


def get_confidence(name: str | ConfidenceFn) -> ConfidenceFn:
    """A confidence measure by name (or a callable, returned as is).

    Args:
        name: a registered name (:func:`list_confidences`), or a callable from logits
            ``(N, C)`` to confidences ``(N,)`` in [0, 1].

    Raises:
        ExitError: unknown name; the message lists the registered ones.

    Examples:
        >>> import numpy as np
        >>> get_confidence("max_prob")(np.array([[0.0, 0.0]])).tolist()
        [0.5]
    """
    return _CONFIDENCES.get(name)


def _exp32(a: np.ndarray) -> np.ndarray:
    # float64 then rounded: one value on every platform (see the module's Numerics)
    return np.exp(a, dtype=np.float64).astype(np.float32)


def _log32(a: np.ndarray) -> np.ndarray:
    return np.log(a, dtype=np.float64).astype(np.float32)


@register_confidence("max_prob")
def max_prob(logits: Array) -> Array:
    """Top-1 softmax probability (SPINN's confidence), float32, in the type of ``logits``.

    Examples:
        >>> import numpy as np
        >>> max_prob(np.array([[0.0, 0.0], [2.0, 0.0]])).tolist()
        [0.5, 0.8807970285415649]
    """
    z = np.asarray(to_numpy(logits), dtype=np.float32)
    # the top class's exp(0) is exactly 1, so its probability is 1 / sum, as torch's softmax
    # computes it (e * (1 / sum))
    top = np.float32(1.0) / _exp32(z - z.max(axis=-1, keepdims=True)).sum(axis=-1)
    return like(logits, np.asarray(top))


@register_confidence("entropy")
def entropy_confidence(logits: Array) -> Array:
    """``1 + (1/log C) * sum_c y_c log y_c``: 1 for a one-hot softmax, 0 for a uniform one (FlexDNN).

    Float32, in the type of ``logits``. A class whose probability underflows to 0 adds
    ``0 * log y_c = 0`` (``log y_c`` is taken from the log-softmax, so it stays finite).

    Raises:
        ExitError: fewer than 2 classes.

    Examples:
        >>> import numpy as np
        >>> entropy_confidence(np.array([[0.0, 0.0, 0.0], [100.0, 0.0, 0.0]])).tolist()
        [0.0, 1.0]
    """
    z = np.asarray(to_numpy(logits), dtype=np.float32)
    num_classes = z.shape[-1]
    if num_classes < 2:
        raise ExitError(
            f"the `entropy` confidence needs at least 2 classes, got logits of shape {tuple(z.shape)}"
        )
    shifted = z - z.max(axis=-1, keepdims=True)
    logp = shifted - _log32(_exp32(shifted).sum(axis=-1, keepdims=True))  # torch's log_softmax
    neg_entropy = (_exp32(logp) * logp).sum(axis=-1)
    conf = np.clip(np.float32(1.0) + neg_entropy / np.float32(math.log(num_classes)), 0.0, 1.0)
    return like(logits, np.asarray(conf, dtype=np.float32))


#: The measures that compute on numpy whatever array type they get.
_ON_NUMPY = (max_prob, entropy_confidence)


def check_thresholds(thresholds: float | Sequence[float], num_early: int) -> list[float]:
    """One threshold per early exit, validated: a number in [0, 1] or a sequence of ``num_early``.

    Args:
        thresholds: one confidence threshold in [0, 1] for every early exit, or a sequence of
            ``num_early`` of them (a numpy array or torch tensor counts as a sequence, a 0-d one
            as a single number).
        num_early: the number of early exits (the final exit has no threshold).

    Returns:
        ``num_early`` floats.

    Raises:
        ExitError: a threshold outside [0, 1] (or not a number), or the wrong count.

    Examples:
        >>> check_thresholds(0.5, 2)
        [0.5, 0.5]
    """
    if isinstance(thresholds, numbers.Real) and not isinstance(thresholds, bool):
        values = [float(thresholds)] * num_early
    elif isinstance(thresholds, np.ndarray) or is_torch(thresholds):
        array = to_numpy(thresholds)
        values = [float(t) for t in array.ravel()]
        if array.ndim == 0:
            values = values * num_early
    else:
        values = list(thresholds)
    if len(values) != num_early:
        raise ExitError(
            f"`thresholds` needs one value per early exit ({num_early}), got {len(values)}: {values!r}. "
            f"HINT: pass a single number to use it at every early exit"
        )
    for i, t in enumerate(values):
        if isinstance(t, bool) or not isinstance(t, numbers.Real) or not 0.0 <= float(t) <= 1.0:
            raise ExitError(
                f"`thresholds[{i}]` must be a number in [0, 1], got {t!r}. "
                f"HINT: confidences lie in [0, 1]; 1 never exits early, 0 always does"
            )
    return [float(t) for t in values]


def _check_fallback(fallback: str) -> None:
    if fallback not in FALLBACKS:
        raise ExitError(f"`fallback` must be one of {', '.join(FALLBACKS)}, got {fallback!r}")


@dataclass(frozen=True)
class ExitResult:
    """The policy's answer for a batch, in the caller's array type (numpy, or torch tensors).

    Attributes:
        logits: ``(N, C)`` logits of the exit that answered each sample.
        exit_index: ``(N,)`` int64 exit where computation stopped (the last exit ``K - 1`` for
            samples that passed no threshold); this is what the sample cost.
        answer_index: ``(N,)`` int64 exit whose logits answered (differs from ``exit_index`` only
            for the ``most_confident`` fallback).
        confidence: ``(N,)`` float32 confidence of the answering exit.
    """

    logits: Array
    exit_index: Array
    answer_index: Array
    confidence: Array

    def mean_cost(self, exit_costs: Sequence[float]) -> float:
        """Mean cost per sample (e.g. MACs) when stopping at exit ``k`` costs ``exit_costs[k]``."""
        index = to_numpy(self.exit_index)
        return float(np.asarray(list(exit_costs), dtype=np.float64)[index].mean()) if index.size else 0.0


def decide(
    confidences: Array, thresholds: float | Sequence[float], fallback: str = "most_confident"
) -> tuple[Array, Array]:
    """The exit policy on precomputed confidences.

    Args:
        confidences: ``(K, N)``, one row per exit, the last row the final exit. The thresholds
            are compared in its dtype.
        thresholds: one per early exit (``K - 1``), or one number for all.
        fallback: ``most_confident`` (SPINN) or ``final``.

    Returns:
        ``(exit_index, answer_index)``, both ``(N,)`` int64, in the type of ``confidences``.

    Raises:
        ExitError: a bad threshold or fallback.

    Examples:
        >>> import numpy as np
        >>> conf = np.array([[0.95, 0.5, 0.6], [0.7, 0.8, 0.4]], dtype=np.float32)
        >>> [a.tolist() for a in decide(conf, 0.9)]
        [[0, 1, 1], [0, 1, 0]]
    """
    _check_fallback(fallback)
    conf = to_numpy(confidences)
    num_exits, n = conf.shape[0], conf.shape[1]
    thr = check_thresholds(thresholds, num_exits - 1)
    last = np.full(n, num_exits - 1, dtype=np.int64)
    if num_exits > 1:
        passes = conf[:-1] > np.asarray(thr, dtype=conf.dtype)[:, None]
        any_pass = passes.any(axis=0)
        exit_index = np.where(any_pass, passes.argmax(axis=0), last)  # argmax: the first True
    else:
        any_pass, exit_index = np.zeros(n, dtype=bool), last
    best = conf.argmax(axis=0) if fallback == "most_confident" else last  # ties: the earliest exit
    answer_index = np.where(any_pass, exit_index, best)
    return like(confidences, (exit_index.astype(np.int64), answer_index.astype(np.int64)))


def apply_policy(
    logits: Array | Sequence[Array],
    thresholds: float | Sequence[float],
    confidence: str | ConfidenceFn = "max_prob",
    fallback: str = "most_confident",
) -> ExitResult:
    """The exit policy given every exit's logits (all exits already computed).

    Args:
        logits: ``(K, N, C)`` array or a sequence of ``K`` ``(N, C)`` arrays, final exit last
            (numpy, or torch tensors: the result comes back in the same type).
        thresholds: one per early exit, or one number for all.
        confidence: a name from :func:`list_confidences` or a callable.
        fallback: ``most_confident`` or ``final``.

    Raises:
        ExitError: unknown confidence, a bad threshold or fallback.

    Examples:
        >>> import numpy as np
        >>> out = apply_policy([np.array([[3.0, 0.0]]), np.array([[0.0, 1.0]])], thresholds=0.9)
        >>> out.exit_index.tolist(), out.logits.tolist()
        ([0], [[3.0, 0.0]])
    """
    conf_fn = get_confidence(confidence)
    exits = list(logits)
    whole = isinstance(logits, np.ndarray) or is_torch(logits)
    stacked = to_numpy(logits) if whole else np.stack([to_numpy(z) for z in exits])
    conf = np.stack([_confidence(conf_fn, z, z_np) for z, z_np in zip(exits, stacked)])
    exit_index, answer_index = decide(conf, thresholds, fallback)
    cols = np.arange(stacked.shape[1])
    return ExitResult(*like(logits if whole else exits[0], (
        stacked[answer_index, cols], exit_index, answer_index, conf[answer_index, cols])))


def early_exit(
    stages: Sequence[Callable[..., State]],
    heads: Sequence[Callable[[State], Array]],
    x: Array | State,
    thresholds: float | Sequence[float],
    confidence: str | ConfidenceFn = "max_prob",
    fallback: str = "most_confident",
) -> ExitResult:
    """Batched early exit: samples that exit leave the batch; the rest run the next stage.

    The stages and heads get arrays of the type ``x`` has (torch modules take tensors, and run
    under ``torch.no_grad()``; onnxruntime sessions take numpy arrays) and the samples that stay
    are selected in that type, on its device. The policy runs on numpy; the result comes back in
    the type of ``x``.

    Args:
        stages: ``K`` callables; stage ``k`` takes the arrays stage ``k - 1`` returned (the input
            batch for stage 0) as positional arguments and returns an array or a tuple of arrays
            whose first dimension is the batch.
        heads: ``K`` callables; head ``k`` maps stage ``k``'s output tuple to logits ``(n, C)``.
            The last is the final exit.
        x: the input batch (or a tuple of arrays for stage 0).
        thresholds: one per early exit (``K - 1``), or one number for all.
        confidence: a name from :func:`list_confidences` or a callable.
        fallback: ``most_confident`` or ``final``.

    Returns:
        an :class:`ExitResult` equal to :func:`apply_policy` on all exits' logits, and to running
        each sample alone.

    Raises:
        ExitError: ``stages`` and ``heads`` differ in length, a bad threshold or fallback.

    Examples:
        >>> import numpy as np
        >>> stages = [lambda a: a * 2, lambda a: a + 1]
        >>> heads = [lambda s: s[0], lambda s: s[0]]
        >>> out = early_exit(stages, heads, np.array([[3.0, 0.0], [0.0, 0.1]]), thresholds=0.9)
        >>> out.exit_index.tolist(), out.logits.tolist()
        ([0, 1], [[6.0, 0.0], [1.0, 1.2]])
    """
    if len(stages) != len(heads) or not stages:
        raise ExitError(
            f"`stages` and `heads` must be non-empty and of equal length, got {len(stages)} and {len(heads)}"
        )
    _check_fallback(fallback)
    thr = check_thresholds(thresholds, len(stages) - 1)
    conf_fn = get_confidence(confidence)
    state: State = tuple(x) if isinstance(x, (tuple, list)) else (x,)
    with _no_grad():
        if state[0].shape[0] == 1:
            return _early_exit_one(stages, heads, state, thr, conf_fn, fallback)
        return _early_exit_batch(stages, heads, state, thr, conf_fn, fallback)


def _no_grad() -> AbstractContextManager[Any]:
    """torch's no-grad mode when torch is loaded (the stages may be torch modules), else nothing."""
    torch = sys.modules.get("torch")
    return torch.no_grad() if torch is not None else nullcontext()


def _cut(threshold: float, conf: np.ndarray) -> float:
    """``threshold`` rounded to the confidence's dtype, as :func:`decide` compares it."""
    return float(np.asarray(threshold, dtype=conf.dtype))


def _confidence(conf_fn: ConfidenceFn, logits: Array, logits_np: np.ndarray) -> np.ndarray:
    """``conf_fn`` of ``logits`` in numpy: a registered measure gets the caller's type; the built-in
    ones compute on numpy whatever they get, so they get the numpy view (no round trip via torch)."""
    return to_numpy(conf_fn(logits_np if conf_fn in _ON_NUMPY else logits))


def _run_exit(stage, head, state: State, conf_fn: ConfidenceFn) -> tuple[State, np.ndarray, np.ndarray]:
    """One stage (in the caller's array type), its head; the logits and confidence in numpy."""
    state = stage(*state)
    if not isinstance(state, (tuple, list)):
        state = (state,)
    logits = head(state)
    logits_np = to_numpy(logits)
    return state, logits_np, _confidence(conf_fn, logits, logits_np)


def _result(ref: Array, logits, exit_index, answer_index, conf) -> ExitResult:
    return ExitResult(*like(ref, (logits, exit_index, answer_index, conf.astype(np.float32, copy=False))))


def _early_exit_batch(stages, heads, state: State, thr: list[float], conf_fn: ConfidenceFn,
                      fallback: str) -> ExitResult:
    ref, n, num_exits = state[0], state[0].shape[0], len(stages)
    active = np.arange(n)
    exit_index = np.full(n, num_exits - 1, dtype=np.int64)
    answer_index = exit_index.copy()
    out_conf = np.zeros(n, dtype=np.float32)
    out_logits: np.ndarray | None = None
    best_conf = best_logits = best_k = None  # per still-active sample, for the fallback

    for k in range(num_exits):
        state, logits, conf = _run_exit(stages[k], heads[k], state, conf_fn)
        if out_logits is None:
            out_logits = np.zeros((n, logits.shape[-1]), dtype=logits.dtype)
        if best_conf is None:
            best_conf, best_logits, best_k = conf, logits, np.zeros(len(active), dtype=np.int64)
        else:
            # strict: ties keep the earlier exit, as argmax does in `decide`
            better = conf > best_conf
            best_conf = np.where(better, conf, best_conf)
            best_logits = np.where(better[:, None], logits, best_logits)
            best_k = np.where(better, k, best_k)
        if k == num_exits - 1:
            break
        leave = conf > _cut(thr[k], conf)
        if leave.any():
            idx = active[leave]
            exit_index[idx] = answer_index[idx] = k
            out_logits[idx] = logits[leave]
            out_conf[idx] = conf[leave]
            stay = ~leave
            active = active[stay]
            if active.size == 0:
                return _result(ref, out_logits, exit_index, answer_index, out_conf)
            # the stages' own arrays: a numpy mask for numpy, the same mask as a tensor on the
            # tensor's device for torch
            state = tuple(t[like(t, stay)] for t in state)
            best_conf, best_logits, best_k = best_conf[stay], best_logits[stay], best_k[stay]

    # the samples still active reached the final exit
    if fallback == "most_confident":
        out_logits[active], out_conf[active], answer_index[active] = best_logits, best_conf, best_k
    else:
        out_logits[active], out_conf[active] = logits, conf
    return _result(ref, out_logits, exit_index, answer_index, out_conf)


def _early_exit_one(stages, heads, state: State, thr: list[float], conf_fn: ConfidenceFn, fallback: str) -> ExitResult:
    """:func:`early_exit` for a batch of one, the way a device serves frames: the same policy on
    Python scalars, without the batched bookkeeping (about ten small array operations per exit,
    which on a small CNN served by onnxruntime cost more than the stages themselves). Thresholds
    are compared in the confidence's dtype, as the batched path and :func:`decide` compare them."""
    ref, num_exits = state[0], len(stages)
    best: tuple[float, np.ndarray, int, np.ndarray] | None = None
    for k in range(num_exits):
        state, logits, conf = _run_exit(stages[k], heads[k], state, conf_fn)
        c = float(conf[0])
        if best is None or c > best[0]:  # strict: ties keep the earlier exit
            best = (c, logits, k, conf)
        if k < num_exits - 1 and c > _cut(thr[k], conf):
            index = np.array([k], dtype=np.int64)
            return _result(ref, logits, index, index.copy(), conf)
    _, answer_logits, answer, answer_conf = best if fallback == "most_confident" else (None, logits, num_exits - 1, conf)
    return _result(ref, answer_logits, np.array([num_exits - 1], dtype=np.int64),
                   np.array([answer], dtype=np.int64), answer_conf)
