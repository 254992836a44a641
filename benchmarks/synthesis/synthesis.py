"""Execution synthesis (Cappuccino, METHODS §5): backend x threads per level, measured here.

For each bundle (``--bundles``): :func:`nestflex.deploy.backends.synthesize` measures every
installed backend (eager op program, channels-last, onnxruntime with all graph optimisations, and
onnxruntime int8 and mixed precision when the bundle ships samples) at every thread count for every level (batch 1,
median of ``--repeats``), keeps the float32 configurations whose logits match the eager program
within 1e-4 and the int8/mixed ones within ``--budget`` points of its accuracy on the bundle's check
samples, and picks the fastest per level. The best float32 configuration per level is reported
too (the float32 goal), and, for a bundle a recipe wrote (its run folder holds
``baseline/config.json``), every level's float32 and int8 accuracy on ``--test-samples`` of the
run's own test split (int8 must hold there too, not only on the samples it was judged on).
Besides, per level: onnxruntime with its default session options (Cappuccino's other
baseline, "the library as shipped"), and the level switch time with the plan (a switch into an
onnxruntime level builds its session).

Reported per level: the speed-up of the plan over single-thread eager (Cappuccino's baseline)
and over default onnxruntime, each level's time fraction against its MACs fraction, before
(eager, 1 thread) and after (the plan); the search's own time.

Per batch size in ``--batches`` above 1: the plan's choice per level at that size, its time per
sample against eager's at one thread, and each level's time fraction against its MACs fraction.

Per exit set: the plan's configuration, each exit's latency (a sample leaving there: the stages
and heads up to it), and early exit run on ``--exit-samples`` of the bundle's check samples at batch
1 with the bundle's thresholds: the mean latency per sample against the largest level's (its
*latency saving*) beside the mean MACs against the backbone's (its *MACs saving*), with the plan
and with eager at 1 thread.

Resident memory per level, with the plan and eager: RSS measured in a child process at each level
minus RSS once the runtime is gone, against the largest level's weight bytes.

Writes ``--out/summary.json`` (with the ``goals`` object) and ``--out/latency_vs_macs.png``.

Example:
    python benchmarks/synthesis/synthesis.py --bundles runs/synth_w05/bundle.nfx runs/mnist_w05/bundle.nfx \\
        --out runs/bench_synthesis
"""

from __future__ import annotations

from nestflex.deploy.runtime.capacity import CapacityRuntime
from nestflex.deploy.runtime.progressive import ProgressiveRuntime
import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

from nestflex._io import write_json
from nestflex._machine import machine
from nestflex.deploy import load
from nestflex.deploy.tune import synthesize
from nestflex.deploy.backends.padding import PaddingError
from nestflex.deploy.timing import median_ms

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: the repository root, for benchmarks.*
from benchmarks._common import add_out_args, recipe_datamodule, resolve_out, write_run  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bundles", nargs="+", required=True)
    add_out_args(p, "summary.json, latency_vs_macs.png and run.json")
    p.add_argument("--repeats", type=int, default=50)
    p.add_argument("--threads", type=int, nargs="+", default=None, help="default: 1..cores")
    p.add_argument("--switches", type=int, default=5, help="timed switches per ordered level pair")
    p.add_argument("--budget", type=float, default=1.0, help="accuracy points an int8 level may lose")
    p.add_argument("--test-samples", type=int, default=2000,
                   help="test images per level for the int8 accuracy check on a recipe run's test split (0: none)")
    p.add_argument("--data-dir", default="data", help="where the recipe looked for CIFAR-10 (else synthetic)")
    p.add_argument("--exit-samples", type=int, default=300, help="check samples early exit is timed on, one by one")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64],
                   help="batch sizes every configuration is timed at (the plan's choice per size)")
    args = p.parse_args(argv)
    resolve_out(args, __file__)
    return args


def accuracy_on_test(bundle, n: int, data_dir: str) -> dict[str, Any] | None:
    """Per level, float32 (eager) and int8 top-1 on the first ``n`` test images of the recipe run the
    bundle sits in; ``None`` for a bundle outside a recipe run."""
    config_path = Path(bundle.path).parent / "baseline" / "config.json"
    if n <= 0 or not config_path.is_file() or bundle.spec.samples is None:
        return None
    from nestflex._io import read_json
    from nestflex.deploy.backends.plan import ExecutionPlan, LevelPlan

    dm, message, synthetic = recipe_datamodule(read_json(config_path), data_dir, batch_size=250)
    dm.setup("test")
    xs, ys, have = [], [], 0
    for x, y in dm.test_dataloader():
        xs.append(x)
        ys.append(y)
        have += len(y)
        if have >= n:
            break
    x, y = torch.cat(xs)[:n], torch.cat(ys)[:n]
    plans = {"float32": None}
    for name in ("onnxruntime_int8", "onnxruntime_mixed", "onnxruntime_int8_pad8", "onnxruntime_mixed_pad8"):
        if "mixed" not in name or bundle.spec.precision is not None:
            plans[name.removeprefix("onnxruntime_")] = ExecutionPlan(tuple(LevelPlan(name, 1)
                                                                           for _ in range(bundle.num_levels)))
    rows = []
    for k in range(bundle.num_levels):
        accs = {}
        for name, p in plans.items():
            try:
                rt = CapacityRuntime(bundle, k, plan=p)
                with torch.inference_mode():
                    accs[name] = sum(int((rt(x[i:i + 250]).argmax(-1) == y[i:i + 250]).sum())
                                     for i in range(0, n, 250)) / n
            except PaddingError:  # a level the padding does not support has no padded graph
                continue
        rows.append({"level": k, **accs, "drop_points": round(100 * (accs["float32"] - accs["int8"]), 2),
                     **{f"{p}_drop_points": round(100 * (accs["float32"] - accs[p]), 2)
                        for p in ("mixed", "int8_pad8", "mixed_pad8") if p in accs}})
    return {"samples": n, "synthetic": synthetic, "data": message, "levels": rows}


def ort_default_ms(bundle, level: int, repeats: int) -> float | None:
    """The level's ONNX file in onnxruntime with default session options."""
    try:
        import onnxruntime as ort
    except ImportError:
        return None
    entry = next((o for o in bundle.spec.onnx if o.kind == "level" and o.extra.get("level") == level), None)
    if entry is None:
        return None
    session = ort.InferenceSession(str(bundle.file(entry.file)), providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    x = torch.randn(1, *bundle.spec.input.shape).numpy()
    return median_ms(lambda: session.run(None, {name: x}), repeats, warmup=3)


def switch_ms(bundle, plan, switches: int, cached: bool = True) -> dict[str, float]:
    """Level switch times with ``plan`` over every ordered level pair; ``cached=False`` removes the
    saved optimised onnxruntime graphs before each switch (a session built from the bundle's graph)."""
    from nestflex.deploy.backends.base import tuned_dir

    rt = CapacityRuntime(bundle, 0, plan=plan)
    times = []
    for a in range(bundle.num_levels):
        for b in range(bundle.num_levels):
            if a == b:
                continue
            for _ in range(switches):
                rt.set_level(a)
                if not cached:
                    for f in tuned_dir(bundle).glob("*.optimized.onnx"):
                        f.unlink()
                t = time.perf_counter()
                rt.set_level(b)
                times.append((time.perf_counter() - t) * 1000)
    return {"median_ms": statistics.median(times), "max_ms": max(times)}


def resident_memory(path: str, plan) -> dict[str, Any]:
    """Measured resident memory per level with ``plan`` (``None``: eager) in a fresh process: RSS at
    each level (after a pass over every level, sessions built and run; freed memory returned to
    the OS) minus RSS once the runtime is gone, against the level's weight bytes."""
    import json
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        plan_file = "eager"
        if plan is not None:
            plan_file = str(Path(tmp) / "plan.json")
            write_json(plan_file, plan.to_json())
        out = subprocess.run([sys.executable, __file__, "--memory-probe", path, plan_file], capture_output=True,
                             text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _memory_probe(path: str, plan_file: str) -> dict[str, Any]:
    import ctypes
    import gc
    import json
    import os

    from nestflex.deploy.backends.plan import ExecutionPlan

    libc = ctypes.CDLL("libc.so.6")

    def rss() -> int:
        gc.collect()
        libc.malloc_trim(0)
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    bundle = load(path)
    plan = None if plan_file == "eager" else ExecutionPlan.from_json(json.loads(Path(plan_file).read_text()))
    x = torch.randn(1, *bundle.spec.input.shape)
    rt = CapacityRuntime(bundle, 0, plan=plan)
    for _ in range(2):  # every session built and run once: one-time library and allocator costs paid
        for k in range(bundle.num_levels):
            rt.set_level(k)
            rt(x)
    rows = []
    for k in range(bundle.num_levels):
        rt.set_level(k)
        for _ in range(5):
            rt(x)
        rows.append({"level": k, "backend": rt.backend, "rss": rss(), "resident_bytes": rt.resident_bytes,
                     "level_bytes": rt.level_bytes(k)})
    del rt
    base = rss()
    top = rows[-1]["level_bytes"]
    for r in rows:
        r["rss_delta"] = r.pop("rss") - base
        r["rss_vs_largest_level"] = r["rss_delta"] / top
        r["accounted_vs_largest_level"] = r["resident_bytes"] / top
    return {"base_rss": base, "largest_level_bytes": top, "levels": rows}


def frame_macs(spec, active) -> list[float]:
    """Per exit, the MACs of a frame that leaves there when only the early exits ``active`` run:
    ``spec.macs[k]`` (the backbone up to exit k and every head up to it) less the heads of the
    dropped exits before k (FlexDNN's searched heads are up to 2% of the backbone each)."""
    bb, early = spec.backbone_macs, len(spec.macs) - 1
    prefix = [round(p * bb) for p in spec.positions] + [bb]
    heads = [m - p for m, p in zip(spec.macs, prefix)]  # every head up to k, evaluated
    own = [heads[0]] + [heads[k] - heads[k - 1] for k in range(1, early)]
    dropped = set(range(early)) - set(active)
    return [spec.macs[k] - sum(own[j] for j in dropped if j < k) for k in range(early + 1)]


def exit_savings(bundle, plan, key: str, n: int, repeats: int = 5) -> dict[str, Any]:
    """Early exit at batch 1 on ``n`` of the bundle's check samples: mean latency per sample and mean
    MACs, against the largest level's latency and the backbone's MACs, with ``plan`` (its entry for
    this set, the exits it keeps, and its largest level), with the plan's configuration but every
    exit (``plan_every_exit``, timed in the same passes: what the time-aware exit choice gives), and
    with eager at 1 thread (``plan=None``)."""
    from nestflex.deploy.backends.plan import ExecutionPlan, LevelPlan
    from nestflex.deploy.backends.base import calibration_split

    x, y = calibration_split(bundle)[1]
    x, y = x[:n], y[:n]
    spec = bundle.spec.exit_set(key)
    out = {}
    ep = plan.exits.get(key)
    for label, p in (("plan", plan), ("eager", None)):
        if p is None:
            torch.set_num_threads(1)
        level = CapacityRuntime(bundle, bundle.num_levels - 1, plan=p)  # sets the level's planned threads
        # the backbone alone on the exits' own backend and threads: what the exits add or save there
        same = level if p is None or ep is None else CapacityRuntime(bundle, 
            bundle.num_levels - 1, plan=ExecutionPlan(tuple(LevelPlan(ep.backend, ep.threads) for _ in bundle.levels)))
        progs = {label: ProgressiveRuntime(bundle, exit_set=key, plan=p)}
        if p is not None and ep is not None and ep.active is not None:  # the same configuration, every exit
            progs["plan_every_exit"] = ProgressiveRuntime(bundle, exit_set=key, plan=p, active=range(len(spec.names) - 1))
        runs = {**progs, "level": level, "same": same}
        times = {k: [[] for _ in range(len(x))] for k in runs}
        exits, hits = {k: [] for k in progs}, {k: 0 for k in progs}
        # a pass over the samples per runtime, the runtimes in turn, `repeats` rounds: the machine's
        # slow spells (which shift a pass by up to a third here) hit every runtime alike, and one
        # session's spinning pool slows only the first frames of the next pass, not every frame
        for r in range(repeats):
            for name, fn in runs.items():
                fn(x[:1])  # warm: the first call of a pass pays for the previous runtime's pool
                for i in range(len(x)):
                    xi = x[i:i + 1]
                    t = time.perf_counter()
                    res = fn(xi)
                    times[name][i].append(time.perf_counter() - t)
                    if name in progs and r == 0:
                        exits[name].append(int(res.exit_index[0]))
                        hits[name] += int(res.logits.argmax(-1)[0] == y[i])
        ms = {k: 1e3 * statistics.mean(statistics.median(v) for v in per) for k, per in times.items()}
        for name, prog in progs.items():
            cost = frame_macs(spec, prog.active)
            macs = statistics.mean(cost[k] for k in exits[name])
            out[name] = {"backend": prog.backend, "active": list(prog.active), "level_backend": level.backend,
                         "mean_ms": ms[name], "largest_level_ms": ms["level"],
                         "latency_saving": 1 - ms[name] / ms["level"], "backbone_same_backend_ms": ms["same"],
                         "latency_saving_same_backend": 1 - ms[name] / ms["same"], "mean_macs": macs,
                         "macs_saving": 1 - macs / spec.backbone_macs, "accuracy": hits[name] / len(x),
                         "exit_share": [exits[name].count(k) / len(exits[name]) for k in range(len(spec.names))]}
    return {"exit_set": key, "samples": len(x), "thresholds": list(spec.thresholds),
            "config": None if ep is None else ep.to_json(),
            "candidates": [c for c in plan.candidates if c.get("exit_set") == key], **out}


def one(path: str, args: argparse.Namespace) -> dict[str, Any]:
    bundle = load(path)
    start = time.perf_counter()
    plan = synthesize(bundle, threads=args.threads, repeats=args.repeats, budget_points=args.budget,
                      batches=args.batches)
    search_s = time.perf_counter() - start
    macs = [float(r["macs"]) for r in bundle.levels]
    rows = []
    torch.set_num_threads(1)
    for k, lp in enumerate(plan.levels):
        default = ort_default_ms(bundle, k, args.repeats)
        rows.append({"level": k, "backend": lp.backend, "threads": lp.threads, "plan_ms": lp.latency_ms,
                     "eager_1thread_ms": lp.eager_ms, "ort_default_ms": default,
                     "speedup_vs_eager": lp.eager_ms / lp.latency_ms,
                     "speedup_vs_ort_default": None if default is None else default / lp.latency_ms,
                     "macs_fraction": macs[k] / macs[-1]})
    candidates = [c for c in plan.candidates if c.get("level") is not None]  # the levels' (exit sets' apart)
    for r in rows:
        r["time_fraction_before"] = r["eager_1thread_ms"] / rows[-1]["eager_1thread_ms"]
        r["time_fraction_after"] = r["plan_ms"] / rows[-1]["plan_ms"]
        for precision, backends in (("float32", {"eager", "channels_last", "onnxruntime"}),
                                    ("int8", {"onnxruntime_int8"}), ("mixed", {"onnxruntime_mixed"})):
            ok = [c for c in candidates if c["level"] == r["level"] and c.get("agrees") and c["backend"] in backends]
            best = min(ok, key=lambda c: c["latency_ms"]) if ok else None
            r[f"best_{precision}"] = None if best is None else {
                k: best[k] for k in ("backend", "threads", "latency_ms", "accuracy", "eager_accuracy") if k in best}
            if best is not None:
                r[f"best_{precision}"]["speedup_vs_eager"] = r["eager_1thread_ms"] / best["latency_ms"]
        r["accuracy"] = plan.levels[r["level"]].accuracy
    r_fit = fixed_cost(candidates, macs)
    same_threads = {}
    for t in sorted({c["threads"] for c in candidates if "latency_ms" in c}):
        best = {}
        for c in candidates:
            if c.get("agrees") and c["threads"] == t and c["latency_ms"] < best.get(c["level"], (1e9,))[0]:
                best[c["level"]] = (c["latency_ms"], c["backend"])
        eager = {c["level"]: c["latency_ms"] for c in candidates if c.get("backend") == "eager" and c["threads"] == t
                 and "latency_ms" in c}
        same_threads[str(t)] = [{"level": k, "backend": best[k][1], "speedup_vs_eager": eager[k] / best[k][0]}
                                for k in sorted(best) if k in eager]
    uncached = switch_ms(bundle, plan, args.switches, cached=False)
    exits = [exit_savings(bundle, plan, key, args.exit_samples) for key in bundle.exit_sets
             if bundle.spec.samples is not None and args.exit_samples > 0]
    batches = [{"batch": b, "levels": [
        {"level": k, "backend": lp.backend, "threads": lp.threads, "ms_per_sample": lp.latency_ms / b,
         "eager_1thread_ms_per_sample": None if lp.eager_ms is None else lp.eager_ms / b,
         "speedup_vs_eager": None if not lp.eager_ms else lp.eager_ms / lp.latency_ms,
         "time_fraction": lp.latency_ms / lps[-1].latency_ms, "macs_fraction": macs[k] / macs[-1]}
        for k, lp in enumerate(lps)]} for b, lps in sorted(plan.batches.items())]
    return {"bundle": path, "levels": rows, "exits": exits, "batches": batches, "search_seconds": search_s,
            "switch": switch_ms(bundle, plan, args.switches),
            "memory": {"plan": resident_memory(path, plan), "eager": resident_memory(path, None)},
            "switch_without_saved_graphs": uncached,
            "budget_points": plan.budget_points, "check_samples": plan.check_samples,
            "test": accuracy_on_test(bundle, args.test_samples, args.data_dir),
            "candidates": candidates, "best_at_same_threads": same_threads, "fixed_cost": r_fit,
            "time_fractions": time_fractions(candidates, macs)}


def time_fractions(candidates: list[dict[str, Any]], macs: list[float]) -> list[dict[str, Any]]:
    """Per backend, thread count and batch size, every level's time fraction of the largest level
    on that same configuration, and the worst (time fraction / MACs fraction): whether a backend
    turns MACs into time, apart from which backend the plan picks per level."""
    rows = []
    for name, t in sorted({(c["backend"], c["threads"]) for c in candidates if "latency_ms" in c}):
        per = {c["level"]: c for c in candidates if c["backend"] == name and c["threads"] == t and "latency_ms" in c}
        if sorted(per) != list(range(len(macs))):
            continue
        sizes = {"1": {k: c["latency_ms"] for k, c in per.items()}}
        for b in sorted({b for c in per.values() for b in c.get("batch_ms", {})}, key=int):
            if all(b in c.get("batch_ms", {}) for c in per.values()):
                sizes[b] = {k: c["batch_ms"][b] for k, c in per.items()}
        for b, ms in sizes.items():
            top = ms[len(macs) - 1]
            frac = [ms[k] / top for k in range(len(macs))]
            rows.append({"backend": name, "threads": t, "batch": int(b), "time_fraction": frac, "largest_ms": top,
                         "worst_ratio": max(f / (m / macs[-1]) for f, m in zip(frac, macs))})
    eager = {x["batch"]: x["largest_ms"] for x in rows if x["backend"] == "eager" and x["threads"] == 1}
    for x in rows:  # the speed goal: >= 2x eager at one thread; a slow backend follows MACs for free
        x["fast"] = x["batch"] in eager and x["largest_ms"] <= eager[x["batch"]] / 2
    return rows


def fixed_cost(candidates: list[dict[str, Any]], macs: list[float]) -> list[dict[str, Any]]:
    """Per backend and thread count, a least-squares fit ``latency = fixed + per_mac * MACs`` over the
    levels (batch 1): ``fixed`` is what a call costs whatever the width (per-operator and per-call
    overhead), the reason a narrower level is not proportionally faster; ``fixed_share`` is its
    part of the largest level's latency."""
    rows = []
    for name, t in sorted({(c["backend"], c["threads"]) for c in candidates if "latency_ms" in c}):
        pts = [(macs[c["level"]], c["latency_ms"]) for c in candidates
               if c["backend"] == name and c["threads"] == t and "latency_ms" in c]
        if len(pts) < 2:
            continue
        mx, my = statistics.mean(p[0] for p in pts), statistics.mean(p[1] for p in pts)
        var = sum((p[0] - mx) ** 2 for p in pts)
        slope = sum((p[0] - mx) * (p[1] - my) for p in pts) / var if var > 0 else 0.0
        fixed = my - slope * mx
        top = max(pts)[1]
        rows.append({"backend": name, "threads": t, "fixed_ms": fixed, "ms_per_gmac": slope * 1e9,
                     "fixed_share": fixed / top if top > 0 else None})
    return rows


def plot(results: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(5.2 * len(results), 4.2), squeeze=False)
    for ax, res in zip(axes[0], results):
        m = [r["macs_fraction"] for r in res["levels"]]
        ax.plot(m, [r["time_fraction_before"] for r in res["levels"]], "o-", label="eager, 1 thread")
        ax.plot(m, [r["time_fraction_after"] for r in res["levels"]], "s-", label="synthesised plan")
        ax.plot([0, 1], [0, 1], "k:", lw=1, label="time = MACs")
        ax.set_xlabel("MACs fraction of the largest level")
        ax.set_ylabel("time fraction of the largest level")
        ax.set_title(Path(res["bundle"]).parent.name, fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def goals_of(results: list[dict[str, Any]], budget: float = 1.0) -> dict[str, Any]:
    largest = {r["bundle"]: (r["levels"][-1]["best_float32"] or {}).get("speedup_vs_eager", 0.0) for r in results}
    int8 = {}
    for r in results:
        top, test = r["levels"][-1]["best_int8"], r["test"]
        drop = None if test is None else test["levels"][-1]["drop_points"]
        int8[r["bundle"]] = None if top is None else {
            "speedup_vs_eager": top["speedup_vs_eager"], "check_drop_points": round(
                100 * (top["eager_accuracy"] - top["accuracy"]), 2), "test_drop_points": drop}
    int8_met = bool(int8) and all(v is not None and v["speedup_vs_eager"] >= 3 and v["check_drop_points"] <= budget
                                  and v["test_drop_points"] is not None and v["test_drop_points"] <= budget
                                  for v in int8.values())
    ratio = {r["bundle"]: max(x["time_fraction_after"] / x["macs_fraction"] for x in r["levels"]) for r in results}
    best_config = {r["bundle"]: min((x for x in r["time_fractions"] if x["fast"]), key=lambda x: x["worst_ratio"],
                                    default=None) for r in results}
    before = {r["bundle"]: max(x["time_fraction_before"] / x["macs_fraction"] for x in r["levels"]) for r in results}
    frame = 1000 / 30
    switch = {r["bundle"]: r["switch"]["max_ms"] for r in results}
    memory = {r["bundle"]: {"rss": max(x["rss_vs_largest_level"] for x in r["memory"]["plan"]["levels"]),
                            "accounted": max(x["accounted_vs_largest_level"] for x in r["memory"]["plan"]["levels"])}
              for r in results}
    saving = {}
    for r in results:
        for e in r.get("exits", []):
            m = e["plan"]
            saving[f"{r['bundle']}:{e['exit_set']}"] = {
                "latency_saving": round(m["latency_saving"], 4), "macs_saving": round(m["macs_saving"], 4),
                "ratio": round(m["latency_saving"] / m["macs_saving"], 3) if m["macs_saving"] > 0 else None,
                "ratio_same_backend": round(m["latency_saving_same_backend"] / m["macs_saving"], 3)
                if m["macs_saving"] > 0 else None,
                "eager_ratio": round(e["eager"]["latency_saving"] / e["eager"]["macs_saving"], 3)
                if e["eager"]["macs_saving"] > 0 else None, "active": m["active"]}
            every = e.get("plan_every_exit")
            if every is not None and every["macs_saving"] > 0:  # the same configuration with every exit
                saving[f"{r['bundle']}:{e['exit_set']}"].update(
                    ratio_every_exit=round(every["latency_saving"] / every["macs_saving"], 3),
                    ratio_same_backend_every_exit=round(every["latency_saving_same_backend"] / every["macs_saving"], 3))
    return {
        "largest_level_float32": {"target": ">= 2x today's eager runtime (float32, batch 1)", "measured": largest,
                                  "met": all(v >= 2 for v in largest.values()),
                                  "note": "best float32 configuration vs eager at 1 thread; it may use more threads "
                                          "(the per-thread comparison is best_at_same_threads)"},
        "time_follows_macs": {"target": "each level's time fraction within 1.3x of its MACs fraction",
                              "measured": {"after": ratio, "before": before, "best_single_configuration": {
                                  k: None if v is None else {x: v[x] for x in ("backend", "threads", "batch", "worst_ratio")}
                                  for k, v in best_config.items()}},
                              "met": all(v <= 1.3 for v in ratio.values()),
                              "note": "worst level's (time fraction / MACs fraction), judged on the plan at batch 1 "
                                      "(after; before: eager at 1 thread); best_single_configuration: the one backend, "
                                      "thread count and batch size (results[].time_fractions) at least 2x faster "
                                      "than eager at one thread on the largest level whose levels come closest; "
                                      "results[].fixed_cost: per backend, the fitted latency a level costs whatever "
                                      "its width; why: benchmarks/synthesis/level_profile.py splits it by operator (the "
                                      "layers and operators whose cost does not shrink with the level)"},
        "switch_within_a_frame": {"target": f"a level switch within one frame period at 30 fps ({frame:.1f} ms)",
                                  "measured": switch, "met": all(v <= frame for v in switch.values()),
                                  "note": "worst switch over every ordered level pair"},
        "resident_memory": {"target": "resident memory within 1.1x of the largest level's weights, with the plan",
                            "measured": memory,
                            "met": all(max(v.values()) <= 1.1 for v in memory.values()),
                            "note": "worst level: measured RSS growth over the process without the runtime (rss) "
                                    "and the runtime's own account (accounted), over the largest level's weight "
                                    "bytes; the eager figures are in results[].memory.eager"},
        "early_exit_saving": {"target": "early exit's mean latency saving >= 0.8x its mean MACs saving (batch 1)",
                              "measured": saving or None,
                              "met": bool(saving) and all(v["ratio"] is not None and v["ratio"] >= 0.8
                                                          for v in saving.values()),
                              "note": "per exit set, with the plan: 1 - mean latency per sample / the largest level's "
                                      "(planned) latency, against 1 - mean MACs / the backbone's; ratio_same_backend: "
                                      "against the backbone alone on the exits' backend and threads; eager_ratio: the "
                                      "same at 1 thread eager; active: the early exits the plan keeps (the "
                                      "time-aware choice), *_every_exit: the same configuration with every exit; "
                                      "None: no samples in the bundle or no exits"},
        "int8": {"target": f">= 3x today's eager runtime with int8 within {budget:g} point(s) (largest level, batch 1)",
                 "measured": int8, "met": int8_met,
                 "note": "int8 (onnxruntime QDQ, calibrated on half the bundle's samples) vs eager at 1 thread; the "
                         "drop is judged on the other half (check) and on the recipe run's test split (test); None: "
                         "no int8 candidate (no samples) or not a recipe run"},
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--memory-probe"]:  # the child process of resident_memory()
        import json

        print(json.dumps(_memory_probe(argv[1], argv[2])))
        return 0
    args = parse_args(argv)
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    results = []
    for path in args.bundles:
        res = one(path, args)
        results.append(res)
        for r in res["levels"]:
            print(f"{Path(path).parent.name} level {r['level']}: {r['backend']:13s} x{r['threads']} "
                  f"{r['plan_ms']:.3f} ms  vs eager {r['speedup_vs_eager']:.2f}x  vs ort default "
                  f"{r['speedup_vs_ort_default'] or float('nan'):.2f}x  time/MACs {r['time_fraction_before']:.2f}->"
                  f"{r['time_fraction_after']:.2f} of {r['macs_fraction']:.2f}", flush=True)
    summary = {"benchmark": "synthesis", "machine": machine(), "seconds_total": round(time.time() - started, 1),
               "results": results, "goals": goals_of(results, args.budget),
               "args": {**vars(args), "out": str(out)}}
    write_json(out / "summary.json", summary)
    write_run(out, __file__, argv)
    plot(results, out / "latency_vs_macs.png")
    for k, g in summary["goals"].items():
        print(f"goal {k}: met={g['met']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
