"""FlexDNN end to end: rank, search, plan, and emit a standard multi-exit network.

:func:`flexdnn` runs on a trained, frozen backbone:

1. collective ranking of the filters at each candidate location (:mod:`nestflex.pruning.collective`),
   and the minimum filter count for an exit to match the all-filter one;
2. the exit architecture search (:mod:`~nestflex.exits.flexdnn.search`): ``M`` over-parameterised
   fine-grained exits per location, trained with ranked dropout, then pruned while their exit
   rate holds; per location the exit with the lowest standalone mean MACs is kept as candidate;
3. the insertion plan (:mod:`~nestflex.exits.flexdnn.plan`) over those candidates;
4. the result as a :class:`~nestflex.exits.MultiExitNetwork` whose heads are
   :class:`~nestflex.exits.flexdnn.fine_grained.FilterSubsetExit` modules: the same module,
   calibration, policy (:mod:`nestflex.deploy.exits`) and bundle path as progressive exits; plus
   the accuracy-resource profile (operating points) for runtime adaptation.

Everything is decided on the validation split (the shipped thresholds and operating points on a
separate calibration split when one is given); a test split is only ever measured.
The JSON spec of the result rebuilds the network (:mod:`~nestflex.exits.flexdnn.spec`).
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Iterable, Sequence

import torch
from torch import nn

from nestflex.deploy.exits import ExitError, get_confidence
from nestflex.exits.calibration import (
    DEFAULT_THRESHOLDS, _confidences, collect_logits, exit_profile, fit_lossless_thresholds, lossless_thresholds,
)
from nestflex.exits.flexdnn.plan import insertion_plan, subset_cost
from nestflex.exits.flexdnn.search import (
    build_candidates,
    collect_exit_features,
    location_groups,
    prune_candidate,
    train_candidates,
)
from nestflex.exits.flexdnn.spec import _Prebuilt
from nestflex.exits.model import MultiExitNetwork, _head_macs
from nestflex.exits.placement import ALL, Position, resolve_positions
from nestflex.graph import check_input_shape, input_shape_of, trace

__all__ = ["FlexDNNConfig", "FlexDNNResult", "flexdnn", "evaluate_flex", "operating_points"]


@dataclass(frozen=True)
class FlexDNNConfig:
    """Settings of :func:`flexdnn` (defaults: minutes on 2 CPU cores for a 0.25-width VGG-16).

    Attributes:
        locations: candidate exit locations (MACs fractions or split point names); the default
            ``("all",)`` puts candidates after every layer, as the paper's search does, and lets
            the insertion plan choose among them.
        exits_per_location: ``M`` over-parameterised exits per location.
        base_width: first-block filters of each over-parameterised exit (each next block doubles them).
        blocks: conv blocks of each over-parameterised exit, before pruning.
        input_size: an exit on a map at least twice this size (smaller side) average-pools it
            by ``side // input_size`` before its first block, to about this size (``None``:
            never), see :func:`~nestflex.exits.flexdnn.search.build_candidates`.
        p_max: ranked dropout of the lowest-ranked filter.
        epochs: epochs of the exits' joint training (Adam) on the frozen backbone.
        lr: its learning rate.
        rate_tolerance: exit rate an exit may lose while it is pruned.
        confidence: confidence measure (FlexDNN: ``entropy``).
        rank_samples: samples per split for the collective ranking.
        fit_samples: training samples whose pooled features refit pruned exits' classifiers.
        min_filters_tolerance: accuracy an exit on the top filters may lose and still "match"
            the all-filter exit when the minimum filter count is read (``None``: two binomial
            standard errors of the all-filter exit's accuracy on the split it is read on, the
            resolution of that split; see :func:`flexdnn`).
        pool: per-filter pooling of the ranking probe.
        refit_iters: L-BFGS iterations of each pruned exit's classifier refit.
        calibration_folds: the planned exits' final thresholds are lossless by this many folds of
            cross-validation on the calibration split (``calibration_batches`` of :func:`flexdnn`;
            the validation split when none is given; the rule of the progressive exits,
            :func:`~nestflex.exits.calibration.lossless_thresholds`: the largest of the per-fold
            thresholds). ``0``: in-sample lossless thresholds on the calibration split; without
            one, the plan's own, which are lossless on exactly the samples that chose them and lose
            accuracy on new ones (docs/flexdnn.md).
        seed: torch's global generator is seeded with it on entry (the ranking's augmented fit
            samples, exit initialisation, training), so a run does not depend on its caller's.

    Raises:
        ExitError: a field out of range or of the wrong type, or an unknown confidence measure,
            when the config is built (not minutes into a run).

    Examples:
        >>> FlexDNNConfig(locations=[0.3, 0.6], epochs=8).locations
        (0.3, 0.6)
    """

    locations: tuple[Position, ...] = (ALL,)
    exits_per_location: int = 3
    base_width: int = 8
    blocks: int = 4
    input_size: int | None = None
    p_max: float = 0.5
    epochs: int = 2
    lr: float = 3e-3
    rate_tolerance: float = 0.02
    confidence: str = "entropy"
    rank_samples: int = 1000
    fit_samples: int = 2000
    min_filters_tolerance: float | None = None
    pool: int = 2
    refit_iters: int = 100
    calibration_folds: int = 5
    seed: int = 0

    def __post_init__(self) -> None:
        # every field is checked here, so a bad value fails when the config is built, not after
        # minutes of ranking and training (the callback and the recipe rely on it)
        if isinstance(self.locations, list):  # YAML and JSON have no tuples; the dataclass is frozen
            object.__setattr__(self, "locations", tuple(self.locations))
        if not isinstance(self.locations, tuple) or not self.locations:
            raise ExitError(f"`FlexDNNConfig.locations` must be a non-empty tuple of MACs fractions or split point "
                            f"names, got {self.locations!r}. HINT: ('all',) puts a candidate after every layer")
        for name in ("exits_per_location", "base_width", "blocks", "epochs", "rank_samples", "fit_samples",
                     "pool", "refit_iters"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ExitError(f"`FlexDNNConfig.{name}` must be a positive int, got {v!r}. "
                                f"HINT: the default is {_DEFAULTS[name]!r}")
        for name, low, high in (("p_max", 0.0, 1.0), ("rate_tolerance", 0.0, 1.0)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not low <= v < high:
                raise ExitError(f"`FlexDNNConfig.{name}` must be a number in [{low:g}, {high:g}), got {v!r}. "
                                f"HINT: the default is {_DEFAULTS[name]!r}")
        if isinstance(self.lr, bool) or not isinstance(self.lr, (int, float)) or not self.lr > 0:
            raise ExitError(f"`FlexDNNConfig.lr` must be a positive number, got {self.lr!r}. HINT: the default is "
                            f"{_DEFAULTS['lr']!r}")
        t = self.min_filters_tolerance
        if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float)) or not 0.0 <= t < 1.0):
            raise ExitError(f"`FlexDNNConfig.min_filters_tolerance` must be an accuracy fraction in [0, 1) or None "
                            f"(two standard errors of the all-filter exit's accuracy), got {t!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ExitError(f"`FlexDNNConfig.seed` must be an int, got {self.seed!r}")
        get_confidence(self.confidence)  # an unknown measure fails now, with the registered ones
        f = self.calibration_folds
        if isinstance(f, bool) or not isinstance(f, int) or f == 1 or f < 0:
            raise ExitError(f"`calibration_folds` must be 0 (in-sample thresholds) or an int >= 2, got {f!r}. "
                            "HINT: 5 is the progressive exits' default")
        n = self.input_size
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise ExitError(f"`FlexDNNConfig.input_size` must be a positive int or None (exits never pool), got {n!r}")


#: the defaults, for the hints of :meth:`FlexDNNConfig.__post_init__`
_DEFAULTS = {f.name: f.default for f in fields(FlexDNNConfig)}


@dataclass
class FlexDNNResult:
    """What :func:`flexdnn` returns.

    Attributes:
        network: the planned exits on the backbone (``None`` when the plan keeps no exit).
        spec: JSON spec of the exits (:func:`~nestflex.exits.flexdnn.build_flex_network` rebuilds
            the network from it).
        report: JSON-ready ranking, search, plan and profile records.
    """

    network: MultiExitNetwork | None
    spec: dict[str, Any]
    report: dict[str, Any] = field(default_factory=dict)


def operating_points(sweep: Sequence[dict[str, Any]], extra: Sequence[dict[str, Any]] = ()) -> list[dict[str, Any]]:
    """The accuracy-resource profile: Pareto-optimal (accuracy up, MACs down) points, by MACs.

    Each point keeps its ``threshold`` (or ``thresholds``), ``accuracy``, ``mean_macs`` and
    ``mean_macs_fraction``; at run time the cheapest point whose accuracy meets the need is used.

    Args:
        sweep: points of a shared-threshold sweep (``exit_profile(...)["sweep"]``).
        extra: further points, e.g. the lossless thresholds measured on the same split.

    Returns:
        the points no other point beats on both accuracy and MACs, cheapest first.

    Examples:
        >>> pts = [{"threshold": 0.5, "accuracy": 0.8, "mean_macs": 50}, {"threshold": 0.7, "accuracy": 0.7,
        ...        "mean_macs": 60}, {"threshold": 0.9, "accuracy": 0.9, "mean_macs": 80}]
        >>> [p["threshold"] for p in operating_points(pts)]
        [0.5, 0.9]
    """
    rows = [r for r in list(sweep) + list(extra)]
    rows.sort(key=lambda r: (r["mean_macs"], -r["accuracy"]))
    out, best = [], -1.0
    for r in rows:
        if r["accuracy"] > best:
            keys = ("threshold", "thresholds", "accuracy", "mean_macs", "mean_macs_fraction", "exit_rate")
            out.append({k: r[k] for k in keys if k in r})
            best = r["accuracy"]
    return out


def _check_calibration(batches: Iterable, folds: int) -> None:
    """Fail in seconds, not after the search: a one-shot iterator (it would be used up before
    the thresholds are fitted), or fewer samples than the cross-validation needs."""
    if iter(batches) is batches:
        raise ExitError("`calibration_batches` is a one-shot iterator; it is read more than once. "
                        "HINT: pass a list of (x, y) batches or a DataLoader")
    # a DataLoader knows its size without loading a batch; lists of batches are counted
    dataset = getattr(batches, "dataset", None)
    sized = dataset is not None and not isinstance(dataset, torch.utils.data.IterableDataset)
    n = len(dataset) if sized else sum(len(b[1]) for b in batches)  # an IterableDataset has no len: count
    if n == 0 or n < folds:
        raise ExitError(
            f"`calibration_batches` has {n} samples, fewer than " + ("one" if n == 0 else f"calibration_folds={folds}")
            + f". HINT: pass at least {max(folds, 1)} samples disjoint from the validation split"
            + (", or calibration_folds=0" if folds else "") + ", or None to calibrate on validation")


def flexdnn(
    backbone: nn.Module,
    train_batches: Iterable,
    val_batches: Iterable,
    config: FlexDNNConfig = FlexDNNConfig(),
    num_classes: int = 10,
    input_shape: Sequence[int] | None = None,
    calibration_batches: Iterable | None = None,
) -> FlexDNNResult:
    """Rank, search and plan FlexDNN exits on a frozen ``backbone`` (see the module docstring).

    Args:
        backbone: a trained classifier (left unchanged; put in eval mode).
        train_batches: re-iterable training batches ``(x, y)`` (a DataLoader).
        val_batches: re-iterable validation batches: every decision is made on them.
        config: :class:`FlexDNNConfig`.
        num_classes: classes of the backbone.
        input_shape: per-sample input shape; default the backbone's own
            (:func:`nestflex.graph.input_shape_of`). Validation batches of another shape raise
            ``GraphError``.
        calibration_batches: re-iterable batches, disjoint from ``val_batches``, on which the
            shipped thresholds are fitted and the operating points measured. The exits were
            searched, pruned and planned on the validation split, so thresholds fitted there too
            are optimistic on new data (docs/flexdnn.md); ``None`` uses the validation split.

    Returns:
        the :class:`FlexDNNResult`: the planned network (``None`` when no exit pays for itself),
        its JSON spec and the report.

    Raises:
        ExitError: a location with fewer filters than ``M``, ``calibration_batches`` that is a
            one-shot iterator or has fewer samples than ``config.calibration_folds`` (or none), ...
        PruningError: an empty training or validation split (found while ranking).

    Both are :class:`~nestflex.errors.NestflexError`. The report's ranking records carry the
    minimum filter count per location (``min_filters`` and how it was read, see
    :func:`_read_min_filters`). torch's global generator is seeded with ``config.seed`` inside a
    fork: the caller's generator state is the same after the call.
    """
    input_shape = input_shape_of(backbone, input_shape)
    first = next(iter(val_batches), None)  # re-iterable (documented): peeking consumes nothing
    if first is not None:  # an empty split raises its own error while ranking
        check_input_shape(input_shape, first, "flexdnn")
    if calibration_batches is not None:
        _check_calibration(calibration_batches, config.calibration_folds)
    # Seeded before anything draws: augmenting training loaders use torch's global generator, and
    # the ranking's fit samples come from them, so an unseeded run ranked differently each time.
    # Forked, so the caller's generator is left where it was.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        return _flexdnn(backbone, train_batches, val_batches, config, num_classes, input_shape, calibration_batches)


def _flexdnn(backbone, train_batches, val_batches, config, num_classes, input_shape, calibration_batches):
    from nestflex.pruning.collective import collective_ranking, pooled_activations

    backbone.eval()
    for p in backbone.parameters():
        p.requires_grad_(False)
    timings: dict[str, float] = {}
    start = time.perf_counter()
    graph = trace(backbone, input_shape=input_shape)
    points = resolve_positions(graph, list(config.locations))
    location_groups(graph, points)  # every location must be a layer's filters (clear error otherwise)
    # each location ranked on its own activation, the map its exits read: on a residual stage,
    # where several locations share one channel group, each still gets its own order
    nodes = [p.node for p in points]
    fx, fy = pooled_activations(backbone, graph, nodes, train_batches, pool=config.pool,
                                max_samples=config.rank_samples, name="fit")
    vx, vy = pooled_activations(backbone, graph, nodes, val_batches, pool=config.pool,
                                max_samples=config.rank_samples, name="validation")
    rankings, ranking_report = [], []
    for p in points:
        t0 = time.perf_counter()
        r = collective_ranking(fx[p.node], fy, vx[p.node], vy, num_classes=num_classes)
        rankings.append(r)
        ranking_report.append({
            "location": p.name, "filters": int(fx[p.node].shape[1]), "seconds": round(time.perf_counter() - t0, 4),
            "validation_samples": int(vy.numel()),
            "fits": r.fits,
            "all_filters_accuracy": float(r.kept_accuracy[-1]),
            "order": r.order.tolist(),
        })
    timings["rank"] = time.perf_counter() - start

    cands = build_candidates(points, [r.order for r in rankings], num_classes, config.exits_per_location,
                             config.base_width, config.blocks, config.p_max, config.input_size)
    t0 = time.perf_counter()
    trained = train_candidates(graph, cands, train_batches, config.epochs, config.lr, config.seed)
    timings["train"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    fit = collect_exit_features(graph, cands, train_batches, config.fit_samples, name="fit")
    val = collect_exit_features(graph, cands, val_batches, final=True, name="validation")
    searched = []
    for i, c in enumerate(cands):
        part = lambda d: {"features": d["features"][i], "labels": d["labels"], "final_logits": d["final_logits"]}  # noqa: E731
        searched.append(prune_candidate(c, part(fit), part(val), num_classes, config.rate_tolerance, config.confidence,
                                        config.refit_iters))
    timings["prune"] = time.perf_counter() - t0

    backbone_macs = graph.macs()
    conf_fn = get_confidence(config.confidence)
    final_logits, labels = val["final_logits"], val["labels"]
    final_conf, final_right = conf_fn(final_logits).double(), final_logits.argmax(1) == labels
    search_report, best = [], {}
    for s in searched:
        shape = next(sh for n, sh in s.point.tensors if n == s.point.node)
        head_macs = _head_macs(s.module, tuple(shape))
        conf = torch.stack([conf_fn(s.val_logits).double(), final_conf])
        right = torch.stack([s.val_logits.argmax(1) == labels, final_right])
        cost = subset_cost([0], conf, right, [s.point.macs_before], [head_macs], backbone_macs)["mean_macs"]
        search_report.append({"location": s.point.name, "k": s.k, "filters": len(s.filters), "depth": s.depth,
                              "widths": s.widths, "head_macs": head_macs, "exit_rate": s.rate,
                              "full_exit_rate": s.full_rate, "standalone_mean_macs": cost, "history": s.history})
        if s.location not in best or cost < best[s.location][0]:
            best[s.location] = (cost, s, head_macs)
    chosen = [best[loc] for loc in sorted(best)]
    conf = torch.stack([conf_fn(s.val_logits).double() for _, s, _ in chosen] + [final_conf])
    right = torch.stack([s.val_logits.argmax(1) == labels for _, s, _ in chosen] + [final_right])
    plan = insertion_plan(conf, right, [s.point.macs_before for _, s, _ in chosen],
                          [h for _, _, h in chosen], backbone_macs)
    kept = [chosen[i][1] for i in plan.kept]
    network, thresholds, calibration, logits = None, list(plan.thresholds), None, None
    calibration_split = val_batches if calibration_batches is None else calibration_batches
    split_name = "validation" if calibration_batches is None else "calibration"
    if kept:
        network = MultiExitNetwork(backbone, positions=[s.point.name for s in kept],
                                   head=_Prebuilt([s.module for s in kept]), input_shape=input_shape).eval()
        logits, lab = collect_logits(network, calibration_split)
        if config.calibration_folds:
            # The plan's thresholds are lossless on the very samples that chose them; thresholds
            # lossless on held-out folds carry over to new data (the progressive exits' rule).
            calibration = lossless_thresholds(logits, lab, network.exit_macs, network.backbone_macs,
                                              config.confidence, folds=config.calibration_folds, seed=config.seed)
            thresholds = calibration["thresholds"]
        elif calibration_batches is not None:  # in-sample on the held-out calibration split
            conf_c = _confidences(logits, config.confidence).double()
            thresholds = fit_lossless_thresholds(conf_c, logits.argmax(-1) == lab[None])
    spec = {
        "schema_version": 1, "num_classes": num_classes, "input_shape": list(input_shape),
        "confidence": config.confidence, "thresholds": thresholds, "fallback": "final",
        "exits": [{"location": s.point.name, "filters": s.filters, "widths": s.widths,
                   "in_hw": list(s.module.head.in_hw), "stem_pool": s.module.head.stem_pool} for s in kept],
    }
    timings["total"] = time.perf_counter() - start
    report = {
        "config": {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(config).items()},
        "backbone_macs": backbone_macs,
        "ranking": ranking_report,
        "training": trained,
        "search": search_report,
        "candidates": [{"location": s.point.name, "k": s.k, "head_macs": h, "standalone_mean_macs": c}
                       for c, s, h in chosen],
        "plan": {**plan.to_dict(), "kept_locations": [s.point.name for s in kept],
                 "mean_macs_fraction": plan.mean_macs / backbone_macs},
        "seconds": {k: round(v, 2) for k, v in timings.items()},
    }
    # last, so that reading it draws nothing before the search (the runs stay comparable)
    _read_min_filters(ranking_report, rankings, points, fx, fy, calibration_batches, backbone, graph, config,
                      num_classes)
    if network is not None:
        prof = exit_profile(logits, lab, network.exit_macs, network.backbone_macs, network.exit_names,
                            network.positions, DEFAULT_THRESHOLDS, config.confidence, "final",
                            at_thresholds=thresholds)
        lossless = {**prof["at_thresholds"]}
        # the thresholds shipped in the spec, measured on all of the split that fitted them
        report["calibration"] = {"split": split_name, "samples": int(lab.numel()), "folds": config.calibration_folds,
                                 "thresholds": thresholds, **{k: lossless[k] for k in (
                                     "accuracy", "mean_macs", "mean_macs_fraction", "exit_rate")},
                                 "final_accuracy": prof["final_accuracy"]}
        if calibration is not None:
            report["calibration"].update({k: calibration[k] for k in ("seed", "cv", "cv_accuracy_delta_mean", "guard")})
        report["profile"] = {"split": split_name, "exit_macs": network.exit_macs,
                             "operating_points": operating_points(prof["sweep"], [lossless])}
    return FlexDNNResult(network=network, spec=spec, report=report)


def _read_min_filters(ranking_report, rankings, points, fx, fy, calibration_batches, backbone, graph,
                      config: FlexDNNConfig, num_classes: int) -> None:
    """Add FlexDNN's minimum filter count to each location's ranking record: the fewest top-ranked
    filters whose exit matches the all-filter exit.

    Read on the calibration split when there is one: the validation split chose the order, and
    its curve is optimistic (on a recipe run it gave 3 of 128 filters at a late layer). The rule is
    the smallest count within tolerance (``min_filters(rule="first")``, robust to single noisy
    dips); the default tolerance is two binomial standard errors of the all-filter exit's accuracy
    on that split, the smallest difference it can resolve (the minimum-filters benchmark's rule).
    """
    from nestflex.pruning.collective import exit_accuracy_curve, min_filters, pooled_activations

    split = "validation"
    if calibration_batches is not None:
        split = "calibration"
        hx, hy = pooled_activations(backbone, graph, [p.node for p in points], calibration_batches,
                                    pool=config.pool, max_samples=config.rank_samples, name="calibration")
    for rec, r, p in zip(ranking_report, rankings, points):
        if split == "calibration":
            curve = exit_accuracy_curve(fx[p.node], fy, hx[p.node], hy, r.order, num_classes=num_classes)
            n = int(hy.numel())
        else:  # the selection's own curve: the same probes scored on the split that chose the order
            curve, n = r.kept_accuracy, int(rec["validation_samples"])
        a = float(curve[-1])
        tol = config.min_filters_tolerance
        if tol is None:
            tol = min(2.0 * math.sqrt(max(a * (1.0 - a), 0.0) / n), 0.999)
        rec.update(min_filters=min_filters(curve, tol, rule="first"), min_filters_split=split,
                   min_filters_samples=n, min_filters_tolerance=tol, min_filters_reference_accuracy=a)


def evaluate_flex(network: MultiExitNetwork, spec: dict[str, Any], batches: Iterable) -> dict[str, Any]:
    """Accuracy and mean MACs of the planned network at the plan's thresholds on ``batches``.

    Args:
        network: the planned network (``FlexDNNResult.network``, or
            :func:`~nestflex.exits.flexdnn.load_flex_network`).
        spec: its spec (``FlexDNNResult.spec``): the thresholds and confidence measured.
        batches: ``(images, labels)`` batches of the split to measure (a test split: nothing is
            fitted here).

    Returns:
        ``{"accuracy", "mean_macs", "mean_macs_fraction", "exit_rate", "final_accuracy", "sweep",
        "samples"}`` under the final-exit fallback.

    Raises:
        ExitError: ``batches`` yields nothing, or thresholds that do not fit the network.
    """
    logits, labels = collect_logits(network, batches)
    prof = exit_profile(logits, labels, network.exit_macs, network.backbone_macs, network.exit_names,
                        network.positions, DEFAULT_THRESHOLDS, spec["confidence"], "final",
                        at_thresholds=spec["thresholds"])
    at = prof["at_thresholds"]
    return {"accuracy": at["accuracy"], "mean_macs": at["mean_macs"], "mean_macs_fraction": at["mean_macs_fraction"],
            "exit_rate": at["exit_rate"], "final_accuracy": prof["final_accuracy"], "sweep": prof["sweep"],
            "samples": prof["samples"]}

