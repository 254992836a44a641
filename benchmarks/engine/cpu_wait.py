"""Does the online profiler see another process taking the CPU? Call time vs the wait for a core.

The engine's slowdown factor (SPINN) is measured / predicted time per frame. Measured as the
runtime call's wall time alone, it barely moves when busy processes take the cores: a call of
0.1-2 ms is rarely preempted (a time slice is several ms, and a thread waking from sleep is let
in first), so the cost shows up as the worker waiting for a core *before* the call. The profiler
adds that wait where Linux reports it (``OnlineProfiler.frame_started``: the watched thread's
time runnable but not running, ``/proc/thread-self/schedstat``).

This script runs one onnxruntime graph (nestflex's VGG-16 x0.25 at 32x32, random weights: only
time is measured; or ``--onnx FILE``) through the profiler's own calls, the way the engine's
worker does (``watch_thread`` once, ``frame_started`` before each call, ``record`` after), paced
at each ``--rates`` (frames/s; 0: back to back), quiet and under ``--burners`` busy processes,
the phases alternating ``--rounds`` times. Per phase: the call's median time, the mean wait per
frame, frames answered per second, and the profiler's slowdown against the quiet call time with
and without the wait. Goal: under the burners, the slowdown with the wait rises >= 1.2x over the
quiet phase's at every rate (``slowdown_sees_contention``); the call alone is reported beside.

    python benchmarks/engine/cpu_wait.py --run-name default     # ~2 min, nothing else running

Writes ``summary.json`` (with ``goals``) and ``run.json``.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: the repository root, for benchmarks.*
from benchmarks._common import add_out_args, resolve_out, write_run  # noqa: E402
from nestflex._io import write_json  # noqa: E402
from nestflex._machine import machine  # noqa: E402
from nestflex.deploy.profiler import OnlineProfiler  # noqa: E402

#: the slowdown with the wait must rise at least this much under the burners (the engine re-plans
#: on a drift of 0.15-0.25 by default)
RISE = 1.2


def _burn() -> None:
    while True:
        pass


def default_graph(folder: Path) -> Path:
    """nestflex's VGG-16 x0.25 at 32x32 (the default recipe's network), random weights, as ONNX."""
    import torch

    from nestflex.models import create_model

    path = folder / "vgg16_w025.onnx"
    model = create_model("vgg16", width=0.25).eval()
    torch.onnx.export(model, torch.zeros(1, 3, 32, 32), str(path), input_names=["x"], output_names=["y"], dynamo=False)
    return path


def session(path: Path, threads: int) -> tuple[Any, str, np.ndarray]:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads, opts.log_severity_level = threads, 1, 3
    s = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    inp = s.get_inputs()[0]
    x = np.zeros([1] + [d if isinstance(d, int) else 1 for d in inp.shape[1:]], dtype=np.float32)
    return s, inp.name, x


def phase(s: Any, name: str, x: np.ndarray, rate: float, seconds: float) -> dict[str, float]:
    """Frames through a fresh profiler the way the engine's worker records them (predicted = 1 ms:
    the ratios are rescaled against the quiet call time afterwards)."""
    prof = OnlineProfiler(window=1_000_000)
    prof.watch_thread()
    calls = []
    period = 1.0 / rate if rate > 0 else 0.0
    start = nxt = time.perf_counter()
    while (now := time.perf_counter()) - start < seconds:
        prof.frame_started()
        t = time.perf_counter()
        s.run(None, {name: x})
        ms = 1e3 * (time.perf_counter() - t)
        prof.record("app", 0, None, ms, 1.0)
        calls.append(ms)
        if period:
            nxt += period
            if (d := nxt - time.perf_counter()) > 0:
                time.sleep(d)
    elapsed = time.perf_counter() - start
    st = prof.stats()
    prof.close()
    # wait_ms: the worker's mean wait for a CPU per frame, before and during its calls
    return {"call_ms": statistics.median(calls), "wait_ms": st["cpu_wait_ms"], "fps": len(calls) / elapsed,
            "contention": st["contention"], "ratio_with_wait": st["slowdown"], "frames": len(calls)}


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--onnx", type=Path, default=None, help="graph to run (default: VGG-16 x0.25, 32x32)")
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="onnxruntime intra-op threads")
    p.add_argument("--rates", type=float, nargs="+", default=[0.0, 100.0, 1000.0],
                   help="frames/s offered (0: back to back)")
    p.add_argument("--burners", type=int, default=3, help="busy processes in the burn phases")
    p.add_argument("--seconds", type=float, default=3.0, help="per phase and rate")
    p.add_argument("--rounds", type=int, default=2, help="quiet/burn alternations")
    add_out_args(p, "summary.json and run.json")
    args = p.parse_args(argv)
    out = resolve_out(args, __file__)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        graph = args.onnx or default_graph(Path(tmp))
        rows: dict[str, Any] = {}
        for threads in args.threads:
            s, name, x = session(graph, threads)
            for _ in range(50):
                s.run(None, {name: x})
            got: dict[tuple[bool, float], list[dict[str, float]]] = {}
            for _ in range(args.rounds):
                for burn in (False, True):
                    procs = [mp.Process(target=_burn, daemon=True) for _ in range(args.burners if burn else 0)]
                    for q in procs:
                        q.start()
                    time.sleep(0.3)
                    try:
                        for rate in args.rates:
                            got.setdefault((burn, rate), []).append(phase(s, name, x, rate, args.seconds))
                    finally:
                        for q in procs:
                            q.terminate()
                            q.join()
            for rate in args.rates:
                keys = ("call_ms", "wait_ms", "fps", "contention", "ratio_with_wait")
                med = {burn: {k: statistics.median(r[k] for r in got[(burn, rate)]) for k in keys}
                       for burn in (False, True)}
                quiet_call = med[False]["call_ms"]
                row = {"quiet": med[False], "burn": med[True],
                       # the profiler's slowdown as the engine reads it, against the quiet call time
                       "slowdown_call_only": {k: round(med[b]["call_ms"] / quiet_call, 3)
                                              for k, b in (("quiet", False), ("burn", True))},
                       "slowdown_with_wait": {k: round(med[b]["ratio_with_wait"] / quiet_call, 3)
                                              for k, b in (("quiet", False), ("burn", True))}}
                row["rise_call_only"] = round(row["slowdown_call_only"]["burn"] / row["slowdown_call_only"]["quiet"], 3)
                row["rise_with_wait"] = round(row["slowdown_with_wait"]["burn"] / row["slowdown_with_wait"]["quiet"], 3)
                rows[f"t{threads}@{'max' if rate == 0 else int(rate)}"] = row
                print(f"threads {threads}, {'back to back' if rate == 0 else f'{rate:g} frames/s'}: call "
                      f"{med[False]['call_ms']:.3f} -> {med[True]['call_ms']:.3f} ms, wait per frame "
                      f"{med[False]['wait_ms']:.3f} -> {med[True]['wait_ms']:.3f} ms, "
                      f"frames/s {med[False]['fps']:.0f} -> {med[True]['fps']:.0f}; slowdown rise: call only {row['rise_call_only']:.2f}x, with the wait "
                      f"{row['rise_with_wait']:.2f}x", flush=True)
    rises = {k: v["rise_with_wait"] for k, v in rows.items()}
    goals = {"slowdown_sees_contention": {
        "target": f"under {args.burners} busy processes the profiler's slowdown (with the wait) rises >= {RISE}x over "
                  f"the quiet phase's, at every rate and thread count",
        "measured": rises, "call_only": {k: v["rise_call_only"] for k, v in rows.items()},
        "met": bool(rises) and all(v >= RISE for v in rises.values())}}
    summary = {"question": "Does the online profiler see another process taking the CPU?", "machine": machine(),
               "graph": str(args.onnx) if args.onnx else "nestflex vgg16 width 0.25, 32x32, random weights",
               "settings": {k: v for k, v in vars(args).items() if k not in ("out", "onnx")},
               "rows": rows, "goals": goals, "seconds": round(time.perf_counter() - t0, 1)}
    write_json(out / "summary.json", summary)
    write_run(out, __file__, argv)
    return summary


if __name__ == "__main__":
    main()
