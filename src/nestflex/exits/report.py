"""What the recipes and benchmarks report about a trained multi-exit network.

:func:`evaluate_exits` calibrates on the validation split and profiles the test split with the
thresholds chosen on validation; :func:`exits_summary` condenses both into the ``exits`` entry of
a recipe's ``summary.json`` (keys in docs/recipes.md); :func:`plot_tradeoff` draws accuracy
against mean MACs per sample.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from nestflex.exits.calibration import DEFAULT_THRESHOLDS, calibrate, collect_logits, exit_profile
from nestflex.exits.model import MultiExitNetwork

__all__ = ["evaluate_exits", "cheapest_within", "exits_summary", "plot_tradeoff"]


def evaluate_exits(
    net: MultiExitNetwork,
    val_batches: Iterable,
    test_batches: Iterable,
    confidence: str = "max_prob",
    fallback: str = "most_confident",
    thresholds: Sequence[float] = DEFAULT_THRESHOLDS,
    folds: int = 5,
    seed: int = 0,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(calibration on validation, profile on test)``.

    The test profile evaluates the sweep (with ``fallback``), the lossless thresholds fitted on
    validation (``at_thresholds``, final-exit fallback), the sweep with the other fallback
    (``sweep_other_fallback``, for comparison), and the cheapest validation sweep point within
    1 point of the final exit's validation accuracy (``chosen_on_validation``), measured on test.
    """
    calibration = calibrate(
        net,
        val_batches,
        thresholds=thresholds,
        confidence=confidence,
        fallback=fallback,
        folds=folds,
        seed=seed,
    )
    calibration["split"] = "validation"
    logits, labels = collect_logits(net, test_batches)
    test = exit_profile(
        logits,
        labels,
        net.exit_macs,
        net.backbone_macs,
        net.exit_names,
        net.positions,
        thresholds=thresholds,
        confidence=confidence,
        fallback=fallback,
        at_thresholds=calibration["lossless"]["thresholds"],
    )
    other = "final" if fallback == "most_confident" else "most_confident"
    test["sweep_other_fallback"] = {
        "fallback": other,
        "sweep": exit_profile(
            logits,
            labels,
            net.exit_macs,
            net.backbone_macs,
            thresholds=thresholds,
            confidence=confidence,
            fallback=other,
        )["sweep"],
    }
    test["split"] = "test"
    pick = cheapest_within(calibration["sweep"], calibration["final_accuracy"], 0.01)
    if pick is not None:
        row = next(r for r in test["sweep"] if r["threshold"] == pick["threshold"])
        test["chosen_on_validation"] = {
            "rule": "cheapest validation sweep point within 1 point of the final exit",
            **row,
        }
    return calibration, test


def cheapest_within(
    sweep: Sequence[Mapping[str, Any]], reference: float, drop: float
) -> Mapping[str, Any] | None:
    """The sweep row with the lowest mean MACs whose accuracy is at least ``reference - drop``."""
    ok = [r for r in sweep if r["accuracy"] >= reference - drop - 1e-12]
    return min(ok, key=lambda r: (r["mean_macs_fraction"], -r["accuracy"])) if ok else None


def exits_summary(
    net: MultiExitNetwork, calibration: Mapping[str, Any], test: Mapping[str, Any]
) -> dict[str, Any]:
    """The ``exits`` entry of a recipe summary (test figures; thresholds chosen on validation)."""
    lossless = test["at_thresholds"]
    out: dict[str, Any] = {
        "layers": net.exit_names[:-1],
        "positions": [round(p, 4) for p in net.positions],
        "confidence": test["confidence"],
        "fallback": test["fallback"],
        "accuracy": [round(e["accuracy"], 4) for e in test["exits"]],
        "macs_fraction": [round(e["macs_fraction"], 4) for e in test["exits"]],
        "backbone": {"accuracy": round(test["final_accuracy"], 4), "macs": net.backbone_macs},
        "sweep": [
            {
                "threshold": r["threshold"],
                "accuracy": round(r["accuracy"], 4),
                "macs_fraction": round(r["mean_macs_fraction"], 4),
            }
            for r in test["sweep"]
        ],
        "lossless": {
            "thresholds": lossless["thresholds"],
            "fallback": lossless["fallback"],
            "accuracy": round(lossless["accuracy"], 4),
            "macs_fraction": round(lossless["mean_macs_fraction"], 4),
            "cv_accuracy_delta": round(calibration["lossless"]["cv_accuracy_delta_mean"], 4),
        },
        "overthinking_rate": round(test["overthinking_rate"], 4),
    }
    if "chosen_on_validation" in test:
        c = test["chosen_on_validation"]
        out["within_1pt"] = {
            "threshold": c["threshold"],
            "accuracy": round(c["accuracy"], 4),
            "macs_fraction": round(c["mean_macs_fraction"], 4),
        }
    return out


def plot_tradeoff(
    curves: Mapping[str, Sequence[Mapping[str, Any]]],
    backbone_accuracy: float,
    png: str | Path,
    title: str,
    synthetic: bool,
    marks: Mapping[str, Mapping[str, Any]] | None = None,
) -> Path:
    """Accuracy vs mean MACs fraction, one line per sweep, the backbone alone as a star.

    Args:
        curves: label -> sweep rows (``accuracy`` and ``mean_macs_fraction`` or ``macs_fraction``).
        backbone_accuracy: accuracy of the backbone alone (at MACs fraction 1).
        png: output path.
        title: figure title; " (synthetic data)" is appended when ``synthetic``.
        marks: label -> one row to mark (e.g. the lossless thresholds).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def xy(rows):
        return (
            [r.get("mean_macs_fraction", r.get("macs_fraction")) for r in rows],
            [100 * r["accuracy"] for r in rows],
        )

    fig, ax = plt.subplots(figsize=(6, 4.2))
    for label, rows in curves.items():
        ax.plot(*xy(rows), "o-", ms=3, label=label)
    for label, row in (marks or {}).items():
        (x,), (y,) = xy([row])
        ax.plot(x, y, "D", ms=7, label=label)
    ax.plot(1.0, 100 * backbone_accuracy, "k*", ms=12, label="backbone alone")
    ax.axhline(100 * backbone_accuracy - 1, color="grey", ls=":", lw=1, label="backbone - 1 point")
    ax.axvline(0.5, color="grey", ls="--", lw=1, label="50% of backbone MACs")
    ax.set_xlabel("mean MACs per sample / backbone MACs")
    ax.set_ylabel("top-1 accuracy (%)")
    ax.set_title(title + (" (synthetic data)" if synthetic else ""), fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    png = Path(png)
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=120)
    plt.close(fig)
    return png
