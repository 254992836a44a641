"""Early-exit confidence measures and the exit policy, in plain torch (no training dependency).

One implementation serves both sides: the training side (:mod:`nestflex.exits`) calibrates
thresholds with it, and the runtime runs it.

* **Confidence registry**: ``max_prob`` (top-1 softmax value, SPINN) and ``entropy``
  (``1 + (1/log C) * sum_c y_c log y_c``, one minus the normalised entropy, FlexDNN). Both map
  logits ``(N, C)`` to a confidence in ``[0, 1]`` per sample. Add your own with
  :func:`register_confidence`.
* **Policy** (SPINN): a sample exits at the first *early* exit whose confidence exceeds that
  exit's threshold (strictly: a threshold of 1 never exits, 0 exits unless the confidence is
  exactly 0). A sample that passes no threshold runs to the final exit and is answered, by
  default, by the most confident exit seen (``fallback="most_confident"``; ties go to the
  earliest), or by the final exit (``fallback="final"``).
* :func:`apply_policy` applies the policy to the logits of every exit at once (what calibration
  sweeps use); :func:`early_exit` runs it *batched*: samples that exit leave the batch and only
  the rest go through the next stage. Both give exactly the per-sample answers.

Example:
    >>> import torch
    >>> logits = torch.tensor([[[4.0, 0.0], [0.1, 0.0]],    # exit 0: sample 0 confident
    ...                        [[0.0, 0.2], [0.0, 3.0]]])   # exit 1 (final)
    >>> out = apply_policy(logits, thresholds=0.9)
    >>> out.exit_index.tolist(), out.answer_index.tolist()
    ([0, 1], [0, 1])
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

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

ConfidenceFn = Callable[[torch.Tensor], torch.Tensor]


class ExitError(NestflexError, ValueError):
    """An exit position, head, confidence measure, threshold or policy argument is invalid."""


_CONFIDENCES: Registry[ConfidenceFn] = Registry(
    "confidence measure", ExitError, accepts=callable, register_hint="register your own with `register_confidence(name)`"
)


def register_confidence(name: str, *, overwrite: bool = False) -> Callable[[ConfidenceFn], ConfidenceFn]:
    """Decorator that registers ``fn(logits (N, C)) -> confidence (N,) in [0, 1]`` under ``name``.

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

    Raises:
        ExitError: unknown name; the message lists the registered ones.

    Example:
        >>> import torch
        >>> get_confidence("max_prob")(torch.tensor([[0.0, 0.0]])).tolist()
        [0.5]
    """
    return _CONFIDENCES.get(name)


@register_confidence("max_prob")
def max_prob(logits: torch.Tensor) -> torch.Tensor:
    """Top-1 softmax probability (SPINN's confidence)."""
    return torch.softmax(logits.float(), dim=-1).amax(dim=-1)


@register_confidence("entropy")
def entropy_confidence(logits: torch.Tensor) -> torch.Tensor:
    """``1 + (1/log C) * sum_c y_c log y_c``: 1 for a one-hot softmax, 0 for a uniform one (FlexDNN)."""
    num_classes = logits.shape[-1]
    if num_classes < 2:
        raise ExitError(
            f"the `entropy` confidence needs at least 2 classes, got logits of shape {tuple(logits.shape)}"
        )
    logp = torch.log_softmax(logits.float(), dim=-1)
    neg_entropy = (logp.exp() * logp).sum(dim=-1)
    return (1.0 + neg_entropy / math.log(num_classes)).clamp(0.0, 1.0)


def check_thresholds(thresholds: float | Sequence[float], num_early: int) -> list[float]:
    """One threshold per early exit, validated: a number in [0, 1] or a sequence of ``num_early``.

    Raises:
        ExitError: a threshold outside [0, 1] (or not a number), or the wrong count.
    """
    if isinstance(thresholds, (int, float)) and not isinstance(thresholds, bool):
        values = [float(thresholds)] * num_early
    elif isinstance(thresholds, torch.Tensor):
        values = [float(t) for t in thresholds.flatten()]
        if thresholds.ndim == 0:
            values = values * num_early
    else:
        values = list(thresholds)
    if len(values) != num_early:
        raise ExitError(
            f"`thresholds` needs one value per early exit ({num_early}), got {len(values)}: {values!r}. "
            f"HINT: pass a single number to use it at every early exit"
        )
    for i, t in enumerate(values):
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0.0 <= float(t) <= 1.0:
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
    """The policy's answer for a batch.

    Attributes:
        logits: ``(N, C)`` logits of the exit that answered each sample.
        exit_index: ``(N,)`` exit where computation stopped (the last exit ``K - 1`` for
            samples that passed no threshold); this is what the sample cost.
        answer_index: ``(N,)`` exit whose logits answered (differs from ``exit_index`` only for
            the ``most_confident`` fallback).
        confidence: ``(N,)`` confidence of the answering exit.
    """

    logits: torch.Tensor
    exit_index: torch.Tensor
    answer_index: torch.Tensor
    confidence: torch.Tensor

    def mean_cost(self, exit_costs: Sequence[float]) -> float:
        """Mean cost per sample (e.g. MACs) when stopping at exit ``k`` costs ``exit_costs[k]``."""
        costs = torch.as_tensor(list(exit_costs), dtype=torch.float64)
        return float(costs[self.exit_index.cpu()].mean()) if self.exit_index.numel() else 0.0


def decide(
    confidences: torch.Tensor, thresholds: float | Sequence[float], fallback: str = "most_confident"
) -> tuple[torch.Tensor, torch.Tensor]:
    """The exit policy on precomputed confidences.

    Args:
        confidences: ``(K, N)``, one row per exit, the last row the final exit.
        thresholds: one per early exit (``K - 1``), or one number for all.
        fallback: ``most_confident`` (SPINN) or ``final``.

    Returns:
        ``(exit_index, answer_index)``, both ``(N,)`` long tensors.
    """
    _check_fallback(fallback)
    num_exits = confidences.shape[0]
    thr = check_thresholds(thresholds, num_exits - 1)
    n = confidences.shape[1]
    exit_index = torch.full((n,), num_exits - 1, dtype=torch.long, device=confidences.device)
    if num_exits > 1:
        passes = (
            confidences[:-1] > torch.tensor(thr, dtype=confidences.dtype, device=confidences.device)[:, None]
        )
        any_pass = passes.any(dim=0)
        first = passes.to(torch.uint8).argmax(dim=0)  # argmax gives the first maximal index
        exit_index = torch.where(any_pass, first, exit_index)
    else:
        any_pass = torch.zeros(n, dtype=torch.bool, device=confidences.device)
    if fallback == "most_confident":
        best = confidences.argmax(dim=0)
    else:
        best = torch.full_like(exit_index, num_exits - 1)
    answer_index = torch.where(any_pass, exit_index, best)
    return exit_index, answer_index


def apply_policy(
    logits: torch.Tensor | Sequence[torch.Tensor],
    thresholds: float | Sequence[float],
    confidence: str | ConfidenceFn = "max_prob",
    fallback: str = "most_confident",
) -> ExitResult:
    """The exit policy given every exit's logits (all exits already computed).

    Args:
        logits: ``(K, N, C)`` tensor or a sequence of ``K`` ``(N, C)`` tensors, final exit last.
        thresholds: one per early exit, or one number for all.
        confidence: a name from :func:`list_confidences` or a callable.
        fallback: ``most_confident`` or ``final``.
    """
    stacked = logits if isinstance(logits, torch.Tensor) else torch.stack(list(logits))
    conf_fn = get_confidence(confidence)
    conf = torch.stack([conf_fn(z) for z in stacked])
    exit_index, answer_index = decide(conf, thresholds, fallback)
    cols = torch.arange(stacked.shape[1], device=stacked.device)
    return ExitResult(
        logits=stacked[answer_index, cols],
        exit_index=exit_index,
        answer_index=answer_index,
        confidence=conf[answer_index, cols],
    )


State = tuple[torch.Tensor, ...]


@torch.no_grad()
def early_exit(
    stages: Sequence[Callable[..., State]],
    heads: Sequence[Callable[[State], torch.Tensor]],
    x: torch.Tensor | State,
    thresholds: float | Sequence[float],
    confidence: str | ConfidenceFn = "max_prob",
    fallback: str = "most_confident",
) -> ExitResult:
    """Batched early exit: samples that exit leave the batch; the rest run the next stage.

    Args:
        stages: ``K`` callables; stage ``k`` takes the tensors stage ``k - 1`` returned (the input
            batch for stage 0) as positional arguments and returns a tuple of tensors whose first
            dimension is the batch.
        heads: ``K`` callables; head ``k`` maps stage ``k``'s output tuple to logits ``(n, C)``.
            The last is the final exit.
        x: the input batch (or a tuple of tensors for stage 0).
        thresholds: one per early exit (``K - 1``), or one number for all.
        confidence: a name from :func:`list_confidences` or a callable.
        fallback: ``most_confident`` or ``final``.

    Returns:
        an :class:`ExitResult` equal to :func:`apply_policy` on all exits' logits, and to running
        each sample alone.

    Raises:
        ExitError: ``stages`` and ``heads`` differ in length, a bad threshold or fallback.
    """
    if len(stages) != len(heads) or not stages:
        raise ExitError(
            f"`stages` and `heads` must be non-empty and of equal length, got {len(stages)} and {len(heads)}"
        )
    _check_fallback(fallback)
    num_exits = len(stages)
    thr = check_thresholds(thresholds, num_exits - 1)
    conf_fn = get_confidence(confidence)
    state: State = tuple(x) if isinstance(x, (tuple, list)) else (x,)
    n = state[0].shape[0]
    if n == 1:
        return _early_exit_one(stages, heads, state, thr, conf_fn, fallback)
    device = state[0].device
    active = torch.arange(n, device=device)
    exit_index = torch.full((n,), num_exits - 1, dtype=torch.long, device=device)
    answer_index = torch.full((n,), num_exits - 1, dtype=torch.long, device=device)
    out_conf = torch.zeros(n, device=device)
    out_logits: torch.Tensor | None = None
    best_conf = best_logits = best_k = None  # per still-active sample, for the fallback

    for k in range(num_exits):
        state, logits, conf = _run_exit(stages[k], heads[k], state, conf_fn)
        if out_logits is None:
            out_logits = logits.new_zeros((n, logits.shape[-1]))
        if best_conf is None:
            best_conf, best_logits = conf, logits
            best_k = torch.zeros_like(active)
        else:
            # strict: ties keep the earlier exit, as argmax does in `decide`
            better = conf > best_conf
            best_conf = torch.where(better, conf, best_conf)
            best_logits = torch.where(better[:, None], logits, best_logits)
            best_k = torch.where(better, torch.full_like(best_k, k), best_k)
        if k == num_exits - 1:
            break
        leave = conf > thr[k]
        if leave.any():
            idx = active[leave]
            exit_index[idx] = k
            answer_index[idx] = k
            out_logits[idx] = logits[leave]
            out_conf[idx] = conf[leave]
            stay = ~leave
            active = active[stay]
            if active.numel() == 0:
                return ExitResult(out_logits, exit_index, answer_index, out_conf)
            state = tuple(t[stay] for t in state)
            best_conf, best_logits, best_k = best_conf[stay], best_logits[stay], best_k[stay]

    # the samples still active reached the final exit
    if fallback == "most_confident":
        out_logits[active] = best_logits
        out_conf[active] = best_conf
        answer_index[active] = best_k
    else:
        out_logits[active] = logits
        out_conf[active] = conf
    return ExitResult(out_logits, exit_index, answer_index, out_conf)


def _run_exit(stage, head, state: State, conf_fn: ConfidenceFn) -> tuple[State, torch.Tensor, torch.Tensor]:
    """One stage, its head and the head's confidence."""
    state = stage(*state)
    if isinstance(state, torch.Tensor):
        state = (state,)
    logits = head(state)
    return state, logits, conf_fn(logits)


def _early_exit_one(stages, heads, state: State, thr: list[float], conf_fn: ConfidenceFn, fallback: str) -> ExitResult:
    """:func:`early_exit` for a batch of one, the way a device serves frames: the same policy on
    Python scalars. The batched bookkeeping costs about ten small tensor ops per exit, which on a
    small CNN served by onnxruntime is more than the stages themselves. Thresholds are compared
    in the confidence's dtype, as the batched path and :func:`decide` compare them."""
    num_exits = len(stages)
    best: tuple[float, torch.Tensor, int, torch.Tensor] | None = None
    cut: list[float] | None = None
    for k in range(num_exits):
        state, logits, conf = _run_exit(stages[k], heads[k], state, conf_fn)
        c = float(conf[0])
        if cut is None:
            cut = [float(t) for t in torch.tensor(thr, dtype=conf.dtype)] if thr else []
        if best is None or c > best[0]:  # strict: ties keep the earlier exit
            best = (c, logits, k, conf)
        if k < num_exits - 1 and c > cut[k]:
            index = torch.tensor([k], device=logits.device)
            return ExitResult(logits, index, index.clone(), conf.to(torch.get_default_dtype()))
    _, answer_logits, answer, answer_conf = best if fallback == "most_confident" else (None, logits, num_exits - 1, conf)
    return ExitResult(answer_logits, torch.tensor([num_exits - 1], device=logits.device),
                      torch.tensor([answer], device=logits.device), answer_conf.to(torch.get_default_dtype()))
