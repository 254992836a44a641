"""Bundles and torch references for the light tests, made with torch in the full install.

    python tests/light/make_bundles.py DIR      # DIR/shipped.nfx, DIR/derived.nfx, DIR/references.npz

``tests/light`` runs on the base install (no torch, no onnx) against what this script wrote with
the training side: ``.ci/light`` runs it in the full venv first and hands ``DIR`` to the light
venv as ``NESTFLEX_LIGHT_BUNDLES``; in the full test run ``conftest.py`` calls :func:`make` into
a temporary directory. Two bundles of ``tests/export/bundles.py``'s 3-level nested VGG-11 x0.125,
so that both ways the runtime gets its graphs are covered:

* ``shipped``: ONNX files written by the exporter, SDN exits and FlexDNN exits both on the shared
  backbone, with 16 labelled samples (for ``nestflex tune``);
* ``derived``: no ONNX (the runtime writes its graphs from the bundle's program), SDN exits on
  the shared backbone, FlexDNN exits on their own backbone.

Both carry hand-set level accuracies and a hand-made SDN calibration, so the device engine can
schedule them. ``references.npz`` holds, per bundle (keys ``<bundle>.<name>``), from the training
model in eval mode (the torch reference): the fixed input ``x``; ``level_<k>`` logits; per exit
set ``<set>.exit_<j>`` logits; the batched early exit under each policy of :data:`POLICIES`
(``<set>.ee.<policy>.logits`` / ``.exit_index`` / ``.answer_index``: the shipped thresholds, 0
and 1, and ``mix``/``mix_final``, thresholds set between the samples' confidences so every exit
answers some); for every split point the tensor crossing the cut (``split.<name>.crossing_0``);
and ``meta``: a JSON string describing the bundles (levels, exit sets, each policy's thresholds,
fallback and margin, split points) for the tests.

torch is imported inside functions only: pytest's ``--doctest-modules`` imports this file in
the light venv too.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["ACCURACY", "BUNDLES", "POLICIES", "make"]

#: the bundles written, by name
BUNDLES = ("shipped", "derived")
#: early-exit policies the references cover, besides ``mix`` (see :func:`_mix_thresholds`): name,
#: thresholds (``None``: the set's shipped ones) and fallback (``None``: the shipped one)
POLICIES = [("shipped", None, None), ("zero", 0.0, "final"), ("one", 1.0, "final")]
#: hand-set level accuracies (the engine schedules on them)
ACCURACY = [0.80, 0.81, 0.82]
#: a hand-made SDN exit calibration (the sweep and the lossless thresholds), as in tests/deploy/test_engine.py
CALIBRATION = {
    "split": "validation", "samples": 1000, "final_accuracy": 0.82,
    "lossless": {"thresholds": [0.97, 0.95], "fallback": "most_confident", "accuracy": 0.82,
                 "mean_macs_fraction": 0.9, "exit_rate": [0.05, 0.05, 0.9]},
    "sweep": [
        {"threshold": 0.0, "accuracy": 0.60, "mean_macs_fraction": 0.3, "exit_rate": [1.0, 0.0, 0.0]},
        {"threshold": 0.5, "accuracy": 0.74, "mean_macs_fraction": 0.5, "exit_rate": [0.5, 0.3, 0.2]},
        {"threshold": 0.9, "accuracy": 0.80, "mean_macs_fraction": 0.7, "exit_rate": [0.2, 0.2, 0.6]},
    ],
}
SAMPLES = 8  # rows of the fixed input


def _write(name: str, tmp: Path) -> tuple[Path, Any, dict[str, Any]]:
    """One bundle; returns its path, the training model (nested net) and its exit networks by set."""
    import torch

    from nestflex.capacity.profile import profile_levels
    from tests.export.bundles import nested_vgg, write_flex_bundle

    scratch = tmp / f"{name}.scratch"
    scratch.mkdir(parents=True, exist_ok=True)
    rows = profile_levels(nested_vgg(scratch), None, batch_sizes=(1,), repeats=1, input_shape=(3, 32, 32))
    levels = [{**r, "accuracy": a} for r, a in zip(rows, ACCURACY)]
    extra: dict[str, Any] = {"levels": levels, "calibration": CALIBRATION}
    if name == "shipped":
        g = torch.Generator().manual_seed(5)
        extra["samples"] = (torch.randn(16, 3, 32, 32, generator=g), torch.randint(0, 10, (16,), generator=g))
    work = tmp / f"{name}.work"
    work.mkdir(parents=True, exist_ok=True)
    info, net, exits, flex, _ = write_flex_bundle(work, onnx=name == "shipped", own=name == "derived", **extra)
    path = tmp / f"{name}.nfx"
    Path(info["bundle"]).rename(path)
    return path, net, {"exits": exits, "flex_exits": flex}


def _crossing(top: Any, split: dict[str, Any], x: Any) -> list[np.ndarray]:
    """The tensor crossing ``split`` for input ``x``, by a forward hook on the module the split is
    named after (a single-tensor split of a module's output, as every split of a VGG); else empty."""
    import torch

    modules = dict(top.named_modules())
    if len(split["tensors"]) != 1 or split["name"] not in modules:
        return []
    got: list[np.ndarray] = []
    hook = modules[split["name"]].register_forward_hook(lambda m, i, o: got.append(o.detach().numpy().copy()))
    try:
        with torch.no_grad():
            top(x)
    finally:
        hook.remove()
    return got


def _mix_thresholds(logits: list[Any], confidence: str) -> tuple[list[float], float]:
    """Per early exit, a threshold half-way across the widest gap between the confidences of the
    samples still running there, among the cuts that let a quarter to three quarters of them
    leave, so that every exit answers some samples; with the smallest distance of a running
    sample's confidence to its threshold (a float32 difference between runtimes below it cannot
    change a decision)."""
    from nestflex.deploy.exits import get_confidence

    conf = get_confidence(confidence)
    running = np.arange(logits[0].shape[0])
    thresholds, margin = [], np.inf
    for t in logits[:-1]:
        c = np.asarray(conf(t.numpy()), dtype=np.float64)
        here = np.sort(c[running])
        if len(here) < 2:
            thresholds.append(1.0)
            continue
        cuts = range(max(1, len(here) // 4), max(2, (3 * len(here) + 3) // 4))  # samples below the cut stay
        cut = max(cuts, key=lambda i: here[i] - here[i - 1])
        thresholds.append(round(float(here[cut - 1] + here[cut]) / 2, 7))
        margin = min(margin, float(np.min(np.abs(c[running] - thresholds[-1]))))
        running = running[c[running] < thresholds[-1]]
    return thresholds, margin


def _margin(logits: list[Any], confidence: str, thresholds: Any) -> float:
    from nestflex.deploy.exits import get_confidence

    conf = get_confidence(confidence)
    thr = [float(thresholds)] * (len(logits) - 1) if not isinstance(thresholds, list) else thresholds
    return float(min(np.min(np.abs(np.asarray(conf(t.numpy()), dtype=np.float64) - th))
                     for t, th in zip(logits[:-1], thr)))


def _references(name: str, path: Path, net: Any, nets: dict[str, Any]) -> tuple[dict[str, np.ndarray], dict]:
    import torch

    import nestflex.deploy as nd
    from nestflex.capacity import extract_level, set_level

    bundle = nd.load(path)
    levels = bundle.num_levels
    x = torch.randn(SAMPLES, *bundle.input_spec["shape"], generator=torch.Generator().manual_seed(11))
    out: dict[str, np.ndarray] = {"x": x.numpy()}
    meta: dict[str, Any] = {"levels": levels, "input_shape": list(bundle.input_spec["shape"]),
                            "num_classes": bundle.manifest["num_classes"], "exit_sets": {}, "splits": []}
    with torch.no_grad():
        for k in range(levels):
            set_level(net, k)
            out[f"level_{k}"] = net(x).numpy()
        for key, ex in bundle.exit_sets.items():
            model = nets[key]
            logits = model(x)
            for j, t in enumerate(logits):
                out[f"{key}.exit_{j}"] = t.numpy()
            mix, mix_margin = _mix_thresholds(logits, ex["confidence"])
            policies = []
            for pname, thr, fallback in [*POLICIES, ("mix", mix, "most_confident"), ("mix_final", mix, "final")]:
                thresholds = list(ex["thresholds"]) if thr is None else thr
                fb = ex["fallback"] if fallback is None else fallback
                r = model.early_exit(x, thresholds=thresholds, confidence=ex["confidence"], fallback=fb)
                out[f"{key}.ee.{pname}.logits"] = r.logits.numpy()
                out[f"{key}.ee.{pname}.exit_index"] = r.exit_index.numpy().astype(np.int64)
                out[f"{key}.ee.{pname}.answer_index"] = r.answer_index.numpy().astype(np.int64)
                margin = mix_margin if thr is mix else _margin(logits, ex["confidence"], thresholds)
                policies.append({"name": pname, "thresholds": thresholds, "fallback": fb, "margin": margin})
            meta["exit_sets"][key] = {"num_exits": len(logits), "names": list(ex["names"]),
                                      "thresholds": list(ex["thresholds"]), "confidence": ex["confidence"],
                                      "fallback": ex["fallback"], "backbone": ex["backbone"], "policies": policies}
        top = extract_level(net, levels - 1).eval()
        for s in bundle.splits:
            crossing = _crossing(top, s, x)
            for i, t in enumerate(crossing):
                out[f"split.{s['name']}.crossing_{i}"] = t
            meta["splits"].append({"name": s["name"], "node": s["node"], "tensors": s["tensors"],
                                   "crossing": len(crossing)})
    meta["samples"] = bundle.samples() is not None
    meta["onnx"] = any(rel.endswith(".onnx") for rel in bundle.manifest["files"])
    return out, meta


def make(out_dir: str | Path) -> Path:
    """Write both bundles and ``references.npz`` into ``out_dir``; returns ``out_dir``."""
    import torch

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(min(2, torch.get_num_threads()))
    arrays: dict[str, np.ndarray] = {}
    meta: dict[str, Any] = {}
    for name in BUNDLES:
        path, net, nets = _write(name, out)
        refs, meta[name] = _references(name, path, net, nets)
        arrays.update({f"{name}.{k}": v for k, v in refs.items()})
        for scratch in (f"{name}.scratch", f"{name}.work"):
            shutil.rmtree(out / scratch)
    np.savez(out / "references.npz", meta=np.array(json.dumps(meta)), **arrays)
    return out


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print(__doc__.splitlines()[2].strip(), file=sys.stderr)
        raise SystemExit(2)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `tests.*` builders
    print(make(sys.argv[1]))
