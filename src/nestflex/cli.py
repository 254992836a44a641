"""The ``nestflex`` command: inspect, benchmark, run and serve bundles.

    nestflex inspect runs/vgg_cifar/bundle.nfx          # levels, exits, splits, sizes
    nestflex bench runs/vgg_cifar/bundle.nfx --repeats 20
    nestflex run a.nfx b.nfx --fps 30 --memory-mb 8 --seconds 20   # live: the engine serves both
    nestflex serve runs/vgg_cifar/bundle.nfx --port 50051          # split inference: the tail server
    nestflex tune runs/vgg_cifar/bundle.nfx                         # fastest backend x threads per level
    nestflex latency-table specs.json --threads 1 --batch 1 --out table.json   # per-layer times, for pruning
    python -m nestflex inspect ...               # the same without the console script

Light on purpose: it imports the deploy runtime only (DESIGN invariant 6), so every verb runs on
the base install (numpy and onnxruntime; ``serve`` needs the ``serve`` extra's gRPC; ``tune``
measures the int8 and padded candidates where ``nestflex[tune]`` is installed). The multi-tenant
simulation of the scheduler is a benchmark, not a runtime verb: ``python benchmarks/engine/multitenant.py``.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Sequence

from nestflex.deploy.runtime.capacity import CapacityRuntime
from nestflex.deploy.runtime.progressive import ProgressiveRuntime

__all__ = ["main", "inspect_table", "bench_bundle", "run_live"]


def _table(header: Sequence[str], rows: list[Sequence[Any]]) -> str:
    cells = [[str(c) for c in header]] + [["-" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _mb(n: int | None) -> str:
    return "-" if n is None else f"{n / 1e6:.3f}"


def inspect_table(bundle) -> str:
    """The bundle as text tables: levels, exits, split points, files."""
    m = bundle.manifest
    p = m["producer"]
    out = [f"bundle {bundle.path}  (schema {bundle.spec.schema_version}, nestflex {p['version']}, torch {p.get('torch', '?')})",
           f"input {m['input']['dtype']} {m['input']['layout']} {m['input']['shape']}  mean {m['input']['mean']}  "
           f"std {m['input']['std']}  classes {m['num_classes']}", ""]
    rows = [[r["level"], r.get("accuracy"), f"{r['params']:,}", f"{r['macs']:,}", _mb(r.get("weight_bytes")),
             (r.get("latency_ms") or {}).get("1")] for r in bundle.levels]
    out += [f"levels ({bundle.num_levels}, nested={m['capacity']['nested']})",
            _table(["level", "accuracy", "params", "MACs", "weights MB", "latency ms (batch 1)"], rows), ""]
    for key, ex in bundle.exit_sets.items():
        out += [_exit_set_table(key, ex), ""]
    if not bundle.exit_sets:
        out += ["exits: none", ""]
    rows = []
    for s in bundle.splits:
        q = s.get("quantization") or {}
        bits = (q.get("lowest_bits") or {}).get("1")
        rows.append([s["name"], " + ".join("x".join(map(str, shape)) for _, shape in s["tensors"]),
                     f"{s['float32_bytes']:,}", f"{s['macs_fraction']:.3f}", bits])
    out += [f"split points ({len(rows)})",
            _table(["split", "tensors", "float32 bytes/sample", "MACs fraction", "lowest bits (1 pt)"], rows), ""]
    files = m["files"]
    groups: dict[str, int] = {}
    for rel, f in files.items():
        groups[rel.split("/")[0] if "/" in rel else rel] = groups.get(rel.split("/")[0] if "/" in rel else rel, 0) + f["bytes"]
    total = sum(groups.values()) + (bundle.path / "manifest.json").stat().st_size
    rows = [[k, f"{v:,}"] for k, v in sorted(groups.items())] + [["manifest.json", f"{(bundle.path / 'manifest.json').stat().st_size:,}"],
                                                                ["total", f"{total:,}"]]
    out += [f"sizes (largest level {m['capacity']['largest_level_bytes']:,} weight bytes)", _table(["files", "bytes"], rows)]
    return "\n".join(out)


def _head_widths(h: dict[str, Any]) -> str:
    sp = h.get("stem_pool", 1)  # bundles before stem_pool: never pooled
    return f"{h.get('widths')}" + (f" after {sp}x{sp} pooling" if sp > 1 else "")


def _exit_set_table(key: str, ex: dict[str, Any]) -> str:
    """One exit set (``exits`` or ``flex_exits``: same layout) as a table; FlexDNN heads also show
    how many of the tapped layer's filters feed them and their conv widths."""
    thr = [*ex["thresholds"], None]
    flex = any("filters" in h for h in ex["heads"])
    header = ["exit", "name", "MACs fraction", "MACs", "threshold"] + (["filters", "head widths"] if flex else [])
    rows = []
    for k, (n, pos, mac) in enumerate(zip(ex["names"], [*ex["positions"], None], ex["macs"])):
        row = [k, n, f"{pos:.3f}" if pos is not None else "1.000", f"{mac:,}", thr[k]]
        if flex:
            h = ex["heads"][k] if k < len(ex["heads"]) else {}
            row += [f"{len(h['filters'])}/{h.get('tap_channels', '?')}" if "filters" in h else None,
                    _head_widths(h) if "filters" in h else None]
        rows.append(row)
    kind = f", {ex['kind']}" if "kind" in ex else ""
    title = (f"{key} ({len(ex['names'])}{kind}, backbone {ex['backbone']}, confidence {ex['confidence']}, "
             f"fallback {ex['fallback']})")
    plan = ex.get("plan")
    if plan and plan.get("mean_macs_fraction") is not None:
        title += (f"; plan on {plan.get('split')}: accuracy {plan.get('accuracy')} at {plan['mean_macs_fraction']:.3f} "
                  f"of the backbone's MACs, {len(ex.get('operating_points', []))} operating points")
    return title + "\n" + _table(header, rows)


def bench_bundle(bundle, batch_size: int = 1, repeats: int = 20, seed: int = 0) -> dict[str, Any]:
    """Median latency (ms) per level and per exit (``exits`` and ``flex_exits``: stopping at exit k),
    and the time of each level switch, on this machine, with the bundle's execution plan (the tuned
    one beside it, else onnxruntime at one thread) for ``batch_size``. Seeded normal inputs."""
    import numpy as np

    from nestflex._machine import machine
    from nestflex.deploy.timing import median_ms

    x = np.random.default_rng(seed).standard_normal((batch_size, *bundle.input_spec["shape"]), dtype=np.float32)
    rt = CapacityRuntime(bundle, level=0, batch=batch_size)
    chosen = rt.plan.for_batch(batch_size)
    levels = []
    for k in range(bundle.num_levels):
        report = rt.set_level(k)
        levels.append({"level": k, "backend": rt.backend, "threads": chosen[k].threads,
                       "latency_ms": round(median_ms(lambda: rt(x), repeats), 4), "resident_bytes": report.resident_bytes})
    switches = []
    for a in range(bundle.num_levels):
        for b in range(bundle.num_levels):
            if a != b:
                rt.set_level(a)
                r = rt.set_level(b)
                switches.append({"from": a, "to": b, "page_in_bytes": r.page_in_bytes,
                                 "page_out_bytes": r.page_out_bytes, "ms": round(1e3 * r.seconds, 4)})
    per_set: dict[str, list[dict[str, Any]]] = {"exits": [], "flex_exits": []}
    for key, ex in bundle.exit_sets.items():
        prog = ProgressiveRuntime(bundle, rt, exit_set=key, plan=rt.plan)
        for k in range(prog.num_exits):
            per_set.setdefault(key, []).append({"exit": k, "name": ex["names"][k], "latency_ms": round(
                median_ms(lambda k=k: prog.exit_logits(x, k), repeats), 4)})
    return {"bundle": str(bundle.path), "batch_size": batch_size, "repeats": repeats, "levels": levels,
            **per_set, "switches": switches, "machine": machine(),
            "note": "medians of repeated runs after one warm-up; a switch is timed once per ordered pair"}


def _cmd_inspect(args: argparse.Namespace) -> int:
    from nestflex.deploy.bundle.loader import load

    bundle = load(args.bundle)
    print(json.dumps(bundle.manifest, indent=2) if args.json else inspect_table(bundle))
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    from nestflex.deploy.bundle.loader import load

    if args.repeats < 1 or args.batch_size < 1:
        print(f"error: --repeats and --batch-size must be >= 1, got {args.repeats} and {args.batch_size}", file=sys.stderr)
        return 2
    result = bench_bundle(load(args.bundle), args.batch_size, args.repeats)
    if args.json:
        from nestflex._io import write_json

        write_json(args.json, result)
    print(f"bundle {result['bundle']}  batch {args.batch_size}  median of {args.repeats}  "
          f"({result['machine']['cpus']} cpus, onnxruntime {result['machine']['onnxruntime']})")
    print(_table(["level", "backend", "threads", "latency ms", "resident MB"],
                 [[r["level"], r["backend"], r["threads"], r["latency_ms"], _mb(r["resident_bytes"])]
                  for r in result["levels"]]))
    for key in ("exits", "flex_exits"):
        if result.get(key):
            print()
            print(_table([f"{key} exit", "name", "latency ms"],
                         [[e["exit"], e["name"], e["latency_ms"]] for e in result[key]]))
    print()
    print(_table(["switch", "page in bytes", "page out bytes", "ms"],
                 [[f"{s['from']} -> {s['to']}", f"{s['page_in_bytes']:,}", f"{s['page_out_bytes']:,}", s["ms"]]
                  for s in result["switches"]]))
    return 0


def _app_names(paths: Sequence[str]) -> list[str]:
    from pathlib import Path

    names: list[str] = []
    for p in paths:
        base = Path(p).name.removesuffix(".nfx") or "app"
        name, i = base, 2
        while name in names:
            name, i = f"{base}-{i}", i + 1
        names.append(name)
    return names


def _live_table(stats: dict[str, Any]) -> str:
    rows = []
    for name, a in stats["apps"].items():
        thr = "-" if a["thresholds"] is None else ",".join(f"{t:g}" for t in a["thresholds"])
        rows.append([name, a["level"], thr, f"{a['share']:.2f}", f"{a['fps']:.1f}/{a['fps_goal']:g}",
                     f"{a['expected_accuracy']:.4f}", a["p50_ms"], a["p95_ms"], a["dropped"], a["switches"]])
    budget = "unlimited" if stats["memory_mb"] is None else f"{stats['memory_mb']:g} MB"
    head = (f"scheduler {stats['scheduler']}  resident {_mb(stats['resident_bytes'])} MB of {budget}  "
            f"slowdown {stats['slowdown']:.2f}  plans {stats['plans']}")
    return head + "\n" + _table(["app", "level", "thresholds", "share", "fps/goal", "exp. accuracy", "p50 ms",
                                 "p95 ms", "dropped", "switches"], rows)


def run_live(paths: Sequence[str], *, fps: float = 30.0, memory_mb: float | None = None, cpu: float = 1.0,
             scheduler: str = "greedy_total", seconds: float = 10.0, interval: float = 1.0, seed: int = 0,
             out=None) -> dict[str, Any]:
    """Serve every bundle as one app on the engine and stream synthetic frames to each at ``fps``
    for ``seconds``, printing a per-app table every ``interval`` seconds; returns the final stats.

    Frames are seeded Gaussian noise of the bundle's input shape: this shows the engine's
    decisions, latency and frame rates live; accuracy is the configuration's expected accuracy
    from the bundle's profiles (noise has no labels)."""
    import threading
    import time

    import numpy as np

    from nestflex.deploy.bundle.loader import load
    from nestflex.deploy.engine import Engine, EngineError
    from nestflex.errors import NestflexError

    out = sys.stdout if out is None else out
    engine = Engine(scheduler, memory_mb=memory_mb, cpu=cpu)
    try:
        names = _app_names(paths)
        bundles = {}
        for name, path in zip(names, paths):
            try:
                bundles[name] = load(path)
            except NestflexError as e:
                raise EngineError(f"app {name!r}: its bundle failed to load: {e}") from e
            engine.add_app(name, bundles[name], fps=fps)
        g = np.random.default_rng(seed)
        frames = {n: [g.standard_normal(tuple(bundles[n].input_spec["shape"]), dtype=np.float32) for _ in range(8)]
                  for n in names}
        stop = threading.Event()

        def camera() -> None:  # one clock for every app: frame i of each at start + i / fps
            start, i = time.perf_counter(), 0
            while not stop.is_set():
                for n in names:
                    engine.submit(n, frames[n][i % 8])
                i += 1
                delay = start + i / fps - time.perf_counter()
                if delay > 0:
                    stop.wait(delay)

        feeder = threading.Thread(target=camera, daemon=True)
        feeder.start()
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            time.sleep(min(interval, max(0.0, end - time.perf_counter())))
            print(_live_table(engine.stats()), file=out, flush=True)
            print(file=out)
        stop.set()
        feeder.join()
        return engine.stats()
    finally:
        engine.close()


def _cmd_serve(args: argparse.Namespace) -> int:
    """Serve the bundle's tail over gRPC until SIGINT/SIGTERM (nestflex.serve, the `serve` extra)."""
    import asyncio
    import signal

    from nestflex.deploy.bundle.loader import load
    from nestflex.errors import NestflexError

    try:
        import grpc  # noqa: F401

        from nestflex.serve import TailServer
    except ImportError:
        raise NestflexError("`nestflex serve` needs gRPC. HINT: pip install \"nestflex[serve]\"") from None
    server = TailServer(load(args.bundle), max_batch=args.max_batch, max_wait_ms=args.max_wait_ms,
                        threads=args.threads, slowdown=args.slowdown, drop_rate=args.drop_rate)

    async def serve() -> None:
        stop = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):  # before the line that tells a caller it may signal
            asyncio.get_running_loop().add_signal_handler(sig, stop.set)
        port = await server.start(args.host, args.port)
        print(f"nestflex serve: listening on {args.host}:{port} (bundle {server.core.id[:16]}...)", flush=True)
        await stop.wait()
        await server.stop(1.0)

    asyncio.run(serve())
    return 0


def _cmd_tune(args: argparse.Namespace) -> int:
    """Synthesise the fastest execution configuration per level on this machine; store it beside the bundle."""
    from nestflex.deploy.backends.plan import writable_plan_path, write_plan
    from nestflex.deploy.bundle.loader import load
    from nestflex.deploy.tune import synthesize

    bundle = load(args.bundle)
    writable_plan_path(bundle, args.out)  # fail before measuring, not after
    if not 0 <= args.budget < 100:
        print(f"error: --budget is in accuracy points, in [0, 100), got {args.budget}", file=sys.stderr)
        return 2
    if any(b < 1 for b in args.batches):
        print(f"error: --batches are batch sizes >= 1, got {args.batches}", file=sys.stderr)
        return 2
    plan = synthesize(bundle, backends=args.backends, threads=args.threads, repeats=args.repeats,
                      budget_points=args.budget, batches=args.batches, log=None if args.quiet else print)
    path = write_plan(bundle, plan, args.out)
    rows = [[k, lp.backend, lp.threads, lp.latency_ms, lp.eager_ms,
             None if not lp.eager_ms or not lp.latency_ms else round(lp.eager_ms / lp.latency_ms, 2),
             None if lp.accuracy is None else f"{100 * lp.accuracy:.2f}%"]
            for k, lp in enumerate(plan.levels)]
    ref = f"{plan.reference} 1-thread ms"  # the reference every candidate was checked against
    print(_table(["level", "backend", "threads", "ms", ref, "speed-up", "accuracy"], rows))
    for key, ep in plan.exits.items():  # per exit: a sample that leaves there (stages and heads up to it)
        rows = [[k, ep.backend, ep.threads, ms, e, round(e / ms, 2) if ms else None]
                for k, (ms, e) in enumerate(zip(ep.latency_ms, ep.eager_ms))]
        print(f"{key}:")
        print(_table(["exit", "backend", "threads", "ms", ref, "speed-up"], rows))
        if ep.active is not None:  # the time-aware exit choice dropped some
            print(f"  early exits kept: {list(ep.active)} of {len(ep.latency_ms) - 1}: {ep.mean_ms} ms per frame "
                  f"on the calibration samples, {ep.all_mean_ms} ms with every exit")
    for b, lps in sorted(plan.batches.items()):  # CapacityRuntime(bundle, level, batch=b) runs these
        rows = [[k, lp.backend, lp.threads, lp.latency_ms, lp.eager_ms,
                 round(lp.eager_ms / lp.latency_ms, 2) if lp.eager_ms and lp.latency_ms else None]
                for k, lp in enumerate(lps)]
        print(f"batch {b}:")
        print(_table(["level", "backend", "threads", "ms per batch", ref, "speed-up"], rows))
    for b in (1, *sorted(plan.batches)):  # a smaller level exists to save time: say where it does not
        for k, j in plan.out_of_order(b):
            times = plan.for_batch(b)
            print(f"warning: at batch {b}, level {k} ({times[k].latency_ms} ms) is not faster than level {j} "
                  f"({times[j].latency_ms} ms): it saves memory here, not time")
    if plan.budget_points is None:
        print("the bundle ships no samples: only float32 backends were candidates (re-export with samples for int8)")
    print(f"plan: {path}")
    return 0


def _cmd_latency_table(args: argparse.Namespace) -> int:
    """Measure the per-layer latency table of a model's layer specs here; write it atomically.

    A verb of its own, not a ``tune`` option: ``tune`` times a trained bundle's levels, while the
    table is needed before any pruning (to plan the roadmap), from the layer specs the training
    machine wrote (``nestflex.pruning.write_model_specs``); no bundle exists yet.
    """
    from nestflex.profiling.latency import measure_table, read_layer_specs

    specs = read_layer_specs(args.specs)
    table = measure_table(specs, threads=args.threads, batch=args.batch, repeats=args.repeats,
                          log=None if args.quiet else print)
    path = table.save(args.out)
    print(f"latency table: {len(table.entries)} layers at {args.threads} thread(s), batch {args.batch}, "
          f"{table.meta['seconds']} s: {path}")
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    for arg, value in (("--fps", args.fps), ("--seconds", args.seconds), ("--interval", args.interval)):
        if not value > 0:
            print(f"error: {arg} must be > 0, got {value}", file=sys.stderr)
            return 2
    result = run_live(args.bundles, fps=args.fps, memory_mb=args.memory_mb, cpu=args.cpu, scheduler=args.scheduler,
                      seconds=args.seconds, interval=args.interval)
    if args.json:
        from nestflex._io import write_json

        write_json(args.json, result)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``nestflex`` and ``python -m nestflex``; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="nestflex", description="Inspect, benchmark and run nestflex bundles.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("inspect", help="levels, exits (SPINN/SDN and FlexDNN), split points and sizes of a bundle")
    p.add_argument("bundle")
    p.add_argument("--json", action="store_true", help="print the whole manifest as JSON")
    p = sub.add_parser("bench", help="median latency per level and per exit on this machine")
    p.add_argument("bundle")
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--json", default=None, help="also write the results to this JSON file")
    p = sub.add_parser("run", help="serve bundles live on the device engine with synthetic frames; a per-app table")
    p.add_argument("bundles", nargs="+")
    p.add_argument("--fps", type=float, default=30.0, help="frame rate of every app's stream")
    p.add_argument("--memory-mb", type=float, default=None, help="memory budget of all apps' weights")
    p.add_argument("--cpu", type=float, default=1.0, help="share of the device the apps may use, (0, 1]")
    p.add_argument("--scheduler", default="greedy_total", help="a registered scheduler (nestflex.deploy.list_schedulers())")
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--interval", type=float, default=1.0, help="seconds between two tables")
    p.add_argument("--json", default=None, help="also write the final stats to this JSON file")
    p = sub.add_parser("tune", help="measure backends x threads per level here; store the fastest plan beside the bundle")
    p.add_argument("bundle")
    p.add_argument("--backends", nargs="+", default=None, help="backends to try (default: every installed one)")
    p.add_argument("--threads", type=int, nargs="+", default=None, help="thread counts (default: 1..cores)")
    p.add_argument("--batches", type=int, nargs="+", default=[1],
                   help="batch sizes to time (default 1); each above 1 gets its own choice per level")
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--budget", type=float, default=1.0,
                   help="accuracy points an int8 level may lose on the bundle's check samples")
    p.add_argument("--out", default=None, help="where to write the plan (default: BUNDLE.plan.json beside it)")
    p.add_argument("--quiet", action="store_true")
    p = sub.add_parser("latency-table", help="per-layer onnxruntime times of a model's layers here, to plan pruning "
                       "in time (specs from nestflex.pruning.write_model_specs)")
    p.add_argument("specs", help="the layer-spec JSON the training machine wrote")
    p.add_argument("--threads", type=int, default=1, help="onnxruntime intra-op threads (the tuned plan's)")
    p.add_argument("--batch", type=int, default=1, help="batch size (the plan's); times are per batch")
    p.add_argument("--repeats", type=int, default=7, help="timed samples per measured point")
    p.add_argument("--out", default="latency_table.json", help="the table's JSON, written atomically")
    p.add_argument("--quiet", action="store_true")
    p = sub.add_parser("serve", help="split inference: serve the bundle's tail (any split point) over gRPC")
    p.add_argument("bundle")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface)")
    p.add_argument("--port", type=int, default=50051, help="port (0: an ephemeral one, printed)")
    p.add_argument("--max-batch", type=int, default=32, help="most samples batched together")
    p.add_argument("--max-wait-ms", type=float, default=2.0, help="longest a request waits for a batch to fill")
    p.add_argument("--threads", type=int, default=1, help="intra-op threads of the compute thread")
    p.add_argument("--slowdown", type=float, default=1.0, help="model a slower server: each batch takes this x longer")
    p.add_argument("--drop-rate", type=float, default=0.0, help="fault injection: share of requests never answered")
    args = parser.parse_args(argv)
    from nestflex.errors import NestflexError

    try:
        return {"inspect": _cmd_inspect, "bench": _cmd_bench, "run": _cmd_run, "serve": _cmd_serve,
                "tune": _cmd_tune, "latency-table": _cmd_latency_table}[args.command](args)
    except NestflexError as e:
        # one line, whatever the message quotes (a file name or a value may hold a newline)
        print("error: " + " ".join(str(e).splitlines()), file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
