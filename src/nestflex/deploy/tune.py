"""Synthesis of execution plans (Cappuccino, METHODS §5; ``nestflex tune``): every candidate backend
and thread count measured on this machine, checked against the reference, the fastest kept.

Numpy only (no torch): the base install runs it. The float32 reference every candidate must match
(:func:`reference_backend`) is the torch ``eager`` interpreter of the bundle's op program where
torch is installed, and otherwise ``onnxruntime_program``: onnxruntime on graphs written from the
same program by :mod:`nestflex.deploy.onnxgraph` (never the ONNX files the bundle ships, which
are one of the things checked). Both run the program, not an export of it, so a candidate that
runs the shipped graphs (``onnxruntime``) is checked against an independent path either way; the
plan records which one it was (:attr:`~nestflex.deploy.backends.ExecutionPlan.reference`). Eager
comes first where it can run because it shares no kernel with the onnxruntime candidates (a fault
of onnxruntime's would be on both sides of the other check).
Candidates that need the ``onnx`` package to build their graphs (int8, mixed, padded; the fused
early-exit graph) are measured where it is installed (``nestflex[tune]``) and recorded with the
error naming it where not.
"""

from __future__ import annotations

import math
import os
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from nestflex.deploy import exits as exit_policy  # looked up per call: tests replace the policy
from nestflex.deploy._arrays import to_numpy
from nestflex.deploy.backends.base import (
    BackendError,
    calibration_split,
    get_backend,
    list_backends,
    tuned_dir,
)
from nestflex.deploy.backends.fused_exits import weights_file
from nestflex.deploy.backends.plan import ExecutionPlan, ExitsPlan, LevelPlan

__all__ = ["synthesize", "choose_active_exits", "reference_backend"]


def reference_backend() -> str:
    """The backend the synthesis checks every float32 candidate against: ``"eager"`` (the torch
    interpreter of the bundle's op program) where torch is installed, else ``"onnxruntime_program"``
    (onnxruntime on the graphs written from the program; numpy and onnxruntime only).

    Examples:
        >>> reference_backend() in ("eager", "onnxruntime_program")
        True
    """
    return "eager" if get_backend("eager").available() else "onnxruntime_program"


def _level_plan(bundle: Any, name: str, threads: int) -> ExecutionPlan:
    return ExecutionPlan(tuple(LevelPlan(name, threads) for _ in range(bundle.num_levels)))


def synthesize(bundle: Any, *, backends: Sequence[str] | None = None, threads: Sequence[int] | None = None,
               repeats: int = 30, atol: float = 1e-4, samples: Any = None,
               budget_points: float = 1.0, batches: Sequence[int] = (1,),
               log: Callable[[str], None] | None = None) -> ExecutionPlan:
    """Measure every backend x threads for every level on this machine; keep the fastest that passes.

    A float32 backend passes when its logits match the reference's (:func:`reference_backend`)
    within ``atol``; a reduced precision one (``onnxruntime_int8``) when its top-1 accuracy on the
    check half of the bundle's samples (:func:`calibration_split`; int8 ranges come from the other
    half) is at most ``budget_points`` below the reference's on the same samples.

    Args:
        bundle: a loaded bundle.
        backends: names to try (default: every installed one).
        threads: thread counts (default 1..cores).
        repeats: timed calls per configuration (median; batch 1).
        atol: a float32 configuration counts only if its logits match the reference's within ``atol``.
        samples: inputs for the agreement check, a float array ``(N, *input shape)`` (default: 8 of
            the bundle's check samples, else 8 seeded normal samples).
        budget_points: accuracy (points) a reduced-precision configuration may lose.
        batches: batch sizes to time every configuration at; batch 1 (always timed) gives the
            plan's levels, each larger one its own choice per level (:attr:`ExecutionPlan.batches`:
            what a runtime made for that batch size runs).
        log: called with one line per measured configuration.

    Returns:
        the :class:`ExecutionPlan` (the reference at 1 thread is always a candidate, so every level
        gets one).

    Raises:
        BackendError: ``batches`` holds something other than ints >= 1.

    Example::

        plan = synthesize(nd.load("bundle.nfx"), threads=[1, 2], repeats=10)
        write_plan(bundle, plan)    # what `nestflex tune` does
    """
    from nestflex._machine import machine
    from nestflex.deploy.bundle.loader import bundle_id
    from nestflex.deploy.runtime.capacity import CapacityRuntime
    from nestflex.deploy.timing import median_ms

    sizes = sorted({1, *batches})
    if any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in sizes):
        raise BackendError(f"`batches` must be ints >= 1, got {list(batches)!r}")
    reference = reference_backend()
    names = list(backends) if backends is not None else list_backends(available_only=True)
    counts = list(threads) if threads is not None else list(range(1, (os.cpu_count() or 1) + 1))
    if reference not in names:
        names.insert(0, reference)
    shape = tuple(bundle.spec.input.shape)
    labelled = calibration_split(bundle)[1] if bundle.spec.samples is not None else None
    x1 = np.random.default_rng(0).standard_normal((1, *shape), dtype=np.float32)
    xb = {b: np.random.default_rng(b).standard_normal((b, *shape), dtype=np.float32) for b in sizes[1:]}
    if samples is not None:
        check = np.ascontiguousarray(to_numpy(samples), dtype=np.float32)
    elif labelled is not None:
        check = labelled[0][:8]
    else:
        check = np.random.default_rng(1).standard_normal((8, *shape), dtype=np.float32)
    candidates, levels = [], []
    by_batch: dict[int, list[LevelPlan]] = {b: [] for b in sizes[1:]}
    for level in range(bundle.num_levels):
        ref_rt = CapacityRuntime(bundle, level, plan=reference, keep="active")
        ref = np.concatenate([ref_rt(check[i:i + 1]) for i in range(check.shape[0])])
        ref_acc = None if labelled is None else _accuracy(ref_rt, *labelled)
        best = None
        ref_ms = None
        best_b: dict[int, tuple] = {}  # batch -> (backend, threads, ms per call, accuracy)
        ref_b: dict[int, float] = {}
        agreeing: dict[tuple[str, int], tuple[Any, Any]] = {}  # (backend, threads) -> (runtime, accuracy)
        for name in names:
            backend = get_backend(name)
            if not backend.available():
                continue
            exact = backend.precision == "float32"
            for t in counts:
                try:  # a fresh runtime per configuration: each prepares its own level
                    rt = CapacityRuntime(bundle, level, plan=_level_plan(bundle, name, t), keep="active")
                    out = np.concatenate([rt(check[i:i + 1]) for i in range(check.shape[0])])
                    err = float(np.abs(out - ref).max())
                    acc = None if exact or labelled is None else _accuracy(rt, *labelled)
                    ms = median_ms(lambda: rt(x1), repeats, warmup=3)
                    ms_b = {b: median_ms(lambda v=v: rt(v), repeats, warmup=2) for b, v in xb.items()}
                except Exception as e:  # a backend that cannot run this level is not a candidate
                    candidates.append({"level": level, "backend": name, "threads": t, "error": f"{e}"[:200]})
                    continue
                if exact:
                    ok = err <= atol and math.isfinite(err)
                else:  # no labelled samples: nothing to judge the accuracy on, so not a candidate
                    ok = acc is not None and acc >= ref_acc - budget_points / 100
                row = {"level": level, "backend": name, "threads": t, "latency_ms": round(ms, 4),
                       "max_abs_diff": err, "agrees": ok}
                if acc is not None:
                    row.update(accuracy=round(acc, 6), eager_accuracy=round(ref_acc, 6))
                if ms_b:
                    row["batch_ms"] = {str(b): round(v, 4) for b, v in ms_b.items()}
                candidates.append(row)
                if name == reference and t == 1:
                    ref_ms = ms
                    ref_b = ms_b
                if ok:
                    agreeing[(name, t)] = (rt, ref_acc if exact else acc)
                if ok and (best is None or ms < best[2]):
                    best = (name, t, ms, ref_acc if exact else acc)
                for b, v in ms_b.items():
                    if ok and (b not in best_b or v < best_b[b][2]):
                        best_b[b] = (name, t, v, ref_acc if exact else acc)
                if log is not None:
                    log(f"level {level}: {name:20s} threads {t}: {ms:8.3f} ms  max|diff| {err:.2e}"
                        + ("" if acc is None else f"  accuracy {acc:.4f} ({reference} {ref_acc:.4f})"))
        if best is None:  # the reference at the counts asked for failed too: say so, do not guess
            raise BackendError(f"level {level}: no configuration ran, the reference {reference!r} included; "
                               f"errors: {[c.get('error') for c in candidates if c['level'] == level][:3]}")
        rows = [c for c in candidates if c["level"] == level and c.get("agrees") and "exit_set" not in c]
        best = _rematch(best, x1, agreeing, {(c["backend"], c["threads"]): c["latency_ms"] for c in rows},
                        repeats, rows, "latency_ms")
        for b, v in xb.items():
            if b in best_b:
                times = {(c["backend"], c["threads"]): c["batch_ms"][str(b)] for c in rows if "batch_ms" in c}
                best_b[b] = _rematch(best_b[b], v, agreeing, times, repeats, rows, f"batch_{b}_ms")
        agreeing.clear()
        levels.append(LevelPlan(best[0], best[1], round(best[2], 4), None if ref_ms is None else round(ref_ms, 4),
                                None if best[3] is None else round(best[3], 6)))
        for b, (name, t, v, acc) in best_b.items():
            by_batch[b].append(LevelPlan(name, t, round(v, 4), None if b not in ref_b else round(ref_b[b], 4),
                                         None if acc is None else round(acc, 6)))
    exits = {key: _synthesize_exits(bundle, key, names, counts, repeats, atol, check, x1, candidates, log,
                                    budget_points, reference)
             for key in bundle.exit_sets}
    return ExecutionPlan(tuple(levels), bundle_id(bundle), machine(), tuple(candidates),
                         budget_points=budget_points if labelled is not None else None,
                         check_samples=0 if labelled is None else int(labelled[0].shape[0]), exits=exits,
                         batches={b: tuple(lps) for b, lps in by_batch.items()}, reference=reference)


#: configurations within this fraction of the fastest one are timed again, side by side
REMATCH_WITHIN = 0.10
#: calls per turn in that second round
REMATCH_BLOCK = 10


def _rematch(best: tuple, x: np.ndarray, agreeing: Mapping[tuple[str, int], tuple[Any, Any]],
             times: Mapping[tuple[str, int], float], repeats: int, rows: list[dict], key: str) -> tuple:
    """``best`` (backend, threads, ms, accuracy), confirmed or replaced by timing every agreeing
    configuration within :data:`REMATCH_WITHIN` of it again, in turn within every repeat.

    Why: each configuration was timed on its own, one after the other, so a slow minute of a shared
    machine decided between two configurations a few percent apart (a plan 8.6% slower than another
    run's at one level, docs/deploy.md). Timed in turn, a change of load hits them alike. The
    second round's medians are written to the candidate rows under ``key + "_rematch"``.
    """
    from nestflex.deploy.timing import alternating_median_ms

    close = [c for c, ms in times.items() if c in agreeing and ms <= best[2] * (1 + REMATCH_WITHIN)]
    if len(close) < 2:
        return best
    # in turn by blocks of REMATCH_BLOCK calls, not call by call: onnxruntime's intra-op workers spin a
    # while after each call, and call-by-call turns made a 2-thread configuration's spinning workers
    # slow the next one down (a 1-thread plan was picked that ran 1.57x slower at batch 8)
    def block(rt: Any) -> Callable[[], None]:
        return lambda: [rt(x) for _ in range(REMATCH_BLOCK)]

    rounds = max(3, repeats // REMATCH_BLOCK)
    got = {c: ms / REMATCH_BLOCK for c, ms in
           alternating_median_ms({c: block(agreeing[c][0]) for c in close}, rounds, warmup=1).items()}
    for row in rows:
        if (row["backend"], row["threads"]) in got:
            row[key + "_rematch"] = round(got[(row["backend"], row["threads"])], 4)
    name, t = min(got, key=got.get)
    return (name, t, got[(name, t)], agreeing[(name, t)][1])


def _synthesize_exits(bundle: Any, key: str, names: Sequence[str], counts: Sequence[int], repeats: int, atol: float,
                      check: np.ndarray, x1: np.ndarray, candidates: list, log: Callable[[str], None] | None,
                      budget_points: float = 1.0, reference: str = "eager") -> ExitsPlan:
    """One exit set: every backend that runs exit sets x threads; a configuration passes when every
    exit's logits, and every check sample's early-exit answer, match the reference's within
    ``atol``; the one with the least mean latency per frame on the calibration half of the
    bundle's samples wins (without samples: the fastest full path, a frame that reaches the last
    exit). Then the exits worth their time in it (:func:`choose_active_exits`), with samples."""
    from nestflex.deploy.runtime.progressive import ProgressiveRuntime
    from nestflex.deploy.timing import median_ms

    def outputs(rt: ProgressiveRuntime) -> list[np.ndarray]:
        return [np.concatenate(z) for z in zip(*(rt.all_exits(check[i:i + 1]) for i in range(check.shape[0])))]

    def answers(rt: ProgressiveRuntime) -> list[Any]:
        return [rt(check[i:i + 1]) for i in range(check.shape[0])]

    def path_ms(rt: ProgressiveRuntime) -> list[float]:
        """Per exit, one frame's early-exit call when it leaves there (the other thresholds at 1)."""
        early = rt.num_exits - 1
        forced = [[0.0 if j == k else 1.0 for j in range(early)] for k in range(rt.num_exits)]
        return [median_ms(lambda t=t: rt(x1, thresholds=t), repeats, warmup=3) for t in forced]

    def answer_err(got: list[Any], want: list[Any]) -> float:
        return max((float(np.abs(a.logits - b.logits).max()) if a.exit_index.tolist() == b.exit_index.tolist()
                    else math.inf for a, b in zip(got, want)), default=0.0)

    ref_rt = ProgressiveRuntime(bundle, None, key, plan=reference)
    ref, ref_answers, ref_ms = outputs(ref_rt), answers(ref_rt), path_ms(ref_rt)
    passing: dict[tuple[str, int], tuple[Any, list[float], dict]] = {}
    frames = calibration_split(bundle)[0][0][:64] if bundle.spec.samples is not None else None
    for name in names:
        backend = get_backend(name)
        if not backend.available() or backend.precision != "float32":
            continue
        for t in counts:
            try:
                rt = ProgressiveRuntime(bundle, None, key, ExecutionPlan((), exits={key: ExitsPlan(name, t)}))
                err = max(max(float(np.abs(a - b).max()) for a, b in zip(outputs(rt), ref)),
                          answer_err(answers(rt), ref_answers))  # the one-frame path (fused) too
                ms = path_ms(rt)
            except Exception as e:  # a backend that does not run exit sets (or this one) is not a candidate
                if "runs levels, not exit sets" not in str(e):
                    candidates.append({"level": None, "exit_set": key, "backend": name, "threads": t,
                                       "error": f"{e}"[:200]})
                continue
            ok = err <= atol and math.isfinite(err)
            row = {"level": None, "exit_set": key, "backend": name, "threads": t,
                   "latency_ms": [round(v, 4) for v in ms], "max_abs_diff": err, "agrees": ok}
            candidates.append(row)
            if ok:
                passing[(name, t)] = (rt, ms, row)
            if log is not None:
                log(f"{key}: {name:20s} threads {t}: every exit {ms[-1]:8.3f} ms, first {ms[0]:.3f} ms  "
                    f"max|diff| {err:.2e}")
    if passing and frames is not None:
        # what the choice is made on: the mean frame on the calibration half's exit distribution
        # (the full path alone favours the backbone's speed over the exits'), every candidate in
        # the same passes
        means = _mean_frame_ms({c: v[0] for c, v in passing.items()}, frames, 3)
        for c, v in passing.items():
            v[2]["mean_frame_ms"] = round(means[c], 4)
        score = means
    else:
        score = {c: v[1][-1] for c, v in passing.items()}
    if passing:
        name, t = min(passing, key=score.get)
        ms = passing[(name, t)][1]
        if log is not None and frames is not None:
            log(f"{key}: {name} threads {t}: the least mean frame, {score[(name, t)]:.3f} ms")
    else:
        name, t, ms = reference, 1, ref_ms
    entry = ExitsPlan(name, t, tuple(round(v, 4) for v in ms), tuple(round(v, 4) for v in ref_ms))
    if bundle.spec.samples is None:  # no samples: no exit distribution to choose the exits on
        return entry
    return choose_active_exits(bundle, key, entry, budget_points=budget_points, log=log)


def _mean_frame_ms(runtimes: Mapping[Any, Any], x: np.ndarray, repeats: int) -> dict[Any, float]:
    """Per runtime, the mean over the frames of ``x`` of each frame's median early-exit call (ms).
    Each repeat is one pass over the frames per runtime, the runtimes in turn: a slow spell of the
    machine hits them alike, and one session's spinning thread pool (onnxruntime's, after a run)
    slows only the first frames of the next pass, not every frame as frame-by-frame turns would.
    Each runtime runs on its own plan's threads (the backends set them per call)."""
    import statistics
    import time

    times = {k: [[] for _ in range(x.shape[0])] for k in runtimes}
    frames = [x[i:i + 1] for i in range(x.shape[0])]
    for _ in range(repeats):
        for k, rt in runtimes.items():
            rt(frames[0])  # warm: the first call of a pass also pays for the previous runtime's pool
            for i, xi in enumerate(frames):
                t0 = time.perf_counter()
                rt(xi)
                times[k][i].append(time.perf_counter() - t0)
    return {k: 1e3 * statistics.mean(statistics.median(v) for v in per) for k, per in times.items()}


def choose_active_exits(bundle: Any, key: str, entry: ExitsPlan, *, budget_points: float = 1.0, frames: int = 64,
                        repeats: int = 3, min_gain: float = 0.02, log: Callable[[str], None] | None = None
                        ) -> ExitsPlan:
    """The early exits worth their time, in ``entry``'s configuration (FlexDNN's exit insertion
    plan, measured in time instead of MACs).

    Every evaluated head costs the samples that pass it a call's worth of small operators, however
    few MACs it has; an exit few samples leave at can cost more than it saves. Backward
    elimination, measured: starting from every exit, drop the exit whose removal lowers the mean
    latency per frame most (on ``frames`` of the calibration half of the bundle's samples, the
    distribution the policy will see), while that lowers it by more than ``min_gain`` and the
    policy's top-1 accuracy on the check half stays within ``budget_points`` of every exit's.
    The result is kept only if, measured again beside every exit, it is faster.

    Returns:
        ``entry`` with ``active`` (``None`` when every exit stays), ``mean_ms`` and ``all_mean_ms``.
    """
    from nestflex.deploy.engine import operating_points
    from nestflex.deploy.runtime.progressive import ProgressiveRuntime

    (xc, _), (xk, yk) = calibration_split(bundle)
    xc = xc[:frames]
    entry = replace(entry, active=None)  # the search starts from every exit, whatever the entry kept
    plan = ExecutionPlan((), exits={key: entry})
    full = ProgressiveRuntime(bundle, None, key, plan)
    logits = full.all_exits(xk)  # every exit's logits, once
    early = full.num_exits - 1
    # the accuracy is judged at the set's thresholds and at every operating point the engine may
    # run (its calibrated threshold sweep), so no point it picks loses more than the budget
    try:
        settings = [list(p.thresholds) for p in operating_points(bundle, key)[0]]
    except Exception:  # an exit set without a usable calibration: its own thresholds only
        settings = []
    settings = [list(full.thresholds)] + [t for t in settings if t != list(full.thresholds)]

    def accuracy(active: Sequence[int], thr: Sequence[float]) -> float:
        ends = [*active, early]
        got = exit_policy.apply_policy([logits[k] for k in ends], [thr[k] for k in active], full.confidence, full.fallback)
        return float(np.mean(np.asarray(got.logits).argmax(-1) == yk))

    floors = [accuracy(range(early), t) - budget_points / 100 for t in settings]

    def within_budget(active: Sequence[int]) -> bool:
        return all(accuracy(active, t) >= f for t, f in zip(settings, floors))

    runtimes: dict[tuple[int, ...], Any] = {tuple(range(early)): full}

    def runtime(active: tuple[int, ...]) -> Any:
        if active not in runtimes:
            runtimes[active] = ProgressiveRuntime(bundle, None, key, plan, active=active)
        return runtimes[active]

    before = _fused_files(bundle, key)
    current = tuple(range(early))
    first = None
    while current:
        options = [tuple(k for k in current if k != drop) for drop in current]
        options = [a for a in options if within_budget(a)]
        if not options:
            break
        # the kept set is timed again beside its options, in the same passes: a minimum over
        # noisy options compared with an older measurement would favour dropping
        got = _mean_frame_ms({a: runtime(a) for a in [current, *options]}, xc, repeats)
        first = got[tuple(range(early))] if first is None else first
        best = min(options, key=got.get)
        if log is not None:
            log(f"{key}: exits {list(best)}: {got[best]:.3f} ms per frame (kept {list(current)}: {got[current]:.3f} ms)")
        if got[best] > got[current] * (1 - min_gain):
            break
        current = best
    kept = current if len(current) < early else None
    if kept is not None:
        final = _mean_frame_ms({"all": full, "kept": runtime(current)}, xc, repeats)  # again, side by side
        if final["kept"] >= final["all"]:
            kept = None
        mean, every = final["kept" if kept is not None else "all"], final["all"]
    else:
        mean = every = first if first is not None else _mean_frame_ms({0: full}, xc, repeats)[0]
    _drop_fused(bundle, key, created_since=before, keep=kept)
    return replace(entry, active=kept, mean_ms=round(mean, 4), all_mean_ms=round(every, 4))


def _fused_files(bundle: Any, key: str) -> set[Path]:
    """The fused graphs of exit subsets of ``key`` there are now (beside the bundle, or in the temp folder)."""
    import tempfile

    out: set[Path] = set()
    for folder in (tuned_dir(bundle), Path(tempfile.gettempdir()) / "nestflex-tuned" / tuned_dir(bundle).name):
        if folder.is_dir():
            out |= set(folder.glob(f"{key}.fused-*-a*.onnx"))
    return out


def _drop_fused(bundle: Any, key: str, created_since: set[Path], keep: Sequence[int] | None) -> None:
    """Delete the fused graphs of exit subsets the search built for ``key`` (files that were not
    there before it: another runtime's are left alone) except the one it keeps."""
    keep_tag = None if keep is None else "-a" + ".".join(str(k) for k in keep)
    for f in _fused_files(bundle, key) - created_since:
        if keep_tag is None or not f.name.endswith(f"{keep_tag}.onnx"):
            f.unlink(missing_ok=True)  # the graph first: a graph without its weights file is never left
            weights_file(f).unlink(missing_ok=True)


def _accuracy(fn: Callable[[np.ndarray], np.ndarray], x: np.ndarray, y: np.ndarray, batch: int = 64) -> float:
    """Top-1 accuracy of ``fn`` on ``(x, y)``, in batches."""
    hits = sum(int((fn(x[i:i + batch]).argmax(-1) == y[i:i + batch]).sum()) for i in range(0, x.shape[0], batch))
    return hits / x.shape[0]
