"""The operating points of a bundle's exit set: the threshold settings an app can run its early exits
at, read from the bundle's calibration (SPINN/SDN's threshold sweep, FlexDNN's ``operating_points``).

The engine picks one per app for the compute it gets (FlexDNN's runtime adaptation); the split
scheduler and ``nestflex tune`` read the same points. An *operating point* here is a setting of
exit thresholds, nothing else: not a capacity level, not a split point.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Mapping

from nestflex.deploy.bundle.loader import Bundle

__all__ = ["ExitPoint", "operating_points"]


@dataclass(frozen=True)
class ExitPoint:
    """One threshold setting of an exit set, from the bundle's calibration.

    Attributes:
        thresholds: one per early exit.
        accuracy: accuracy at these thresholds on the calibration split.
        exit_rate: share of frames leaving at each exit (final last); empty when not calibrated.
        mean_macs_fraction: mean MACs as a fraction of the backbone's (``None`` if unknown).
    """

    thresholds: tuple[float, ...]
    accuracy: float | None
    exit_rate: tuple[float, ...] = ()
    mean_macs_fraction: float | None = None


def _pareto(points: list[ExitPoint]) -> list[ExitPoint]:
    """Points no other point beats on both mean MACs and accuracy, cheapest first."""
    key = [(p.mean_macs_fraction if p.mean_macs_fraction is not None else 1.0, -(p.accuracy or 0.0)) for p in points]
    order = sorted(range(len(points)), key=lambda i: key[i])
    out, best = [], -1.0
    for i in order:
        acc = points[i].accuracy if points[i].accuracy is not None else 0.0
        if acc > best:
            out.append(points[i])
            best = acc
    return out


def _point(row: Mapping[str, Any], early: int) -> ExitPoint | None:
    thr = row.get("thresholds", row.get("threshold"))
    if isinstance(thr, (int, float)) and not isinstance(thr, bool):
        thr = [float(thr)] * early
    if not isinstance(thr, list) or len(thr) != early:
        return None
    rate = row.get("exit_rate")
    rate = tuple(float(r) for r in rate) if isinstance(rate, list) and len(rate) == early + 1 else ()
    acc = row.get("accuracy")
    frac = row.get("mean_macs_fraction", row.get("macs_fraction"))
    return ExitPoint(tuple(float(t) for t in thr), float(acc) if acc is not None else None, rate,
                     float(frac) if frac is not None else None)


def operating_points(bundle: Bundle, exit_key: str) -> tuple[list[ExitPoint], int, float | None]:
    """The operating points of one exit set, cheapest first, with the index of the shipped
    (lossless) thresholds among them and the set's final-exit accuracy on the calibration split.

    SPINN/SDN exits (``exits``) read the threshold sweep of ``profiles/exit_calibration.json`` and
    the lossless thresholds; FlexDNN exits (``flex_exits``) read ``operating_points``. Without a
    calibration the only point is the shipped thresholds (accuracy unknown).
    """
    ex = bundle.exit_sets[exit_key]
    early = len(ex["names"]) - 1
    rows: list[Mapping[str, Any]] = list(ex.get("operating_points") or [])
    ref = None
    cal = ex.get("calibration") or {}
    if exit_key == "exits" and cal.get("file") and cal["file"] in bundle.manifest.get("files", {}):
        report = json.loads(bundle.file(cal["file"]).read_text(encoding="utf-8"))
        rows += [r for r in report.get("sweep", []) if isinstance(r, Mapping)]
        ref = report.get("final_accuracy")
    lossless_row = dict(cal.get("lossless") or {}) if exit_key == "exits" else dict(cal)
    lossless_row["thresholds"] = list(ex["thresholds"])
    if ref is None:
        ref = cal.get("final_accuracy")
    shipped = _point(lossless_row, early)
    points = [p for p in (_point(r, early) for r in rows) if p is not None]
    points = _pareto(points + ([shipped] if shipped is not None else []))
    if shipped is not None and shipped not in points:  # dominated on calibration, but it is the default
        points.append(shipped)
        points.sort(key=lambda p: p.mean_macs_fraction if p.mean_macs_fraction is not None else 1.0)
    lossless = points.index(shipped) if shipped is not None else len(points) - 1
    if ref is None:
        accs = [p.accuracy for p in points if p.accuracy is not None]
        ref = max(accs) if accs else None
    return points, lossless, (float(ref) if ref is not None else None)


# ------------------------------------------------------------------------------------------------
