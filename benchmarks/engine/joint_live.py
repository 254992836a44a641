"""The joint scheduler measured live (issue 41 item 4): device engine + link emulator + ``nestflex serve``.

Labelled test frames of several apps stream through one device while apps start and stop, a
background CPU load comes and goes, and the uplink follows a bandwidth trace. Every system sees
the same seeded workload:

* ``joint``: :class:`nestflex.deploy.Engine` with ``scheduler="joint_total"``; the apps of the
  served bundle have a tail (the ``nestflex serve`` process, behind the emulated link), so the
  engine plans level x exit operating point x split x bitwidth for all apps at once;
* ``levels``: the engine today, levels and compute shares only (``greedy_total``, no exits, no tail);
* ``exits``: the engine at the largest level with its exit thresholds adapted (``flexdnn``);
* ``split``: one :class:`~nestflex.deploy.split.offload.Offloader` per app, as today: its own
  :class:`~nestflex.deploy.scheduler.split.SplitScheduler` over split x exit x bitwidth, fed by its
  own network profiler, the apps' threads competing for the device;
* ``status_quo``: each app at its knee level, equal shares (the engine's ``knee``).

**Workload** (seeded by ``(seed, run)``): the multi-tenant benchmark's app trace
(``benchmarks/engine/_simulation.py:make_trace``: 2-6 apps of a pool of ``--pool-size``, one
start or stop a second), each app at a seeded rate of ``--fps`` (5, 10 or 15 frames/s); a CPU-burning process on during one
or two windows of the run; the uplink following ``--trace`` (a ``time<TAB>Mbit/s`` file, e.g. the
Norway 3G traces; started at a seeded offset) or, without it, a seeded synthetic trace (a new rate
every second, log-uniform in 0.5-20 Mbit/s). The device is ``--device-cpu`` of this machine's core
(the engine's CPU quota; the Offloaders' ``slowdown``), the server this machine's speed.

**Measured** per system and run: frames/s answered (all apps), accuracy on all frames (a dropped
frame counts as wrong), SLO violations (frames not answered within ``--slo-periods`` frame
periods, dropped ones included), bytes sent, server time; the joint engine's decision time; what
each engine's process holds (``Engine.resident_bytes()`` after every join and before every leave)
against its memory budget.
A last phase (joint engine) stalls the link for ``--deadline-ms`` x 3 and then kills the server:
every frame answered, and the other apps keep running.

Writes ``--out/summary.json`` (with the ``goals`` object) and ``--out/timeline.png`` (one joint run:
per app its configuration, frames/s and accuracy; the link's bandwidth; the CPU load).

Example (the measured run; about 20 minutes: one seed of 12 s took 93 s here):
    python benchmarks/engine/joint_live.py --runs runs/synth_w05 --seeds 10 \\
        --trace ../shared/data/traces/norway/norway_bus_1 --out docs/results/joint_live
"""

from __future__ import annotations

import argparse
import math
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: the repository root, for benchmarks.*
from benchmarks._common import add_out_args, labelled_frames, resolve_out, write_run  # noqa: E402
from benchmarks.engine._simulation import SimulationConfig, make_trace  # noqa: E402
from benchmarks.split.split_live import Server  # noqa: E402

from nestflex._io import write_json  # noqa: E402
from nestflex._machine import machine  # noqa: E402
from nestflex.deploy import Engine, load  # noqa: E402
from nestflex.deploy.engine import operating_points  # noqa: E402
from nestflex.deploy.scheduler.joint import JointApp, JointScheduler  # noqa: E402
from nestflex.deploy.scheduler.split import SplitCosts, SplitScheduler  # noqa: E402
from nestflex.deploy.split.client import TailClient  # noqa: E402
from nestflex.deploy.split.costs import accuracy_drops, measure_bytes, measure_costs  # noqa: E402
from nestflex.deploy.split.network import NetworkProfiler  # noqa: E402
from nestflex.deploy.split.offload import Offloader, SplitConfig  # noqa: E402
from nestflex.testing.link import BandwidthTrace, LinkModel, LinkProxy  # noqa: E402

SYSTEMS = ("joint", "levels", "exits", "split", "status_quo")
SINGLE_KNOB = ("levels", "exits", "split", "status_quo")
ENGINE_SCHEDULER = {"joint": "joint_total", "levels": "greedy_total", "exits": "flexdnn", "status_quo": "knee"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", nargs="+", required=True,
                   help="recipe output directories (bundle.nfx + summary.json); the first one's bundle is served")
    p.add_argument("--mnist-dir", default=None, help="MNIST IDX files, for runs trained on MNIST")
    p.add_argument("--data-dir", default="data", help="CIFAR-10, for runs trained on it")
    add_out_args(p, "summary.json, timeline.png and run.json")
    p.add_argument("--trace", default=None, help="uplink bandwidth trace (time<TAB>Mbit/s); default: synthetic")
    p.add_argument("--trace-speed", type=float, default=1.0, help="replay the trace this many times faster")
    p.add_argument("--seeds", type=int, default=10, help="seeded runs per system")
    p.add_argument("--seconds", type=int, default=20, help="per run")
    p.add_argument("--pool-size", type=int, default=6)
    p.add_argument("--min-apps", type=int, default=2)
    p.add_argument("--max-apps", type=int, default=6)
    p.add_argument("--device-cpu", type=float, default=0.05,
                   help="the device's share of one core of this machine (0.05: a device 20x slower than the server)")
    p.add_argument("--fps", type=float, nargs="+", default=[5.0, 10.0, 15.0], help="app frame rates drawn from")
    p.add_argument("--memory-fraction", type=float, default=0.75, help="of the pool's largest levels summed")
    p.add_argument("--rtt-ms", type=float, default=20.0)
    p.add_argument("--deadline-ms", type=float, default=300.0)
    p.add_argument("--slo-periods", type=float, default=2.0)
    p.add_argument("--alpha", type=float, default=0.5)
    p.add_argument("--frames", type=int, default=600, help="test frames per run directory")
    p.add_argument("--systems", nargs="+", default=list(SYSTEMS), choices=SYSTEMS)
    p.add_argument("--failure-seconds", type=float, default=10.0, help="the link-stall and server-kill phase")
    p.add_argument("--quick", action="store_true", help="one short seed, three apps: a smoke run")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.quick:
        args.seeds, args.seconds, args.pool_size, args.max_apps, args.frames = 1, min(args.seconds, 4), 3, 3, 100
        args.failure_seconds = min(args.failure_seconds, 6.0)
    resolve_out(args, __file__)
    return args


# ------------------------------------------------------------------------------------------ workload


def link_trace(args: argparse.Namespace, run: int) -> BandwidthTrace:
    """The uplink of run ``run``: the trace file from a seeded offset, or a seeded synthetic trace."""
    rng = np.random.default_rng([args.seed, run, 7])
    if args.trace is None:
        rates = np.exp(rng.uniform(math.log(0.5), math.log(20.0), size=args.seconds + 1))
        return BandwidthTrace(list(range(args.seconds + 1)), rates.tolist(), period=float(args.seconds + 1))
    base = BandwidthTrace.load(args.trace)
    times = np.asarray(base.times, dtype=float) / args.trace_speed
    period = base.period / args.trace_speed
    offset = float(rng.uniform(0, period))
    shifted = (times - offset) % period
    order = np.argsort(shifted)
    t, r = shifted[order], np.asarray(base.mbps, dtype=float)[order]
    if t[0] > 0:  # the sample before the offset holds until the next one
        t, r = np.concatenate([[0.0], t]), np.concatenate([[r[-1]], r])
    return BandwidthTrace(t.tolist(), r.tolist(), period=period)


def burn_windows(args: argparse.Namespace, run: int) -> list[tuple[float, float]]:
    """One or two windows of the run with a CPU-burning process."""
    rng = np.random.default_rng([args.seed, run, 11])
    s = args.seconds
    first = (float(rng.uniform(0.1, 0.35)) * s, 0.0)
    first = (first[0], first[0] + float(rng.uniform(0.15, 0.3)) * s)
    if rng.random() < 0.5:
        return [first]
    start = first[1] + float(rng.uniform(0.1, 0.2)) * s
    return [first, (start, min(s, start + float(rng.uniform(0.1, 0.25)) * s))]


class Burner:
    """Starts and stops one CPU-burning process along the run's windows."""

    def __init__(self, windows: list[tuple[float, float]]) -> None:
        self.windows, self.proc = windows, None

    def on(self, t: float) -> bool:
        return any(a <= t < b for a, b in self.windows)

    def tick(self, t: float) -> None:
        if self.on(t) and self.proc is None:
            self.proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        elif not self.on(t) and self.proc is not None:
            self.stop()

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


class Recorder:
    """Per-frame outcomes: app, answered, correct, latency (ms), period (ms), bytes sent."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.rows: list[tuple[str, bool, bool, float, float, int]] = []

    def add(self, app: str, answered: bool, correct: bool, latency_ms: float, period_ms: float, sent: int) -> None:
        with self.lock:
            self.rows.append((app, answered, correct, latency_ms, period_ms, sent))


# ------------------------------------------------------------------------------------------ systems


class DeviceOffloader(Offloader):
    """An Offloader whose device work holds the one device: the apps' Offloaders run on their own
    threads, and with ``slowdown`` each computation is followed by a sleep (a slower device), which
    without the lock would give every app a device of its own."""

    device = threading.Lock()

    def _device(self, fn: Any, *args: Any) -> tuple[Any, float]:
        with DeviceOffloader.device:
            return super()._device(fn, *args)


class Pool:
    """The apps that can run, their frames, and the served bundle's split profile (for ``split``)."""

    def __init__(self, args: argparse.Namespace) -> None:
        rng = np.random.default_rng(args.seed)
        sources = []
        for r in args.runs:
            frames, labels = labelled_frames(Path(r), args.frames, args.mnist_dir, args.data_dir, args.seed)
            sources.append({"bundle": load(Path(r) / "bundle.nfx"),
                            "frames": [(x.numpy().astype(np.float32), int(y)) for x, y in frames],
                            "data": labels["data"]})
        self.sources, self.served = sources, sources[0]["bundle"]
        self.apps = [{"name": f"app{i}", "source": i % len(sources), "fps": float(rng.choice(args.fps))}
                     for i in range(args.pool_size)]
        largest = []
        for s in sources:  # what the largest level holds on this device, as the engine measures it
            with Engine() as e:
                largest.append(e.add_app("probe", s["bundle"], profile=False)["level_bytes"][-1] / 1e6)
        self.memory_mb = args.memory_fraction * sum(largest[a["source"]] for a in self.apps)
        self.split_setup = None

    def splitter(self, args: argparse.Namespace) -> dict[str, Any]:
        """The served bundle's device profile at the device's speed, for the per-app Offloaders."""
        if self.split_setup is None:
            b = self.served
            points, lossless, ref = operating_points(b, "exits")
            raw = measure_costs(b, "exits", repeats=10)
            s = 1.0 / args.device_cpu
            costs = SplitCosts(raw.cuts, tuple(t * s for t in raw.segment_ms), {k: v * s for k, v in raw.head_ms.items()},
                               raw.exit_at, raw.split_at, raw.num_exits, raw.frame_ms * s)
            sizing = np.stack([x for x, _ in self.sources[0]["frames"][:32]])
            self.split_setup = {"costs": costs, "bytes": measure_bytes(b, sizing, bits=[None, 2, 4, 8]),
                                "drops": accuracy_drops(b), "points": points, "lossless": lossless,
                                "floor": (ref - 0.01) if ref is not None else 0.0}
        return self.split_setup


def run_engine(system: str, pool: Pool, trace: list[tuple[int, ...]], link_port: int | None, burner: Burner,
               args: argparse.Namespace, timeline: list | None, link: BandwidthTrace) -> dict[str, Any]:
    rec = Recorder()
    server_ms, bytes_sent, plan_ms, resident = 0.0, 0, [], []
    with Engine(ENGINE_SCHEDULER[system], memory_mb=pool.memory_mb, cpu=args.device_cpu, alpha=args.alpha,
                link_mbps=float(link.rate(0.0)) or 1.0, max_delay_periods=args.slo_periods) as engine:
        def add(i: int) -> None:
            a = pool.apps[i]
            src = pool.sources[a["source"]]
            tail = f"127.0.0.1:{link_port}" if system == "joint" and a["source"] == 0 and link_port else None
            engine.add_app(a["name"], src["bundle"], fps=a["fps"], profile_repeats=3, tail=tail,
                           deadline_ms=args.deadline_ms,
                           exit_set=None if system in ("levels", "status_quo") else "auto")
            resident.append(engine.resident_bytes())  # what the process holds after the join's plan

        def leave(i: int) -> None:
            nonlocal server_ms, bytes_sent
            resident.append(engine.resident_bytes())  # and after the plans since the last event
            st = engine.stats()["apps"][pool.apps[i]["name"]]
            if st["split"] is not None:
                server_ms += st["split"]["server_ms"]
                bytes_sent += st["split"]["bytes_sent"]
            engine.remove_app(pool.apps[i]["name"])

        def submit(i: int, x: np.ndarray, y: int) -> None:
            a = pool.apps[i]
            period = 1000.0 / a["fps"]

            def done(fut: Any) -> None:
                try:
                    r = fut.result()
                    rec.add(a["name"], r.answered, r.answered and r.prediction == y, r.latency_ms, period, r.bytes_sent)
                except Exception:  # a failed frame: not answered
                    rec.add(a["name"], False, False, math.inf, period, 0)

            engine.submit(a["name"], x, tag=y).add_done_callback(done)

        out = drive(pool, trace, add, leave, submit, burner, args, timeline, engine if timeline is not None else None,
                    link)
        plan_ms = [p["plan_ms"] for p in engine.plans if "plan_ms" in p and len(p.get("apps", {})) >= 1]
        six = [p["plan_ms"] for p in engine.plans if "plan_ms" in p and len(p.get("apps", {})) >= 6]
        for name in list(engine.apps):
            leave(next(i for i, a in enumerate(pool.apps) if a["name"] == name))
    return {**out, **totals(rec, out["seconds"], args.slo_periods), "server_ms": server_ms, "bytes_sent": bytes_sent,
            "plan_ms": plan_ms, "plan_ms_6_apps": six, "resident_mb_peak": max(resident, default=0) / 1e6}


def run_offloaders(pool: Pool, trace: list[tuple[int, ...]], link_port: int, burner: Burner,
                   args: argparse.Namespace, link: BandwidthTrace) -> dict[str, Any]:
    """One Offloader per app with its own split scheduler, each app on its own thread (today)."""
    rec = Recorder()
    setup = pool.splitter(args)
    threads: dict[int, tuple[threading.Thread, threading.Event, dict]] = {}
    clients: list[TailClient] = []

    def app_thread(i: int, stop: threading.Event, box: dict) -> None:
        a = pool.apps[i]
        src = pool.sources[a["source"]]
        b = src["bundle"]
        period = 1000.0 / a["fps"]
        if a["source"] == 0:
            client = TailClient(f"127.0.0.1:{link_port}", b)
            clients.append(client)
            sched = SplitScheduler(setup["costs"], setup["bytes"], setup["points"], accuracy_drop=setup["drops"],
                                   bits=(None, 2, 4, 8), constraints=[("accuracy", ">=", setup["floor"])],
                                   server_speedup=1.0 / args.device_cpu, tolerance=0.02)
            off = DeviceOffloader(b, client, SplitConfig(None, deadline_ms=args.deadline_ms), profiler=NetworkProfiler(),
                                  scheduler=sched, slowdown=1.0 / args.device_cpu)
        else:  # a bundle the server does not serve: device only, its shipped exits
            off = DeviceOffloader(b, None, SplitConfig(None), slowdown=1.0 / args.device_cpu)
        k, due = 0, time.perf_counter()
        while not stop.is_set():
            now = time.perf_counter()
            if now < due:
                stop.wait(due - now)
                continue
            x, y = src["frames"][(box["cursor"] + k) % len(src["frames"])]
            k += 1
            late = 1e3 * (now - due)
            if late > args.slo_periods * period:  # the camera moved on: this frame is dropped
                rec.add(a["name"], False, False, math.inf, period, 0)
            else:
                ans = off.infer(x[None])
                pred = int(np.argmax(ans.result.logits[0]))
                rec.add(a["name"], True, pred == y, late + ans.latency_ms, period, ans.bytes_sent)
                box["server_ms"] += ans.reply.server_ms if ans.reply is not None else 0.0
                box["bytes"] += ans.bytes_sent
            due += period / 1000.0

    def add(i: int) -> None:
        stop, box = threading.Event(), {"cursor": i * 97, "server_ms": 0.0, "bytes": 0}
        t = threading.Thread(target=app_thread, args=(i, stop, box), daemon=True)
        threads[i] = (t, stop, box)
        t.start()

    boxes: list[dict] = []

    def leave(i: int) -> None:
        t, stop, box = threads.pop(i)
        stop.set()
        t.join()
        boxes.append(box)

    out = drive(pool, trace, add, leave, None, burner, args, None, None, link)
    for i in list(threads):
        leave(i)
    for c in clients:
        c.close()
    return {**out, **totals(rec, out["seconds"], args.slo_periods), "server_ms": sum(b["server_ms"] for b in boxes),
            "bytes_sent": sum(b["bytes"] for b in boxes), "plan_ms": [], "plan_ms_6_apps": [], "resident_mb_peak": None}


def drive(pool: Pool, trace: list[tuple[int, ...]], add, leave, submit, burner: Burner, args: argparse.Namespace,
          timeline: list | None, engine: Engine | None, link: BandwidthTrace) -> dict[str, Any]:
    """Start and stop apps per the trace, pace every running app's frames (``submit``; ``None``: the
    apps pace themselves), the CPU burner along its windows, and sample the timeline."""
    running: set[int] = set()
    cursors = {i: i * 97 for i in range(len(pool.apps))}
    t0 = time.perf_counter()
    next_sample = 0.0
    for s in range(args.seconds):
        want = set(trace[s])
        for i in sorted(running - want):
            leave(i)
        for i in sorted(want - running):
            add(i)
        running = want
        start = t0 + s
        events = sorted((start + k / pool.apps[i]["fps"], i) for i in running
                        for k in range(int(math.ceil(pool.apps[i]["fps"]))) if k / pool.apps[i]["fps"] < 1.0)
        if submit is None:
            events = [(start + k * 0.05, -1) for k in range(20)]
        for t, i in events:
            delay = t - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            now = time.perf_counter() - t0
            burner.tick(now)
            if i >= 0:
                src = pool.sources[pool.apps[i]["source"]]
                x, y = src["frames"][cursors[i] % len(src["frames"])]
                cursors[i] += 1
                submit(i, x, y)
            if timeline is not None and engine is not None and now >= next_sample:
                next_sample = now + 0.25
                st = engine.stats()
                last = engine.plans[-1] if engine.plans else {}
                timeline.append({"t": round(now, 3), "burn": burner.on(now), "link_mbps": float(link.rate(now)),
                                 "apps": {n: {"option": last.get("apps", {}).get(n, {}).get("option"),
                                              "level": a["level"], "offload": bool(a["split"] and a["split"]["config"]),
                                              "answered": a["answered"], "accuracy": a["expected_accuracy"]}
                                          for n, a in st["apps"].items()}})
    burner.stop()
    time.sleep(0.2)  # the last frames' answers
    return {"seconds": time.perf_counter() - t0, "app_seconds": sum(len(t) for t in trace[:args.seconds])}


def totals(rec: Recorder, seconds: float, slo_periods: float) -> dict[str, Any]:
    rows = rec.rows
    answered = sum(r[1] for r in rows)
    slo = sum((not r[1]) or r[3] > r[4] * slo_periods for r in rows)
    return {"frames": len(rows), "answered": answered, "correct": sum(r[2] for r in rows),
            "fps": answered / max(seconds, 1e-9), "accuracy_all_frames": sum(r[2] for r in rows) / max(len(rows), 1),
            "slo_violations": slo, "slo_violation_rate": slo / max(len(rows), 1),
            "bytes_sent_frames": sum(r[5] for r in rows)}


# ------------------------------------------------------------------------------------------ failures


class Sending(JointScheduler):
    """The joint scheduler with the apps that can send restricted to the options that do, while the
    link is up: the failure phase needs requests in flight when the link stalls and the server dies
    (on a quiet workload the planner may keep every app on the device)."""

    def schedule(self, apps: Any, resources: Any, *, alpha: float = 0.5) -> Any:
        if resources.link_mbps > 0 and resources.server_capacity > 0:
            apps = [JointApp(a.name, tuple(o for o in a.options if o.bytes > 0) or a.options, fps=a.fps,
                             min_accuracy=a.min_accuracy) for a in apps]
        return super().schedule(apps, resources, alpha=alpha)


def failure_phase(pool: Pool, server: Server, args: argparse.Namespace) -> dict[str, Any]:
    """The joint engine with two split apps (on options that send, :class:`Sending`) and one device
    app: the link stalls past the deadline, then the server process is killed. Every frame must be
    answered; the device app keeps its rate."""
    served = [i for i, a in enumerate(pool.apps) if a["source"] == 0][:2]
    other = next((i for i in range(len(pool.apps)) if i not in served), None)
    outcomes = {"answered": 0, "dropped": 0, "failed": 0, "where": {}}
    lock = threading.Lock()
    seconds = args.failure_seconds
    with LinkProxy(server.port, LinkModel(20.0, delay_ms=args.rtt_ms / 2)).run_in_thread() as link, \
            Engine(Sending("total"), cpu=args.device_cpu, link_mbps=20.0, max_delay_periods=args.slo_periods) as engine:
        for i in served:
            a = pool.apps[i]
            engine.add_app(a["name"], pool.served, fps=a["fps"], tail=f"127.0.0.1:{link.port}",
                           deadline_ms=args.deadline_ms, profile_repeats=3)
        if other is not None:
            a = pool.apps[other]
            engine.add_app(a["name"], pool.sources[a["source"]]["bundle"], fps=a["fps"], profile_repeats=3)
        names = [pool.apps[i]["name"] for i in served] + ([pool.apps[other]["name"]] if other is not None else [])
        frames = pool.sources[0]["frames"]
        futures = []
        t0 = time.perf_counter()
        stalled = killed = False
        k = 0
        other_during = 0
        while time.perf_counter() - t0 < seconds:
            t = time.perf_counter() - t0
            if t > seconds * 0.25 and not stalled:
                link.proxy.outage(3 * args.deadline_ms / 1000)
                stalled = True
            if t > seconds * 0.6 and not killed:
                server.kill()
                killed = True
            for n in names:
                x, y = frames[k % len(frames)]
                fut = engine.submit(n, x if n != names[-1] or other is None else
                                    pool.sources[pool.apps[other]["source"]]["frames"][k % 50][0], tag=y)
                futures.append((n, t, fut))
            k += 1
            time.sleep(1 / 15)
        for n, t, fut in futures:
            try:
                r = fut.result(timeout=30)
            except Exception:
                outcomes["failed"] += 1
                continue
            with lock:
                outcomes["answered" if r.answered else "dropped"] += 1
                key = r.where or ("device" if r.answered else r.reason)
                outcomes["where"][key] = outcomes["where"].get(key, 0) + 1
                if other is not None and n == names[-1] and t > seconds * 0.25 and r.answered:
                    other_during += 1
        stats = engine.stats()
    return {**outcomes, "frames": len(futures), "other_app_answered_after_failures": other_during,
            "network_up_at_end": stats["network"]["up"] if stats["network"] else None}


# ------------------------------------------------------------------------------------------ summary


def compare(joint: dict[str, float], base: dict[str, float]) -> dict[str, Any]:
    ratio = joint["fps"] / max(base["fps"], 1e-9)
    gain = 100 * (joint["accuracy_all_frames"] - base["accuracy_all_frames"])
    fewer_slo = joint["slo_violation_rate"] < base["slo_violation_rate"]
    met = ((ratio >= 1.3 and gain >= 0) or (gain >= 2.0 and ratio >= 1.0)) and fewer_slo
    return {"fps_ratio": round(ratio, 3), "accuracy_gain_points": round(gain, 2), "fewer_slo_violations": fewer_slo,
            "met": bool(met)}


def medians(runs: list[dict[str, Any]]) -> dict[str, float]:
    keys = ("fps", "accuracy_all_frames", "slo_violation_rate", "slo_violations", "bytes_sent", "server_ms")
    return {k: float(statistics.median(r[k] for r in runs)) for k in keys}


def _sample_step(timeline: list[dict[str, Any]]) -> float:
    """The timeline's median sampling interval (seconds)."""
    steps = sorted(b["t"] - a["t"] for a, b in zip(timeline, timeline[1:]))
    return steps[len(steps) // 2] if steps else 1.0


def _rates(rows: list[tuple[float, dict[str, Any]]], gap: float) -> list[float]:
    """Frames/s answered between consecutive samples of one app. An app that left and joined again
    is a new engine app whose count starts at 0 (its rate is its count since joining), and a break
    longer than ``gap`` (it was not running) is NaN, so the plot draws no line across it."""
    out = [0.0]
    for (t0, a), (t1, b) in zip(rows, rows[1:]):
        if t1 - t0 > gap:
            out.append(float("nan"))
            continue
        done = b["answered"] - a["answered"]
        out.append((b["answered"] if done < 0 else done) / max(t1 - t0, 1e-3))
    return out


def plot(timeline: list[dict[str, Any]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(4, 1, figsize=(10, 10), sharex=True)
    names = sorted({n for row in timeline for n in row["apps"]})
    for n in names:
        rows = [(r["t"], r["apps"][n]) for r in timeline if n in r["apps"]]
        t = [a for a, _ in rows]
        ax[0].step(t, [b["level"] + (0.5 if b["offload"] else 0) for _, b in rows], where="post", label=n)
        ax[1].plot(t, _rates(rows, gap=3 * _sample_step(timeline)), label=n)
        ax[2].step(t, [100 * b["accuracy"] for _, b in rows], where="post", label=n)
    ax[0].set_ylabel("level (+0.5: offloading)")
    ax[1].set_ylabel("frames/s answered")
    ax[2].set_ylabel("expected accuracy (%)")
    t = [r["t"] for r in timeline]
    ax[3].step(t, [r["link_mbps"] for r in timeline], where="post", label="uplink Mbit/s")
    ax3 = ax[3].twinx()
    ax3.fill_between(t, [1.0 if r["burn"] else 0.0 for r in timeline], step="post", alpha=0.2, color="red",
                     label="CPU burner on")
    ax3.set_ylim(0, 1.2)
    ax3.set_yticks([])
    ax[3].set_ylabel("uplink (Mbit/s); red: CPU load")
    ax[3].set_xlabel("seconds")
    ax[0].legend(fontsize=7, ncol=3)
    fig.suptitle("joint scheduler, one run: per app configuration, frames/s, accuracy; link; CPU load")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def option_costs(engine: Engine, name: str) -> dict[str, Any]:
    """What the joint planner charges the device for app ``name`` of ``engine`` (this machine at full
    speed, before ``--device-cpu``): each level's ms per frame and, at the server-only split, a
    request's ms with the local continuation and without it (``:direct``), the cheapest of each."""
    options = engine._apps[name].joint[0].options
    levels = {o.level: o for o in options if o.split is None and o.point is None}
    server_only = [o for o in options if o.split == "input"]
    return {"level_ms": [round(levels[k].device_ms, 4) for k in sorted(levels)],
            "level_memory_mb": [round(levels[k].memory_mb, 3) for k in sorted(levels)],
            "server_only_ms": {("with_continuation" if local else "direct"):
                               round(min(o.device_ms for o in server_only if o.continue_locally == local), 4)
                               for local in (True, False) if any(o.continue_locally == local for o in server_only)},
            "server_only_memory_mb": round(min((o.memory_mb for o in server_only), default=float("nan")), 3)}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    pool = Pool(args)
    config = SimulationConfig(seconds=args.seconds, pool_size=args.pool_size, min_apps=min(args.min_apps, args.pool_size),
                              max_apps=min(args.max_apps, args.pool_size), seed=args.seed)
    server = Server(Path(args.runs[0]) / "bundle.nfx")
    if "joint" in args.systems:  # the served bundle's split rows, measured once before the timed runs (as
        # the Offloaders' profile is): every engine of this process reuses them
        with Engine("joint_total") as e:
            e.add_app("warmup", pool.served, tail=f"127.0.0.1:{server.port}", profile_repeats=3)
            device_costs = option_costs(e, "warmup")
    else:
        device_costs = None
    if "split" in args.systems:
        pool.splitter(args)
    per: dict[str, list[dict[str, Any]]] = {s: [] for s in args.systems}
    timeline: list[dict[str, Any]] = []
    try:
        for run in range(args.seeds):
            trace = make_trace(config, run)
            link = link_trace(args, run)
            for system in args.systems:  # interleaved run by run: a drift of the machine hits every system
                burner = Burner(burn_windows(args, run))
                with LinkProxy(server.port, LinkModel(link, delay_ms=args.rtt_ms / 2),
                               LinkModel(None, delay_ms=args.rtt_ms / 2)).run_in_thread() as proxy:
                    if system == "split":
                        r = run_offloaders(pool, trace, proxy.port, burner, args, link)
                    else:
                        r = run_engine(system, pool, trace, proxy.port, burner, args,
                                       timeline if run == 0 and system == "joint" else None, link)
                per[system].append({"run": run, **r})
                print(f"run {run} {system:>10}: {r['fps']:.2f} frames/s, accuracy {100 * r['accuracy_all_frames']:.2f}%, "
                      f"SLO violations {100 * r['slo_violation_rate']:.1f}%, {r['bytes_sent']} B sent", flush=True)
        failures = failure_phase(pool, server, args) if "joint" in args.systems else None
    finally:
        server.stop()
    systems = {s: {"median": medians(v), "runs": [{k: x[k] for k in ("run", "fps", "accuracy_all_frames",
                                                                     "slo_violations", "slo_violation_rate", "frames",
                                                                     "bytes_sent", "server_ms", "resident_mb_peak")}
                                                  for x in v]}
               for s, v in per.items()}
    goals: dict[str, Any] = {}
    if "joint" in per and any(s in per for s in SINGLE_KNOB):
        vs = {s: compare(systems["joint"]["median"], systems[s]["median"]) for s in SINGLE_KNOB if s in per}
        per_run = {s: sum(compare(j, b)["met"] for j, b in zip(per["joint"], per[s])) for s in vs}
        goals["joint_vs_best_single_knob"] = {
            "target": ">= 1.3x frames/s at equal or better accuracy, or >= 2 points of accuracy at equal or better "
                      "frames/s, with fewer SLO violations, than every single-knob scheduler (median over runs)",
            "measured": vs, "met": all(v["met"] for v in vs.values()),
            "note": f"{args.seeds} seeded runs of {args.seconds} s; runs where the joint one met it, per baseline: {per_run}"}
        six = [m for r in per["joint"] for m in r["plan_ms_6_apps"]] or [m for r in per["joint"] for m in r["plan_ms"]]
        if six:
            goals["decision_time_live"] = {
                "target": "<= 5 ms median for 6 apps on this CPU", "measured": round(statistics.median(six), 3),
                "met": statistics.median(six) <= 5.0,
                "note": (f"the joint engine's plan time, median over {len(six)} plans with "
                         f"{'6' if any(r['plan_ms_6_apps'] for r in per['joint']) else 'fewer than 6'} apps, "
                         f"live (the CPU shared with the apps and the burner); the first plan of a bundle cuts its "
                         f"Pareto front")}
    if "joint" in per:
        peak = max(r["resident_mb_peak"] for r in per["joint"])
        goals["memory_within_budget"] = {
            "target": "what the joint engine's process holds within its memory budget, every run",
            "measured": round(peak, 3), "met": peak <= pool.memory_mb + 1e-6,
            "note": (f"the largest Engine.resident_bytes() (sessions: capacity and exit runtimes, the split runtimes "
                     f"once each) after every app's join and before every app's leave, over the {args.seeds} runs; "
                     f"budget {pool.memory_mb:.3f} MB")}
    if failures is not None:
        goals["every_frame_answered_under_failures"] = {
            "target": "every frame answered under a link stall past the deadline and a killed server; the other "
                      "apps keep running", "measured": failures,
            "met": failures["failed"] == 0 and (failures["other_app_answered_after_failures"] > 0),
            "note": "every submitted frame got its result: answered (where: server, local, fallback, device) or "
                    "dropped by the engine's camera policy (superseded by a newer frame, or late), which the "
                    "engine answers as dropped; failed counts frames whose future raised"}
    summary = {"benchmark": "joint_live", "machine": machine(), "seconds_total": round(time.perf_counter() - t_start, 1),
               "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}, "data_labels": sorted({s["data"] for s in pool.sources}),
               "memory_mb": pool.memory_mb, "device_costs": device_costs, "systems": systems, "failures": failures, "goals": goals,
               "timeline": timeline}
    write_json(out / "summary.json", summary)
    if timeline:
        plot(timeline, out / "timeline.png")
    write_run(out, __file__, argv)
    for g, v in goals.items():
        print(f"goal {g}: met={v['met']} measured={v['measured']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
