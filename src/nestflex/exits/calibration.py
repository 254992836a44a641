"""Calibration and profile of a multi-exit network on a held-out split.

Every exit's logits are computed once (:func:`collect_logits`); everything else is arithmetic on
them with the same policy the runtime runs (:func:`nestflex.deploy.exits.decide`):

* per exit: accuracy of its own prediction on every sample, its MACs per sample;
* per threshold of the sweep (one threshold at every early exit, SPINN's ``thr_conf``): accuracy,
  mean MACs per sample (absolute and as a fraction of the backbone alone), and per exit the exit
  rate and the accuracy of the samples that stopped there;
* **lossless thresholds** (FlexDNN): per early exit, the lowest threshold at which the samples
  that exit there are answered at least as accurately as the final exit would answer them. They
  are fitted and evaluated for the policy whose remaining samples are answered by the final exit
  (``fallback="final"``, FlexDNN's): only then is "no loss vs the final exit" reachable. With
  SPINN's most-confident fallback an over-confident early exit can lose accuracy even at
  threshold 1, which the sweep (run with the policy's own fallback) shows.
  Chosen exit by exit (later exits see only the samples earlier ones did not take), and by
  ``folds``-fold cross-validation: thresholds are fitted on the other folds and scored on the
  held-out one; the reported thresholds are the per-exit maximum over the folds' fits (the most
  conservative value that was lossless on every fit);
* the **overthinking rate** (SDN): samples some early exit gets right but the final exit gets
  wrong.

:func:`calibrate` does all of it and returns a JSON-ready dict (schema: docs/exits.md).

Examples:
    >>> import torch
    >>> g = torch.Generator().manual_seed(0)
    >>> labels = torch.randint(0, 10, (200,), generator=g)
    >>> logits = torch.randn(3, 200, 10, generator=g) + 3 * torch.nn.functional.one_hot(labels, 10)
    >>> report = exit_profile(logits, labels, exit_macs=[10, 30, 100], backbone_macs=100)
    >>> report["sweep"][0]["threshold"], report["sweep"][0]["exit_rate"]  # everybody exits first
    (0.0, [1.0, 0.0, 0.0])
    >>> report["sweep"][-1]["threshold"], report["sweep"][-1]["mean_macs_fraction"]  # nobody does
    (1.0, 1.0)
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

import math
import warnings

import torch

from nestflex.deploy.exits import ConfidenceFn, ExitError, check_thresholds, decide, get_confidence

__all__ = [
    "SCHEMA_VERSION",
    "DEFAULT_THRESHOLDS",
    "collect_logits",
    "evaluate_thresholds",
    "fit_lossless_thresholds",
    "lossless_thresholds",
    "loss_bound",
    "samples_needed",
    "exit_profile",
    "calibrate",
]

SCHEMA_VERSION = 1
#: The sweep: one threshold at every early exit, 0 to 0.95 in steps of 0.05, then a fine tail
#: because confidences bunch up near 1.
_TAIL = (0.97, 0.98, 0.99, 0.995, 0.999, 1.0)
DEFAULT_THRESHOLDS: tuple[float, ...] = tuple(round(0.05 * i, 2) for i in range(20)) + _TAIL
#: Candidates for the lossless thresholds.
_GRID = torch.cat(
    [
        torch.linspace(0, 1, 201, dtype=torch.float64),
        torch.tensor([0.999, 0.9995, 0.9999], dtype=torch.float64),
    ]
)
LOSSLESS_GRID: tuple[float, ...] = tuple(sorted(set(round(float(v), 6) for v in _GRID)))


@torch.no_grad()
def collect_logits(
    model: torch.nn.Module, batches: Iterable, max_samples: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Every exit's logits on up to ``max_samples`` samples, in eval mode (restored afterwards).

    Args:
        model: returns a list of per-exit logits (a :class:`~nestflex.exits.MultiExitNetwork`).
        batches: iterable of ``(images, labels, ...)``.
        max_samples: stop after this many samples (``None``: all).

    Returns:
        ``(logits (K, N, C), labels (N,))`` on the CPU.

    Raises:
        ExitError: ``batches`` yields nothing, or ``max_samples`` < 1.
    """
    if max_samples is not None and (not isinstance(max_samples, int) or max_samples < 1):
        raise ExitError(f"`max_samples` must be a positive int or None, got {max_samples!r}")
    was_training = model.training
    model.eval()
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    outs, ys, n = [], [], 0
    try:
        for batch in batches:
            x, y = batch[0], batch[1]
            outs.append(torch.stack([z.float().cpu() for z in model(x.to(device))]))
            ys.append(y.cpu())
            n += x.shape[0]
            if max_samples is not None and n >= max_samples:
                break
    finally:
        model.train(was_training)
    if not outs:
        raise ExitError("`batches` yielded no data. HINT: pass a validation DataLoader after `setup()`")
    logits, labels = torch.cat(outs, dim=1), torch.cat(ys)
    if max_samples is not None:
        logits, labels = logits[:, :max_samples], labels[:max_samples]
    return logits, labels


def _confidences(logits: torch.Tensor, confidence: str | ConfidenceFn) -> torch.Tensor:
    fn = get_confidence(confidence)
    return torch.stack([fn(z) for z in logits])


def _check_inputs(logits: torch.Tensor, labels: torch.Tensor, exit_macs: Sequence[float] | None) -> None:
    if logits.ndim != 3 or labels.ndim != 1 or logits.shape[1] != labels.shape[0] or labels.numel() == 0:
        raise ExitError(
            f"expected logits (K, N, C) and labels (N,) with N >= 1, got {tuple(logits.shape)} and {tuple(labels.shape)}"
        )
    if exit_macs is not None and len(exit_macs) != logits.shape[0]:
        raise ExitError(f"`exit_macs` needs one value per exit ({logits.shape[0]}), got {len(exit_macs)}")


def _evaluate(conf, correct, thresholds, exit_macs, backbone_macs, fallback) -> dict[str, Any]:
    exit_index, answer_index = decide(conf, thresholds, fallback)
    cols = torch.arange(conf.shape[1])
    right = correct[answer_index, cols]
    k_exits = conf.shape[0]
    counts = torch.bincount(exit_index, minlength=k_exits)
    right_per = torch.bincount(exit_index, weights=right.double(), minlength=k_exits)
    macs = torch.as_tensor(list(exit_macs), dtype=torch.float64)[exit_index].mean().item()
    return {
        "accuracy": right.double().mean().item(),
        "mean_macs": macs,
        "mean_macs_fraction": macs / backbone_macs,
        "exit_rate": (counts.double() / conf.shape[1]).tolist(),
        "exit_accuracy": [(r / c).item() if c else None for r, c in zip(right_per, counts)],
    }


def evaluate_thresholds(
    logits: torch.Tensor,
    labels: torch.Tensor,
    thresholds: float | Sequence[float],
    exit_macs: Sequence[float],
    backbone_macs: float,
    confidence: str | ConfidenceFn = "max_prob",
    fallback: str = "most_confident",
) -> dict[str, Any]:
    """Accuracy, mean MACs and per-exit rates of the exit policy at the given thresholds.

    Args:
        logits: ``(K, N, C)`` logits of every exit, final last (:func:`collect_logits`).
        labels: ``(N,)`` class indices.
        thresholds: one per early exit, or one for all.
        exit_macs: MACs per sample of stopping at each exit (``MultiExitNetwork.exit_macs``).
        backbone_macs: MACs per sample of the backbone alone (the reference for fractions).
        confidence: a registered confidence measure or a function of the logits.
        fallback: ``most_confident`` or ``final``: who answers a sample that passes no threshold.

    Returns:
        ``{"accuracy", "mean_macs", "mean_macs_fraction", "exit_rate": [K], "exit_accuracy": [K]}``;
        ``exit_accuracy[k]`` is ``None`` when no sample stopped at exit ``k``.

    Raises:
        ExitError: shapes that do not match, a threshold outside [0, 1], an unknown confidence or
            fallback.
    """
    _check_inputs(logits, labels, exit_macs)
    conf = _confidences(logits, confidence)
    correct = logits.argmax(-1) == labels[None]
    return _evaluate(conf, correct, thresholds, exit_macs, backbone_macs, fallback)


def fit_lossless_thresholds(
    conf: torch.Tensor, correct: torch.Tensor, grid: Sequence[float] = LOSSLESS_GRID
) -> list[float]:
    """Lowest lossless threshold per early exit on one set of samples.

    Exit ``k``'s threshold is the lowest ``t`` in ``grid`` such that, for ``t`` and every larger
    grid value, the samples still running at exit ``k`` whose confidence exceeds the value are
    answered correctly by exit ``k`` at least as often as by the final exit.

    Args:
        conf: ``(K, N)`` confidences, final exit last.
        correct: ``(K, N)`` bool, whether each exit's prediction is right.
        grid: candidate thresholds in [0, 1].
    """
    grid_t = torch.tensor(sorted(set(float(g) for g in grid) | {1.0}), dtype=conf.dtype)
    check_thresholds(grid_t.tolist(), len(grid_t))
    remaining = torch.ones(conf.shape[1], dtype=torch.bool)
    final_right = correct[-1].long()
    thresholds = []
    for k in range(conf.shape[0] - 1):
        sel = remaining[None] & (conf[k][None] > grid_t[:, None])  # (G, N)
        gain = (sel.long() * (correct[k].long() - final_right)[None]).sum(dim=1)  # exit k right - final right
        ok = gain >= 0
        # lowest t such that every t' >= t is lossless: scan the suffix
        suffix_ok = torch.flip(torch.cummin(torch.flip(ok.long(), [0]), 0).values, [0]).bool()
        t = round(float(grid_t[suffix_ok.nonzero()[0, 0]]), 6)  # the float32 value, printable
        thresholds.append(t)
        remaining &= ~(conf[k] > t)
    return thresholds


def _binom_cdf(k: int, n: int, p: float) -> float:
    """P(X <= k) for X ~ Binomial(n, p), summed in log space (n may be large)."""
    if p <= 0.0:
        return 1.0
    if p >= 1.0:
        return 0.0 if k < n else 1.0
    lp, lq, lgn = math.log(p), math.log1p(-p), math.lgamma(n + 1)
    return min(1.0, sum(math.exp(lgn - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * lp + (n - i) * lq)
                        for i in range(k + 1)))


def _upper(k: int, n: int, alpha: float) -> float:
    """One-sided Clopper-Pearson upper bound (level ``1 - alpha``) of a rate seen as ``k`` in ``n``."""
    if n <= 0 or k >= n:
        return 1.0
    lo, hi = k / n, 1.0
    for _ in range(60):  # bisection: the CDF falls as p grows
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _binom_cdf(k, n, mid) > alpha else (lo, mid)
    return hi


def loss_bound(harm: int, rescued: int, n: int, confidence: float = 0.95) -> float:
    """Upper bound of the accuracy an exit policy loses against the final exit, from ``n`` samples.

    ``harm``: samples the final exit gets right and the policy wrong; ``rescued``: the reverse.
    The loss is ``P(discordant) * (2q - 1)`` with ``q`` the share of harm among discordant
    samples; each factor gets an exact (Clopper-Pearson) bound at half the error rate, so the
    product holds with ``confidence``. With no discordant sample it is the rule of three: the
    fewer the samples, the less a "lossless" calibration says.

    Examples:
        >>> round(loss_bound(0, 0, 180), 4), round(loss_bound(0, 0, 400), 4)  # 180 clean samples: up to 2%
        (0.0203, 0.0092)
        >>> round(loss_bound(771, 780, 5000), 4)  # exits that disagree both ways often: the net is uncertain
        0.0144
    """
    if n <= 0:
        return 1.0
    alpha = (1.0 - confidence) / 2
    discordant = harm + rescued
    q = _upper(harm, discordant, alpha) if discordant else 1.0
    return max(0.0, 2 * q - 1) * _upper(discordant, n, alpha)


def samples_needed(harm_rate: float = 0.0, rescue_rate: float = 0.0, tolerance: float = 0.01,
                   confidence: float = 0.95) -> int | None:
    """Fewest samples whose :func:`loss_bound` stays within ``tolerance`` at these rates of harm
    and rescue; ``None`` when no number does (the policy loses ``tolerance`` or more outright).

    Examples:
        >>> samples_needed(), samples_needed(tolerance=0.02)  # exits that never disagree with the final one
        (368, 183)
    """
    if harm_rate - rescue_rate >= tolerance:
        return None

    def ok(n: int) -> bool:
        return loss_bound(round(harm_rate * n), round(rescue_rate * n), n, confidence) <= tolerance

    hi = 16
    while not ok(hi):
        hi *= 2
        if hi > 1 << 26:
            return None
    lo = hi // 2
    while hi - lo > 1:  # ok() is monotone in n up to rounding: the smallest n that passes
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if ok(mid) else (mid, hi)
    return hi


def lossless_thresholds(
    logits: torch.Tensor,
    labels: torch.Tensor,
    exit_macs: Sequence[float],
    backbone_macs: float,
    confidence: str | ConfidenceFn = "max_prob",
    folds: int = 5,
    seed: int = 0,
    grid: Sequence[float] = LOSSLESS_GRID,
    tolerance: float = 0.01,
) -> dict[str, Any]:
    """Per-exit lossless thresholds by ``folds``-fold cross-validation (see the module docstring).

    Everything here runs the policy with ``fallback="final"``: samples that pass no threshold are
    answered by the final exit.

    A lossless claim is only as good as the number of samples behind it: ``guard`` counts, on the
    held-out folds, the samples whose right answer the early exits turned wrong (``harm``) and the
    reverse (``rescued``), and bounds the accuracy lost on new data (:func:`loss_bound`, 95%); when
    the bound exceeds ``tolerance`` (default one point) a ``UserWarning`` says how many samples the
    claim would need at the same rates (:func:`samples_needed`).

    Args:
        logits: ``(K, N, C)`` logits of every exit, final last (:func:`collect_logits`).
        labels: ``(N,)`` class indices.
        exit_macs: MACs per sample of stopping at each exit (``MultiExitNetwork.exit_macs``).
        backbone_macs: MACs per sample of the backbone alone.
        confidence: a registered confidence measure or a function of the logits.
        folds: cross-validation folds (at least 2, at most the number of samples).
        seed: seed of the fold assignment.
        grid: the threshold values tried at every exit.
        tolerance: the accuracy loss on new data (95% bound) above which a warning says the
            claim needs more samples.

    Returns:
        ``{"thresholds", "fallback", "folds", "seed", "grid_size", "cv": [per fold],
        "cv_accuracy_delta_mean", "accuracy", "final_accuracy", "mean_macs_fraction",
        "exit_rate", "guard"}``; ``accuracy`` to ``exit_rate`` measure the chosen thresholds on all
        the samples given; ``guard`` is ``{"samples", "harm", "rescued", "loss_bound",
        "confidence", "tolerance", "supported", "samples_needed"}``.

    Raises:
        ExitError: ``folds`` < 2 or more folds than samples.
    """
    _check_inputs(logits, labels, exit_macs)
    n = labels.shape[0]
    if isinstance(folds, bool) or not isinstance(folds, int) or not 2 <= folds <= n:
        raise ExitError(f"`folds` must be an int in [2, {n}] (the number of samples), got {folds!r}")
    conf = _confidences(logits, confidence)
    correct = logits.argmax(-1) == labels[None]
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    parts = torch.tensor_split(perm, folds)
    cv, fits, harm, rescued = [], [], 0, 0
    for f, held in enumerate(parts):
        fit_idx = torch.cat([p for i, p in enumerate(parts) if i != f])
        thr = fit_lossless_thresholds(conf[:, fit_idx], correct[:, fit_idx], grid)
        fits.append(thr)
        row = _evaluate(conf[:, held], correct[:, held], thr, exit_macs, backbone_macs, "final")
        _, answer = decide(conf[:, held], thr, "final")
        policy = correct[answer, held]
        harm += int((correct[-1, held] & ~policy).sum())
        rescued += int((policy & ~correct[-1, held]).sum())
        final = correct[-1, held].double().mean().item()
        cv.append(
            {
                "fold": f,
                "samples": int(held.numel()),
                "thresholds": thr,
                "accuracy": row["accuracy"],
                "final_accuracy": final,
                "mean_macs_fraction": row["mean_macs_fraction"],
            }
        )
    chosen = [max(col) for col in zip(*fits)] if fits and fits[0] else []
    overall = _evaluate(conf, correct, chosen, exit_macs, backbone_macs, "final")
    bound = loss_bound(harm, rescued, n)
    needed = samples_needed(harm / n, rescued / n, tolerance)
    guard = {"samples": n, "harm": harm, "rescued": rescued, "loss_bound": round(bound, 6), "confidence": 0.95,
             "tolerance": tolerance, "supported": bound <= tolerance, "samples_needed": needed}
    if not guard["supported"]:
        fix = (f"calibrate on at least {needed:,} samples for a lossless claim within {tolerance:.0%} at these rates"
               if needed else "the exits lose accuracy outright at these thresholds: raise them")
        warnings.warn(
            f"lossless thresholds fitted on {n} samples: on held-out folds the early exits turned {harm} right answers "
            f"wrong and {rescued} wrong answers right, so on new data they may lose up to {bound:.1%} accuracy (95% "
            f"bound), more than {tolerance:.0%}. HINT: {fix}", UserWarning, stacklevel=2)
    return {
        "thresholds": chosen,
        "fallback": "final",
        "folds": folds,
        "seed": seed,
        "grid_size": len(grid),
        "cv": cv,
        "cv_accuracy_delta_mean": sum(r["accuracy"] - r["final_accuracy"] for r in cv) / len(cv),
        "accuracy": overall["accuracy"],
        "final_accuracy": correct[-1].double().mean().item(),
        "mean_macs_fraction": overall["mean_macs_fraction"],
        "exit_rate": overall["exit_rate"],
        "guard": guard,
    }


def exit_profile(
    logits: torch.Tensor,
    labels: torch.Tensor,
    exit_macs: Sequence[float],
    backbone_macs: float,
    exit_names: Sequence[str] | None = None,
    positions: Sequence[float] | None = None,
    thresholds: Sequence[float] = DEFAULT_THRESHOLDS,
    confidence: str | ConfidenceFn = "max_prob",
    fallback: str = "most_confident",
    at_thresholds: Sequence[float] | None = None,
    at_fallback: str = "final",
) -> dict[str, Any]:
    """Per-exit accuracy, the threshold sweep and the overthinking rate (no fitting).

    Args:
        logits: ``(K, N, C)`` logits of every exit, final last (:func:`collect_logits`).
        labels: ``(N,)`` class indices.
        exit_macs: MACs per sample of stopping at each exit (``MultiExitNetwork.exit_macs``).
        backbone_macs: MACs per sample of the backbone alone (the reference for fractions).
        exit_names: names of the exits, final last, for the report (default ``exit0``, ...).
        positions: tap MACs fractions of the early exits, for the report.
        thresholds: the sweep; each value is used at every early exit.
        confidence: the policy's confidence measure (:mod:`nestflex.deploy.exits`).
        fallback: the policy's fallback for the sweep (``most_confident`` or ``final``).
        at_thresholds: also evaluate these per-exit thresholds (e.g. lossless ones fitted on the
            validation split, applied to the test split); reported under ``"at_thresholds"``.
        at_fallback: the fallback for ``at_thresholds`` (``final``, as lossless thresholds assume).

    Returns:
        ``{"schema_version", "samples", "num_classes", "confidence", "fallback", "backbone_macs",
        "exits": [per exit: index, name, position, macs, macs_fraction, accuracy],
        "final_accuracy", "oracle_accuracy", "overthinking_rate", "sweep": [per threshold:
        :func:`evaluate_thresholds`' keys and ``threshold``]}``, plus ``"at_thresholds"`` when
        they are given.

    Raises:
        ExitError: shapes that do not match, a threshold outside [0, 1], unknown confidence.
    """
    _check_inputs(logits, labels, exit_macs)
    k_exits = logits.shape[0]
    sweep_values = check_thresholds(list(thresholds), len(thresholds))
    conf = _confidences(logits, confidence)
    correct = logits.argmax(-1) == labels[None]
    names = (
        list(exit_names) if exit_names is not None else [f"exit{k}" for k in range(k_exits - 1)] + ["final"]
    )
    pos = list(positions) if positions is not None else [None] * (k_exits - 1)
    if len(names) != k_exits or len(pos) != k_exits - 1:
        raise ExitError(
            f"`exit_names` needs {k_exits} entries and `positions` {k_exits - 1}, got {len(names)} and {len(pos)}"
        )
    exits = []
    for k in range(k_exits):
        exits.append(
            {
                "index": k,
                "name": names[k],
                "position": pos[k] if k < k_exits - 1 else 1.0,
                "macs": int(exit_macs[k]),
                "macs_fraction": exit_macs[k] / backbone_macs,
                "accuracy": correct[k].double().mean().item(),
            }
        )
    early_right = correct[:-1].any(dim=0) if k_exits > 1 else torch.zeros_like(correct[-1])
    report: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "samples": int(labels.shape[0]),
        "num_classes": int(logits.shape[-1]),
        "confidence": confidence
        if isinstance(confidence, str)
        else getattr(confidence, "__name__", "custom"),
        "fallback": fallback,
        "backbone_macs": int(backbone_macs),
        "exits": exits,
        "final_accuracy": correct[-1].double().mean().item(),
        "oracle_accuracy": correct.any(dim=0).double().mean().item(),
        "overthinking_rate": (early_right & ~correct[-1]).double().mean().item(),
        "sweep": [
            {"threshold": t, **_evaluate(conf, correct, t, exit_macs, backbone_macs, fallback)}
            for t in sweep_values
        ],
    }
    if at_thresholds is not None:
        thr = check_thresholds(list(at_thresholds), k_exits - 1)
        report["at_thresholds"] = {
            "thresholds": thr,
            "fallback": at_fallback,
            **_evaluate(conf, correct, thr, exit_macs, backbone_macs, at_fallback),
        }
    return report


def calibrate(
    model: torch.nn.Module,
    batches: Iterable,
    thresholds: Sequence[float] = DEFAULT_THRESHOLDS,
    confidence: str | ConfidenceFn = "max_prob",
    fallback: str = "most_confident",
    folds: int = 5,
    max_samples: int | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    """Calibrate a :class:`~nestflex.exits.MultiExitNetwork` on a validation split.

    Args:
        model: the multi-exit network (its ``exit_macs``, ``backbone_macs``, ``exit_names`` and
            ``positions`` label the report).
        batches: validation batches ``(images, labels, ...)``; never the test split.
        thresholds: the sweep (one value at every early exit).
        confidence: the confidence measure of the sweep and of the lossless thresholds.
        fallback: the fallback of the sweep; the lossless thresholds always use ``final``
            (the report's ``lossless.fallback``), the only policy under which "no loss against the
            final exit" is reachable.
        folds: cross-validation folds for the lossless thresholds (always ``fallback="final"``).
        max_samples: use at most this many samples.
        seed: seed of the fold assignment.

    Returns:
        :func:`exit_profile`'s report plus ``"lossless"`` (:func:`lossless_thresholds`).

    Raises:
        ExitError: ``model`` is not a multi-exit network, or the checks of :func:`exit_profile`
            and :func:`lossless_thresholds` fail.

    Examples:
        >>> from nestflex.exits import MultiExitNetwork
        >>> from nestflex.models import create_model
        >>> net = MultiExitNetwork(create_model("resnet20", width=0.25), positions=(0.3, 0.6))
        >>> data = [(torch.randn(16, 3, 32, 32), torch.randint(0, 10, (16,)))]
        >>> report = calibrate(net, data, folds=2)
        >>> len(report["lossless"]["thresholds"]), report["samples"]
        (2, 16)
    """
    for arg in ("exit_macs", "backbone_macs", "exit_names", "positions"):
        if not hasattr(model, arg):
            raise ExitError(
                f"`model` must be a MultiExitNetwork (it has no `{arg}`), got {type(model).__name__}"
            )
    logits, labels = collect_logits(model, batches, max_samples)
    report = exit_profile(
        logits,
        labels,
        model.exit_macs,
        model.backbone_macs,
        model.exit_names,
        model.positions,
        thresholds,
        confidence,
        fallback,
    )
    report["lossless"] = lossless_thresholds(
        logits, labels, model.exit_macs, model.backbone_macs, confidence, folds=folds, seed=seed
    )
    return report
