"""Per-layer precision profiler (Cappuccino's inexact computing, on what torch offers on a CPU).

Cappuccino measures, per layer, the validation accuracy under each imprecise arithmetic mode and
runs as many layers as it can in fast modes within the user's accuracy-drop limit. On a CPU
torch offers three such modes per compute layer (conv / linear):

* ``float32``: the reference;
* ``bfloat16``: the layer's weights in bfloat16, its input cast to bfloat16 and its output back
  to float32 (:class:`BFloat16Layer`); oneDNN runs it natively where the CPU has AVX512-BF16/AMX;
* ``int8``: static post-training quantisation with ``torch.ao.quantization``'s fx mode (per-
  channel weights, activation ranges calibrated on held-out samples, the engine in
  ``torch.backends.quantized.engine``); ``int8_dynamic`` (not profiled by default): dynamic
  quantisation, which torch supports for linear layers only.

All models, the float32 reference included, are built by :func:`build_mixed_precision_model`,
which goes through fx's conv+BN(+ReLU) fusion: int8 needs the fusion, and giving the reference
the same folded BatchNorm means a speedup is the precision's, not the fusion's. The unfused
model's latency is reported next to it.

**Latency.** Whole-model differences from switching one small layer are often below the noise of
a shared 2-core machine, so each layer is timed *alone*, on the input it receives in the
reference model (recorded with a hook), at each batch size: the float32 module, the same module
wrapped for bfloat16, and the same module quantised alone (which includes quantising its input
and dequantising its output: the cost of switching that one layer). Variants are timed in
alternation, median of ``repeats``. The chosen assignment is then built and timed as a whole
against the float32 reference, alternating again, so its speedup is measured, not summed.

**Assignment.** :func:`plan_assignment` is a pure greedy: lossless switches first (largest saving
first), then by time saved per point of accuracy lost, while the sum of the single-layer drops
stays within the budget. The combined assignment is then built and evaluated; while its
measured drop exceeds the budget the least efficient switch is undone. An assignment measured
slower than float32 is replaced by all-float32.
"""

from __future__ import annotations

import copy
import math
import warnings
from contextlib import contextmanager
from typing import Any, Iterable, Iterator, Mapping, Sequence

import torch
from torch import nn

from nestflex._machine import machine
from nestflex.deploy.timing import alternating_median_ms, median_ms
from nestflex.errors import ProfileError
from nestflex.graph import trace
from nestflex.profiling.split_quant import _accuracy, _collect

__all__ = [
    "DEFAULT_PRECISIONS",
    "PRECISIONS",
    "SCHEMA_VERSION",
    "BFloat16Layer",
    "build_mixed_precision_model",
    "plan_assignment",
    "profile_layer_precision",
]

SCHEMA_VERSION = 1
#: every precision a layer can be switched to; ``float32`` is the reference
PRECISIONS: tuple[str, ...] = ("float32", "bfloat16", "int8", "int8_dynamic")
DEFAULT_PRECISIONS: tuple[str, ...] = ("float32", "bfloat16", "int8")
_QUANTISED = ("int8", "int8_dynamic")


class BFloat16Layer(nn.Module):
    """Runs ``layer`` in bfloat16 inside a float32 model.

    The input is cast to bfloat16 and the output back to float32, so the layers around it are
    untouched.

    Args:
        layer: the layer to wrap; it is converted to bfloat16 in place.

    Examples:
        >>> layer = BFloat16Layer(nn.Linear(4, 2))
        >>> layer.layer.weight.dtype, layer(torch.ones(1, 4)).dtype
        (torch.bfloat16, torch.float32)
    """

    def __init__(self, layer: nn.Module) -> None:
        super().__init__()
        self.layer = layer.to(torch.bfloat16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x.to(torch.bfloat16)).to(torch.float32)


# ---------------------------------------------------------------------------------------------
# building models


@contextmanager
def _quiet_ao() -> Iterator[None]:
    # torch.ao.quantization warns on every call that it is deprecated in favour of torchao's pt2e
    # flow (not installed here); the warning says nothing about this run, so it is muted here only.
    # The quantisation tracer also symbolises a stack trace for every fx node, for debugging;
    # that is a large share of a build and nothing here reads it.
    import torch.fx.config as fx_config

    saved = getattr(fx_config, "do_not_emit_stack_traces", None)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"torch\.ao")
        warnings.filterwarnings("ignore", message=r".*torch\.ao\.quantization is deprecated.*")
        warnings.filterwarnings("ignore", message=r".*quant_min and quant_max.*")
        warnings.filterwarnings("ignore", message=r".*quantized tensor creation functions.*")
        if saved is not None:
            fx_config.do_not_emit_stack_traces = True
        try:
            yield
        finally:
            if saved is not None:
                fx_config.do_not_emit_stack_traces = saved


def _check_precision(name: Any, arg: str) -> str:
    if name not in PRECISIONS:
        raise ProfileError(
            f"`{arg}` has an unknown precision {name!r}; choose from {', '.join(PRECISIONS)}. "
            f"HINT: the default is {list(DEFAULT_PRECISIONS)}"
        )
    return name


def _unsupported(module: nn.Module, precision: str) -> str | None:
    """Why ``precision`` cannot run ``module`` (``None`` when it can)."""
    if precision == "int8_dynamic" and not isinstance(module, nn.Linear):
        return "torch's dynamic quantisation covers linear (and recurrent) layers only"
    if precision in _QUANTISED and torch.backends.quantized.engine in (None, "none"):
        return "no quantized engine in this torch build"
    return None


def _fx_convert(
    model: nn.Module,
    quantise: Mapping[str, str],
    calibration: torch.Tensor | None,
    example: torch.Tensor,
    chunk: int = 256,
) -> nn.Module:
    """fx-fuse ``model`` and quantise the named modules (``name -> int8 | int8_dynamic``)."""
    from torch.ao.quantization import QConfigMapping, default_dynamic_qconfig, get_default_qconfig
    from torch.ao.quantization.quantize_fx import convert_fx, prepare_fx

    engine = torch.backends.quantized.engine
    mapping = QConfigMapping()
    for name, precision in quantise.items():
        mapping.set_module_name(name, get_default_qconfig(engine) if precision == "int8" else default_dynamic_qconfig)
    with _quiet_ao():
        try:
            prepared = prepare_fx(model, mapping, example_inputs=(example,))
        except Exception as e:
            raise ProfileError(
                f"`model` ({type(model).__name__}) could not be traced by torch.ao.quantization's fx mode: "
                f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}. "
                f"HINT: every precision goes through fx fusion; the model must be symbolically traceable"
            ) from e
        if "int8" in quantise.values():
            with torch.no_grad():
                for i in range(0, calibration.shape[0], chunk):
                    prepared(calibration[i : i + chunk])
        converted = convert_fx(prepared)
    return converted.eval()


def _layer_modules(model: nn.Module, input_shape: tuple[int, ...]) -> dict[str, nn.Module]:
    graph = trace(model, input_shape=input_shape)
    return {layer.name: model.get_submodule(layer.name) for layer in graph.layers}


def build_mixed_precision_model(
    model: nn.Module,
    assignment: Mapping[str, str],
    calibration: torch.Tensor | None = None,
    input_shape: tuple[int, ...] | None = None,
) -> nn.Module:
    """Build an eval-mode copy of ``model`` with each named layer in its assigned precision.

    Conv+BatchNorm(+ReLU) patterns are fused first (BatchNorm folded into the conv), for every
    layer: int8 needs it, and the float32 reference (``assignment={}``) gets the same fusion, so
    comparisons isolate precision. Layers not in ``assignment`` stay float32. ``model`` itself is
    not modified. This is what a bundle's runtime calls with the profile's ``assignment``.

    Args:
        model: an image classifier that torch.fx can trace.
        assignment: ``{layer name: precision}`` with precisions from :data:`PRECISIONS`; names
            are compute layers (conv / linear) of ``trace(model).layers``.
        calibration: input images for the int8 activation ranges; required when any layer is
            ``int8``, ignored otherwise.
        input_shape: per-sample input shape; default ``calibration``'s, else ``(3, 32, 32)``.

    Returns:
        the mixed-precision model (an fx ``GraphModule`` in eval mode).

    Raises:
        ProfileError: an unknown layer or precision, a precision the layer cannot run, int8
            without ``calibration``, or a model fx cannot trace.

    Examples:
        >>> from nestflex.models import create_model
        >>> m = create_model("vgg11", width=0.125).eval()
        >>> x = torch.randn(8, 3, 32, 32)
        >>> mixed = build_mixed_precision_model(m, {"features.conv2": "int8", "features.conv3": "bfloat16"}, x)
        >>> type(mixed.get_submodule("features.conv3")).__name__
        'BFloat16Layer'
        >>> bool((mixed(x) - m(x)).abs().max() < 0.5)
        True
    """
    if not isinstance(assignment, Mapping):
        raise ProfileError(f"`assignment` must be a mapping of layer name to precision, got {type(assignment).__name__}")
    if input_shape is None:
        input_shape = tuple(calibration.shape[1:]) if calibration is not None else (3, 32, 32)
    layers = _layer_modules(model, input_shape)
    for name, precision in assignment.items():
        if name not in layers:
            raise ProfileError(
                f"`assignment` names an unknown layer {name!r}; compute layers: {', '.join(layers)}. "
                f"HINT: layer names are those of `nestflex.graph.trace(model).layers`"
            )
        _check_precision(precision, f"assignment[{name!r}]")
        reason = _unsupported(layers[name], precision)
        if reason:
            raise ProfileError(f"`assignment[{name!r}]` = {precision!r} is not supported: {reason}")
    if "int8" in assignment.values() and (calibration is None or calibration.shape[0] == 0):
        raise ProfileError(
            "`calibration` is required for int8 layers (static quantisation calibrates activation ranges). "
            "HINT: pass a few hundred validation images"
        )
    return _build(model, assignment, calibration, input_shape)


def _build(model: nn.Module, assignment: Mapping[str, str], calibration: torch.Tensor | None,
           input_shape: tuple[int, ...]) -> nn.Module:
    """:func:`build_mixed_precision_model` without the checks (the profiler checks once)."""
    quantise = {n: p for n, p in assignment.items() if p in _QUANTISED}
    work = copy.deepcopy(model).cpu().eval()
    example = torch.zeros(1, *input_shape)
    mixed = _fx_convert(work, quantise, calibration, example)
    for name, precision in assignment.items():
        if precision == "bfloat16":
            parent, _, leaf = name.rpartition(".")
            holder = mixed.get_submodule(parent) if parent else mixed
            setattr(holder, leaf, BFloat16Layer(getattr(holder, leaf)))
    return mixed


# ---------------------------------------------------------------------------------------------
# timing inputs (the timing itself is nestflex.deploy.timing's)


def _record_inputs(model: nn.Module, names: Sequence[str], images: torch.Tensor) -> dict[str, torch.Tensor]:
    inputs: dict[str, torch.Tensor] = {}
    hooks = [
        model.get_submodule(n).register_forward_pre_hook(lambda _m, args, n=n: inputs.__setitem__(n, args[0].detach().clone()))
        for n in names
    ]
    try:
        with torch.no_grad():
            model(images)
    finally:
        for h in hooks:
            h.remove()
    return inputs


def _isolated_variant(module: nn.Module, precision: str, calibration: torch.Tensor) -> nn.Module:
    if precision == "float32":
        return module
    if precision == "bfloat16":
        return BFloat16Layer(copy.deepcopy(module))
    # quantised alone: includes quantising its input and dequantising its output
    return _fx_convert(nn.Sequential(copy.deepcopy(module)).eval(), {"0": precision}, calibration, calibration[:1])


# ---------------------------------------------------------------------------------------------
# the assignment (pure)


def plan_assignment(rows: Sequence[Mapping[str, Any]], budget_points: float, batch_size: int) -> list[dict[str, Any]]:
    """Greedy per-layer precision choice from single-layer measurements.

    A layer's options are its supported precisions that are faster than float32 at
    ``batch_size``; each carries the time it saves and its single-layer accuracy drop (a negative
    drop counts as 0). Starting from all-float32, each step takes the move (a layer to a faster
    option than its current one) with the most time saved per extra point of drop, moves that
    cost no accuracy first and largest saving first among them, as long as the sum of the chosen
    options' drops stays within ``budget_points``. Moving a layer again (bfloat16, then int8)
    is allowed, so a cheap lossless step does not block a better one later.

    Args:
        rows: the ``layers`` rows of a precision profile.
        budget_points: accuracy drop allowed, in percentage points.
        batch_size: the batch size whose latencies are compared.

    Returns:
        the moves in the order taken: dicts with ``layer``, ``precision``, ``saved_ms`` and
        ``drop_points`` of that option. Replaying them (later moves of a layer win) gives the
        assignment; dropping moves from the end undoes the least efficient first.

    Examples:
        >>> rows = [{"name": "a", "per_precision": [
        ...     {"precision": "float32", "supported": True, "drop_points": 0.0, "latency_ms": {"1": 2.0}},
        ...     {"precision": "int8", "supported": True, "drop_points": 0.5, "latency_ms": {"1": 1.0}}]}]
        >>> [m["precision"] for m in plan_assignment(rows, 1.0, 1)], plan_assignment(rows, 0.0, 1)
        (['int8'], [])
    """
    key = str(batch_size)
    options: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        base = next(p for p in row["per_precision"] if p["precision"] == "float32")["latency_ms"][key]
        options[row["name"]] = [
            {"layer": row["name"], "precision": p["precision"], "saved_ms": base - p["latency_ms"][key],
             "drop_points": max(0.0, p["drop_points"])}
            for p in row["per_precision"]
            if p["precision"] != "float32" and p["supported"] and base - p["latency_ms"][key] > 0
        ]
    current: dict[str, dict[str, Any]] = {}
    spent, moves = 0.0, []
    while True:
        best, best_key = None, None
        for layer, opts in options.items():
            now = current.get(layer, {"saved_ms": 0.0, "drop_points": 0.0})
            for o in opts:
                gain, cost = o["saved_ms"] - now["saved_ms"], o["drop_points"] - now["drop_points"]
                if gain <= 0 or spent + cost > budget_points + 1e-9:
                    continue
                k = (0, -gain) if cost <= 0 else (1, -gain / cost)
                if best_key is None or k < best_key:
                    best, best_key = o, k
        if best is None:
            return moves
        spent += best["drop_points"] - current.get(best["layer"], {"drop_points": 0.0})["drop_points"]
        current[best["layer"]] = best
        moves.append(best)


def _replay(moves: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    return {m["layer"]: m["precision"] for m in moves}


# ---------------------------------------------------------------------------------------------
# the profiler


def _positive_int(arg: str, value: Any, minimum: int = 1) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ProfileError(f"`{arg}` must be an int >= {minimum}, got {value!r}")
    return value


@torch.no_grad()
def profile_layer_precision(
    model: nn.Module,
    batches: Iterable,
    *,
    precisions: Sequence[str] = DEFAULT_PRECISIONS,
    layers: Sequence[str] | None = None,
    budget_points: float = 1.0,
    max_samples: int = 1000,
    calibration_samples: int = 256,
    batch_sizes: Sequence[int] = (64, 1),
    repeats: int = 9,
    threads: int | None = None,
) -> dict[str, Any]:
    """Per-layer accuracy and latency in each precision, and the fastest assignment in budget.

    The first ``calibration_samples`` samples of ``batches`` calibrate int8 activation ranges
    (only when ``int8`` is profiled); the next ``max_samples`` measure accuracy.

    Args:
        model: an image classifier torch.fx can trace (not modified; evaluated on a copy).
        batches: iterable of ``(images, labels, ...)`` batches, e.g. a validation DataLoader.
        precisions: names from :data:`PRECISIONS`; ``float32`` is always included.
        layers: compute layers to profile (``trace(model).layers`` names); ``None`` = all.
        budget_points: accuracy drop the assignment may cost, in percentage points (>= 0).
        max_samples: samples for accuracy.
        calibration_samples: held-out samples that calibrate int8.
        batch_sizes: batch sizes latencies are measured at; the assignment is chosen for the
            first one.
        repeats: timed repeats per latency (median reported).
        threads: torch intra-op threads for the run (restored afterwards); ``None`` keeps the
            current setting. Either way the count is recorded in ``machine``.

    Returns:
        a JSON-ready dict, schema in docs/profiling.md.

    Raises:
        ProfileError: an unknown precision or layer, a negative budget, non-positive counts, no
            data (or none left after calibration), or a model fx cannot trace.

    Examples:
        >>> from nestflex.models import create_model
        >>> m = create_model("vgg11", width=0.125).eval()
        >>> data = [(torch.randn(40, 3, 32, 32), torch.randint(0, 10, (40,)))]
        >>> prof = profile_layer_precision(m, data, layers=["features.conv2"], max_samples=24,
        ...                                calibration_samples=16, batch_sizes=(8,), repeats=3, threads=1)
        >>> [p["precision"] for p in prof["layers"][0]["per_precision"]]
        ['float32', 'bfloat16', 'int8']
        >>> prof["assignment"]["drop_points"] <= 1.0
        True
    """
    if isinstance(precisions, str) or not precisions:
        raise ProfileError(f"`precisions` must be a non-empty sequence of names from {list(PRECISIONS)}, got {precisions!r}")
    wanted = ["float32"] + [_check_precision(p, "precisions") for p in precisions if p != "float32"]
    wanted = list(dict.fromkeys(wanted))
    if isinstance(budget_points, bool) or not isinstance(budget_points, (int, float)) or not budget_points >= 0 \
            or math.isinf(budget_points):
        raise ProfileError(
            f"`budget_points` must be a finite number >= 0 (accuracy points), got {budget_points!r}. "
            f"HINT: 1.0 allows one percentage point of accuracy drop"
        )
    _positive_int("max_samples", max_samples)
    _positive_int("repeats", repeats)
    _positive_int("calibration_samples", calibration_samples)
    if isinstance(batch_sizes, (int, str)) or not batch_sizes:
        raise ProfileError(f"`batch_sizes` must be a non-empty sequence of positive ints, got {batch_sizes!r}")
    for b in batch_sizes:
        _positive_int("batch_sizes", b)
    sizes = list(dict.fromkeys(batch_sizes))
    if threads is not None:
        _positive_int("threads", threads)
    previous = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        return _profile(model, batches, wanted, layers, budget_points, max_samples, calibration_samples, sizes, repeats)
    finally:
        torch.set_num_threads(previous)


def _profile(model, batches, wanted, layers, budget_points, max_samples, calibration_samples, sizes, repeats):
    """The measurements of :func:`profile_layer_precision`, its arguments already checked."""
    calib_n = calibration_samples if "int8" in wanted else 0
    images, labels = _collect(batches, calib_n + max_samples)
    if images.shape[0] <= calib_n:
        raise ProfileError(
            f"`batches` held {images.shape[0]} samples, all taken by `calibration_samples`={calibration_samples}; "
            f"none left to measure accuracy. HINT: lower `calibration_samples` or pass more data"
        )
    calibration, images, labels = images[:calib_n].float(), images[calib_n:].float(), labels[calib_n:]
    input_shape = tuple(images.shape[1:])

    graph = trace(model, input_shape=input_shape)
    all_layers = {layer.name: layer for layer in graph.layers}
    names = list(all_layers) if layers is None else list(layers)
    for n in names:
        if n not in all_layers:
            raise ProfileError(
                f"`layers` names an unknown layer {n!r}; compute layers: {', '.join(all_layers)}. "
                f"HINT: layer names are those of `nestflex.graph.trace(model).layers`"
            )
    if not names:
        raise ProfileError("`layers` is empty. HINT: pass None to profile every compute layer")

    reference = _build(model, {}, None, input_shape)
    ref_acc = _accuracy(reference, images, labels)
    # timing inputs: the first max(sizes) samples, repeated when there are fewer
    need = max(sizes)
    timing_images = _timing_batch(images, need)
    recorded = _record_inputs(reference, names, timing_images)
    calib_for_layers = _record_inputs(reference, names, calibration[:need]) if calib_n else {}

    rows = []
    for name in names:
        layer = all_layers[name]
        module = reference.get_submodule(name)
        original = model.get_submodule(name)
        variants, per_precision = {}, {}
        for precision in wanted:
            reason = _unsupported(original, precision)
            if reason:
                per_precision[precision] = {"precision": precision, "supported": False, "reason": reason}
                continue
            if precision == "float32":
                acc = ref_acc
            else:
                mixed = _build(model, {name: precision}, calibration, input_shape)
                acc = _accuracy(mixed, images, labels)
            per_precision[precision] = {"precision": precision, "supported": True, "accuracy": acc,
                                        "drop_points": round(100 * (ref_acc - acc), 4)}
            variants[precision] = _isolated_variant(module, precision, calib_for_layers.get(name, recorded[name]))
        latency: dict[str, dict[str, float]] = {p: {} for p in variants}
        for bs in sizes:
            x = recorded[name][:bs]
            ms = alternating_median_ms({p: (lambda v=v: v(x)) for p, v in variants.items()}, repeats, min_ms=1.0)
            for p, t in ms.items():
                latency[p][str(bs)] = t
        for p, t in latency.items():
            per_precision[p]["latency_ms"] = t
        rows.append({
            "name": name,
            "kind": layer.kind,
            "macs": layer.macs,
            "input_shape": list(recorded[name].shape[1:]),
            "per_precision": [per_precision[p] for p in wanted],
        })

    assignment, ref_ms = _choose(model, reference, rows, wanted, budget_points, sizes, repeats, calibration,
                                 images, labels, ref_acc, input_shape)
    unfused_model = copy.deepcopy(model).cpu().eval()
    unfused = {str(bs): median_ms(lambda bs=bs: unfused_model(timing_images[:bs]), repeats, min_ms=1.0)
               for bs in sizes}
    return {
        "schema_version": SCHEMA_VERSION,
        "precisions": wanted,
        "samples": int(images.shape[0]),
        "calibration_samples": int(calibration.shape[0]),
        "batch_sizes": sizes,
        "optimised_batch_size": sizes[0],
        "repeats": repeats,
        "latency_method": (
            "layers timed alone on their recorded input (quantise/dequantise or bf16 casts at the layer's "
            "boundary included); whole models timed end to end; variants alternated, median of repeats, "
            "ms per batch"
        ),
        "machine": machine(quantized_engine=torch.backends.quantized.engine),
        "reference": {
            "precision": "float32",
            "accuracy": ref_acc,
            "latency_ms": ref_ms,
            "unfused_latency_ms": unfused,
            "note": "conv+BN(+ReLU) fused, BatchNorm folded: the same fusion the int8 layers get",
        },
        "layers": rows,
        "assignment": assignment,
    }


def _choose(model, reference, rows, wanted, budget, sizes, repeats, calibration, images, labels, ref_acc,
            input_shape) -> tuple[dict[str, Any], dict[str, float]]:
    """Plan, verify by measurement (backing off), then time the result against float32."""
    plan = plan_assignment(rows, budget, sizes[0])
    final = {m["layer"]: m for m in plan}.values()
    estimate = {"drop_points": sum(m["drop_points"] for m in final), "saved_ms": sum(m["saved_ms"] for m in final)}
    checks = []
    while True:
        current = _replay(plan)
        mixed = _build(model, current, calibration, input_shape) if current else reference
        acc = _accuracy(mixed, images, labels) if current else ref_acc
        drop = round(100 * (ref_acc - acc), 4)
        checks.append({"moves": len(plan), "switched": len(current), "accuracy": acc, "drop_points": drop})
        if drop <= budget or not plan:
            break
        plan.pop()  # undo the least efficient move and measure again
    timing = _timing_batch(images, max(sizes))
    ref_ms, mixed_ms = {}, {}
    for bs in sizes:
        x = timing[:bs]
        ms = alternating_median_ms({"float32": lambda: reference(x), "mixed": lambda: mixed(x)}, repeats, min_ms=1.0)
        ref_ms[str(bs)], mixed_ms[str(bs)] = ms["float32"], ms["mixed"]
    fallback = None
    key = str(sizes[0])
    if current and mixed_ms[key] >= ref_ms[key]:
        fallback = (f"the verified assignment measured {mixed_ms[key]:.3f} ms vs {ref_ms[key]:.3f} ms for float32 "
                    f"at batch {sizes[0]}; float32 kept")
        current, acc, drop, mixed_ms = {}, ref_acc, 0.0, dict(ref_ms)
    chosen = {row["name"]: current.get(row["name"], "float32") for row in rows}
    result = {
        "budget_points": float(budget),
        "layers": chosen,
        "counts": {p: sum(v == p for v in chosen.values()) for p in wanted},
        "accuracy": acc,
        "drop_points": drop,
        "latency_ms": mixed_ms,
        "speedup": {k: ref_ms[k] / mixed_ms[k] for k in ref_ms},
        "estimated": estimate,
        "checks": checks,
        "fallback": fallback,
    }
    return result, ref_ms


def _timing_batch(images: torch.Tensor, n: int) -> torch.Tensor:
    """``n`` samples for timing, the profiled ones repeated when there are fewer."""
    return images.repeat(math.ceil(n / images.shape[0]), 1, 1, 1)[:n]
