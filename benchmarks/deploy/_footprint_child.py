"""One measurement of benchmarks/deploy/deploy_footprint.py, in a fresh process (run by path, never imported
by the runtime): the same code drives today's runtime and the previous one (commit 2a8fdf1, run
from its source with PYTHONPATH), so both are measured alike.

    python benchmarks/deploy/_footprint_child.py MODE --api new|old BUNDLE [options]

MODE is ``footprint`` (import + load time, VmHWM after load, VmRSS after every level and both exit
sets ran once), ``latency`` (median ms per level at each batch size, the tuned plan, and per exit
set with every stage run), ``switch``
(every ordered level pair, with the onnxruntime sessions built counted) or ``answers`` (early
exit on the bundle's samples, batched and one frame at a time). Prints one JSON object.

It imports only the standard library before the timed import of ``nestflex.deploy``, so the
figures are the runtime's; the timing loop is written out here (not the package's timing helper)
because it must be the same code on both versions.
"""

from __future__ import annotations

import json
import sys
import time

__all__ = ["HEAVY", "parse_proc_status", "proc_status"]

#: the fields of /proc/self/status read, all in kB there
STATUS_FIELDS = ("VmRSS", "VmHWM", "RssAnon", "RssFile", "RssShmem")
#: top-level packages a torch-free runtime must not have imported
HEAVY = ("torch", "onnx", "lightning", "pytorch_lightning", "timm", "torchmetrics", "torchvision", "sympy",
         "triton")


def parse_proc_status(text: str, fields: tuple[str, ...] = STATUS_FIELDS) -> dict[str, int]:
    """Bytes of the ``kB`` fields ``fields`` of a ``/proc/<pid>/status`` text (those present).

    >>> parse_proc_status("Name:\\tpython\\nVmHWM:\\t  2048 kB\\nVmRSS:\\t  1024 kB\\nThreads:\\t3\\n")
    {'VmHWM': 2097152, 'VmRSS': 1048576}
    """
    out: dict[str, int] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep or key not in fields:
            continue
        parts = value.split()
        if len(parts) != 2 or parts[1] != "kB" or not parts[0].isdigit():
            raise ValueError(f"/proc status field {key!r}: expected '<int> kB', got {value.strip()!r}")
        out[key] = int(parts[0]) * 1024
    return out


def proc_status() -> dict[str, int]:
    with open("/proc/self/status", encoding="ascii") as f:
        return parse_proc_status(f.read())


def _heavy() -> list[str]:
    return sorted({m.split(".")[0] for m in sys.modules if m.split(".")[0] in HEAVY})


class _Api:
    """Today's runtime (``new``: ``nd.CapacityRuntime(bundle, ...)``, numpy) or the previous one
    (``old``: ``bundle.capacity(...)`` / ``bundle.progressive(...)``, torch tensors)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        import nestflex.deploy as nd

        self.nd = nd

    def load(self, path: str):
        return self.nd.load(path)

    def capacity(self, bundle, level: int, batch: int = 1):
        if self.kind == "new":
            return self.nd.CapacityRuntime(bundle, level=level, plan="auto", batch=batch)
        return bundle.capacity(level, plan="auto", batch=batch)

    def progressive(self, bundle, rt, key: str, active=None, fused=True):
        if self.kind == "new":
            return self.nd.ProgressiveRuntime(bundle, rt, exit_set=key, plan="auto", active=active, fused=fused)
        return bundle.progressive(rt, exit_set=key, plan="auto", active=active)

    def array(self, x):
        """``x`` (numpy) as the runtime takes it."""
        if self.kind == "new":
            return x
        import torch

        return torch.from_numpy(x)

    @staticmethod
    def numpy(y):
        import numpy as np

        return y.detach().cpu().numpy() if hasattr(y, "detach") else np.asarray(y)


def _inputs(bundle, n: int, seed: int = 0):
    import numpy as np

    shape = tuple(int(v) for v in bundle.input_spec["shape"])
    return np.random.default_rng(seed).standard_normal((n, *shape)).astype(np.float32)


def _median_ms(fn, repeats: int, warmup: int = 20) -> float:
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    samples.sort()
    mid = len(samples) // 2
    return 1e3 * (samples[mid] if len(samples) % 2 else (samples[mid - 1] + samples[mid]) / 2)


def footprint(kind: str, path: str, fused: bool = True) -> dict:
    start = time.perf_counter()
    api = _Api(kind)
    imported = time.perf_counter()
    bundle = api.load(path)
    loaded = time.perf_counter()
    after_load = proc_status()
    rt = api.capacity(bundle, 0)
    progs = {key: api.progressive(bundle, rt, key, fused=fused) for key in bundle.exit_sets}
    ready = time.perf_counter()
    x1, x8 = api.array(_inputs(bundle, 1)), api.array(_inputs(bundle, 8))
    backends = []
    for k in range(bundle.num_levels):
        rt.set_level(k)
        rt(x1)
        backends.append(rt.backend)
    for prog in progs.values():  # the shared sets switch rt to the largest level themselves
        if rt.level != bundle.num_levels - 1:
            rt.set_level(bundle.num_levels - 1)
        prog(x8)
        prog(x1)
    ran = time.perf_counter()
    after_run = proc_status()
    import nestflex

    return {"import_s": imported - start, "load_s": loaded - imported, "import_load_s": loaded - start,
            "runtime_ready_s": ready - loaded, "run_once_s": ran - ready, "after_load": after_load,
            "after_run": after_run, "backends": backends, "exit_sets": list(progs),
            "heavy": _heavy(), "nestflex": nestflex.__file__}


def latency(kind: str, path: str, batches: list[int], repeats: int) -> dict:
    api = _Api(kind)
    bundle = api.load(path)
    out: dict = {}
    for b in batches:
        rt = api.capacity(bundle, 0, batch=b)
        x = api.array(_inputs(bundle, b))
        rows = []
        for k in range(bundle.num_levels):
            rt.set_level(k)
            rows.append({"level": k, "backend": rt.backend, "ms": _median_ms(lambda rt=rt, x=x: rt(x), repeats)})
        out[str(b)] = rows
    # each exit set with no sample leaving early (every stage and head runs: the same work on both
    # runtimes whatever the inputs), on the largest level as the shared sets need
    exits: dict = {}
    try:  # reported beside the levels: a failure here must not lose the levels' figures
        rt = api.capacity(bundle, bundle.num_levels - 1)
        for key in bundle.exit_sets:
            prog = api.progressive(bundle, rt, key)
            never = [1.0] * (len(bundle.exit_sets[key]["names"]) - 1)
            exits[key] = {}
            for b in batches:
                x = api.array(_inputs(bundle, b))
                exits[key][str(b)] = _median_ms(lambda prog=prog, x=x: prog(x, thresholds=never), repeats)
    except Exception as e:  # noqa: BLE001 - the parent reports it
        exits = {"error": f"{type(e).__name__}: {e}"[:500]}
    return {"latency": out, "exits": exits, "heavy": _heavy()}


def switch(kind: str, path: str, repeats: int) -> dict:
    import onnxruntime as ort

    built = [0]
    init = ort.InferenceSession.__init__

    def counting(self, *args, **kwargs):  # every session the runtime builds, whoever builds it
        built[0] += 1
        init(self, *args, **kwargs)

    ort.InferenceSession.__init__ = counting
    api = _Api(kind)
    bundle = api.load(path)
    rt = api.capacity(bundle, 0)
    x = api.array(_inputs(bundle, 1))
    levels = bundle.num_levels
    for k in range(levels):  # every level once: what a runtime prepares lazily is ready after this
        rt.set_level(k)
        rt(x)
    before = built[0]
    pairs = []
    first_builds = 0
    for a in range(levels):
        for b in range(levels):
            if a == b:
                continue
            ms = []
            for _ in range(repeats):
                rt.set_level(a)
                rt(x)
                n = built[0]
                start = time.perf_counter()
                rt.set_level(b)
                ms.append(1e3 * (time.perf_counter() - start))
                rt(x)  # the frame after the switch: nothing may be built for it either
                first_builds += built[0] - n
            ms.sort()
            pairs.append({"from": a, "to": b, "median_ms": ms[len(ms) // 2], "max_ms": ms[-1], "ms": ms})
    return {"pairs": pairs, "sessions_at_start": before, "sessions_built_in_switches": built[0] - before,
            "sessions_built_on_switch_and_next_frame": first_builds, "heavy": _heavy()}


def answers(kind: str, path: str, samples: int) -> dict:
    api = _Api(kind)
    bundle = api.load(path)
    got = bundle.samples()
    x = _inputs(bundle, samples, seed=1) if got is None else api.numpy(got[0])[:samples]
    rt = api.capacity(bundle, bundle.num_levels - 1)
    out: dict = {"samples": int(x.shape[0]), "inputs": "random: the bundle ships no samples" if got is None
                 else "the bundle's samples"}
    for key in bundle.exit_sets:
        # every early exit evaluated on both sides: each runtime's own tune chooses the exits it keeps
        # by measured time, so two plans may keep different subsets, a choice and not the runtime
        early = len(bundle.exit_sets[key]["names"]) - 1
        prog = api.progressive(bundle, rt, key, active=list(range(early)))
        batched = prog(api.array(x))
        single = [prog(api.array(x[i:i + 1])) for i in range(x.shape[0])]
        row = {}
        for name, res in (("batched", [batched]), ("single", single)):
            row[name] = {
                "exit_index": [int(v) for r in res for v in api.numpy(r.exit_index).tolist()],
                "answer_index": [int(v) for r in res for v in api.numpy(r.answer_index).tolist()],
                "prediction": [int(v) for r in res for v in api.numpy(r.logits).argmax(1).tolist()],
                "logits": [[float(v) for v in row_] for r in res for row_ in api.numpy(r.logits).tolist()],
            }
        out[key] = row
    return out


def main(argv: list[str]) -> dict:
    import argparse

    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["footprint", "latency", "switch", "answers"])
    p.add_argument("bundle")
    p.add_argument("--api", choices=["new", "old"], required=True)
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    p.add_argument("--repeats", type=int, default=50)
    p.add_argument("--samples", type=int, default=512)
    p.add_argument("--unfused", action="store_true", help="footprint: exit sets without the fused one-call graph")
    a = p.parse_args(argv)
    if a.mode == "footprint":
        return footprint(a.api, a.bundle, fused=not a.unfused)
    if a.mode == "latency":
        return latency(a.api, a.bundle, a.batches, a.repeats)
    if a.mode == "switch":
        return switch(a.api, a.bundle, a.repeats)
    return answers(a.api, a.bundle, a.samples)


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:])))
