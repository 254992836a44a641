"""Per-layer latency tables measured on the target backend (NetAdapt's lookup tables, HALP's latency).

A pruning roadmap planned in MACs assumes time follows MACs; on a real backend it does not (a
fixed cost per operator, kernels that are faster at some widths than at the width below). A
:class:`LatencyTable` holds, for every distinct conv/linear layer of a model (keyed by its shape:
kind, kernel, stride, padding, dilation, depthwise, input size, full widths), the time of that
one layer in onnxruntime, the synthesized plan's backend, at the plan's threads and batch:

* a *fine* sweep over the output width (input at full width), every ``step`` channels where
  ``step`` keeps the sweep at about 32 points (every channel up to 32 channels). Its points are
  the widths the pruner may choose from, and the widths faster than every larger one are the
  *fast widths* (:meth:`LatencyTable.fast_widths`): the channel step comes from measurement;
* a *coarse* grid over (input width, output width), about 5 x 5, that scales the fine sweep to
  a narrower input (bilinear interpolation on the grid's ratio to the full input).

:meth:`LatencyTable.layer_ms` interpolates between the measured points. The torch side
(:class:`nestflex.pruning.LatencyCost`) sums it over a traced model's layers at any widths.

This module imports numpy, onnxruntime and the light runtime's ONNX writer only (no torch, no
``onnx``): the table is built on the device (``nestflex latency-table``, from a layer-spec file
the training machine wrote) and read back on the training machine. Its JSON is written atomically.

Examples:
    >>> spec = LayerSpec("conv", 8, 8, kernel=(3, 3), padding=(1, 1), in_hw=(8, 8))
    >>> table = measure_table([spec], threads=1, batch=1, repeats=3)
    >>> round(table.layer_ms(spec, 8, 8), 6) == round(table.entries[spec.key]["fine_ms"][-1], 6)
    True
"""

from __future__ import annotations

import bisect
import math
import platform
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from nestflex._io import read_json, write_json
from nestflex.errors import ProfileError

__all__ = ["LATENCY_SCHEMA", "LatencyTable", "LayerSpec", "measure_table", "read_layer_specs", "write_layer_specs"]

#: version of the table's JSON
LATENCY_SCHEMA = 1
_KINDS = ("conv", "linear")
#: points of the fine sweep and of each axis of the coarse grid
_FINE_POINTS, _COARSE_POINTS = 32, 5


@dataclass(frozen=True)
class LayerSpec:
    """One conv or linear layer as the latency table keys it, at its full (unpruned) widths.

    Attributes:
        kind: ``conv`` or ``linear``.
        in_channels: input channels (a linear's input features) at full width.
        out_channels: output channels (features) at full width.
        kernel: the conv's kernel size ``(kh, kw)``; ``(1, 1)`` for a linear.
        stride: the conv's stride.
        padding: the conv's padding.
        dilation: the conv's dilation.
        depthwise: one group per channel (MobileNet's 3x3 convs): input and output widths are
            the same group's, one axis.
        in_hw: the conv's input height and width per sample; for a linear, ``(rows, 1)`` with
            the rows it applies to per sample (1 for a classifier).
    """

    kind: str
    in_channels: int
    out_channels: int
    kernel: tuple[int, int] = (1, 1)
    stride: tuple[int, int] = (1, 1)
    padding: tuple[int, int] = (0, 0)
    dilation: tuple[int, int] = (1, 1)
    depthwise: bool = False
    in_hw: tuple[int, int] = (1, 1)

    def __post_init__(self) -> None:
        if self.kind not in _KINDS:
            raise ProfileError(f"LayerSpec `kind` must be one of {_KINDS}, got {self.kind!r}")
        for name in ("in_channels", "out_channels"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ProfileError(f"LayerSpec `{name}` must be an int >= 1, got {value!r}")
        if self.depthwise and self.in_channels != self.out_channels:
            raise ProfileError(f"a depthwise LayerSpec has as many input as output channels, got "
                               f"{self.in_channels} and {self.out_channels}")
        for name in ("kernel", "stride", "padding", "dilation", "in_hw"):
            object.__setattr__(self, name, tuple(int(v) for v in getattr(self, name)))

    @property
    def key(self) -> str:
        """The table's key: every field, so two layers of the same shape share one entry."""
        k, s, p, d, hw = (f"{a}x{b}" for a, b in (self.kernel, self.stride, self.padding, self.dilation, self.in_hw))
        return f"{self.kind}|k{k}|s{s}|p{p}|d{d}|dw{int(self.depthwise)}|in{hw}|{self.in_channels}>{self.out_channels}"

    def to_dict(self) -> dict[str, Any]:
        """The spec as plain JSON data (:meth:`from_dict` reads it back)."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "LayerSpec":
        """A spec from :meth:`to_dict`'s data.

        Args:
            d: the spec's fields.
        """
        return cls(**d)


def fine_widths(width: int, points: int = _FINE_POINTS) -> list[int]:
    """The fine sweep's widths: every ``step`` channels and the full width, ``step`` the power
    of two that keeps them at about ``points`` (every channel for ``width <= points``).

    Args:
        width: the full width.
        points: about how many widths.

    Examples:
        >>> fine_widths(6), fine_widths(128)[:4], len(fine_widths(128))
        ([1, 2, 3, 4, 5, 6], [4, 8, 12, 16], 32)
    """
    step = 1 << max(0, math.ceil(math.log2(width / points))) if width > points else 1
    return sorted(set(range(step, width + 1, step)) | {width})


def coarse_widths(width: int, points: int = _COARSE_POINTS) -> list[int]:
    """The coarse grid's widths on one axis: ``points`` even shares of ``width`` (at least 1).

    Args:
        width: the full width.
        points: how many shares.

    Examples:
        >>> coarse_widths(128), coarse_widths(3)
        ([26, 51, 77, 102, 128], [1, 2, 3])
    """
    return sorted({max(1, round(width * (i + 1) / points)) for i in range(points)})


def _interp(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
    """Piecewise-linear ``y(x)`` through the points; below the first point toward ``(0, 0)`` in
    proportion (a width below every measured one), above the last flat."""
    if x >= xs[-1]:
        return float(ys[-1])
    if x <= xs[0]:
        return float(ys[0]) * x / xs[0]
    i = bisect.bisect_right(xs, x)
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return float(y0 + (y1 - y0) * (x - x0) / (x1 - x0))


class LatencyTable:
    """Measured per-layer latencies of one backend configuration, interpolated at any widths.

    Args:
        entries: per :attr:`LayerSpec.key`: ``spec`` (:meth:`LayerSpec.to_dict`), ``fine``
            (output widths of the fine sweep) and ``fine_ms`` (their times at full input width),
            ``grid_in`` and ``grid_out`` (the coarse grid's widths; ``grid_in`` empty for a
            depthwise layer) and ``grid_ms`` (one row per ``grid_in`` width).
        threads: onnxruntime intra-op threads it was measured with.
        batch: batch size it was measured at (times are per batch, not per sample).
        backend: the backend measured (``onnxruntime``).
        meta: free-form record of where and how it was measured (machine, versions, seconds).

    Examples:
        >>> spec = LayerSpec("linear", 4, 4)
        >>> t = LatencyTable({spec.key: {"spec": spec.to_dict(), "fine": [2, 4], "fine_ms": [0.1, 0.2],
        ...                   "grid_in": [2, 4], "grid_out": [2, 4], "grid_ms": [[0.05, 0.1], [0.1, 0.2]]}})
        >>> round(t.layer_ms(spec, 4, 3), 3), round(t.layer_ms(spec, 2, 4), 3), t.fast_widths(spec)
        (0.15, 0.1, [2, 4])
    """

    def __init__(self, entries: dict[str, dict[str, Any]], threads: int = 1, batch: int = 1,
                 backend: str = "onnxruntime", meta: dict[str, Any] | None = None) -> None:
        self.entries, self.threads, self.batch, self.backend = dict(entries), int(threads), int(batch), backend
        self.meta = dict(meta or {})

    def entry(self, spec: LayerSpec) -> dict[str, Any]:
        """The measured entry of ``spec``.

        Args:
            spec: the layer at full widths.

        Raises:
            ProfileError: the table has no layer of that shape.
        """
        found = self.entries.get(spec.key)
        if found is None:
            raise ProfileError(f"the latency table has no layer {spec.key!r} ({len(self.entries)} layers measured). "
                               f"HINT: build the table for this model and input shape (`nestflex latency-table`)")
        return found

    def lookup(self, spec: LayerSpec) -> dict[str, Any]:
        """The entry that prices a layer of ``spec``'s shape at ``spec``'s (possibly pruned) widths:
        its own when measured, else the smallest measured layer of the same kind, kernel, stride,
        padding, dilation and input size whose full widths cover it.

        Args:
            spec: the layer at its current widths.

        Raises:
            ProfileError: no measured layer of that shape covers those widths.
        """
        if spec.key in self.entries:
            return self.entries[spec.key]
        signature = spec.key.rsplit("|", 1)[0]
        covering = [e for k, e in self.entries.items() if k.rsplit("|", 1)[0] == signature
                    and e["spec"]["out_channels"] >= spec.out_channels and e["spec"]["in_channels"] >= spec.in_channels]
        if not covering:
            raise ProfileError(f"the latency table has no layer of shape {signature!r} with at least "
                               f"{spec.in_channels} input and {spec.out_channels} output channels. HINT: build the "
                               f"table for this model and input shape (`nestflex latency-table`)")
        return min(covering, key=lambda e: (e["spec"]["in_channels"] * e["spec"]["out_channels"], e["spec"]["in_channels"]))

    def layer_time(self, spec: LayerSpec) -> float:
        """Milliseconds of a layer of ``spec``'s shape at ``spec``'s (possibly pruned) widths
        (:meth:`lookup`, then :meth:`layer_ms`).

        Args:
            spec: the layer at its current widths.
        """
        full = LayerSpec.from_dict(self.lookup(spec)["spec"])
        return self.layer_ms(full, spec.in_channels, spec.out_channels)

    def layer_ms(self, spec: LayerSpec, in_width: int, out_width: int) -> float:
        """Milliseconds of the layer ``spec`` pruned to ``in_width`` x ``out_width`` channels.

        The fine sweep at ``out_width`` (linear between its points), scaled by the coarse grid's
        ratio of ``in_width`` to the full input at that output width (bilinear): at full input
        width this is the fine sweep itself.

        Args:
            spec: the layer at full widths.
            in_width: its input channels now (ignored for a depthwise layer: one axis).
            out_width: its output channels now.
        """
        e = self.entry(spec)
        ms = _interp(e["fine"], e["fine_ms"], out_width)
        if spec.depthwise or not e["grid_in"] or in_width >= spec.in_channels:
            return ms
        rows = [_interp(e["grid_out"], row, out_width) for row in e["grid_ms"]]
        full = rows[-1]
        return ms * (_interp(e["grid_in"], rows, in_width) / full if full > 0 else 1.0)

    def fast_widths(self, spec: LayerSpec, margin: float = 0.03) -> list[int]:
        """The output widths of the fine sweep that are faster than every larger measured width
        by more than ``margin`` (NetAdapt's useful steps): pruning to any other measured width
        costs channels and saves no time over the next larger fast width. Ascending; the full
        width is always one. On this CPU a 3x3 conv runs in blocks of 16 output channels (the
        same time from 2 to 16, from 18 to 32, ...): the fast widths are the blocks' ends.

        Args:
            spec: the layer at full widths.
            margin: the relative saving a width must show over the next larger fast width;
                below it, the difference is the timer's noise (medians of a few samples
                differ by about 1%).
        """
        e = self.entry(spec)
        fast, best = [], math.inf
        for w, ms in sorted(zip(e["fine"], e["fine_ms"]), reverse=True):
            if ms < best * (1 - margin) or not fast:
                fast.append(w)
                best = ms
        return sorted(fast)

    def to_dict(self) -> dict[str, Any]:
        """The table as plain JSON data (:meth:`from_dict` reads it back)."""
        return {"schema_version": LATENCY_SCHEMA, "backend": self.backend, "threads": self.threads,
                "batch": self.batch, "meta": self.meta, "entries": self.entries}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "LatencyTable":
        """A table from :meth:`to_dict`'s data.

        Args:
            d: the table's JSON data.

        Raises:
            ProfileError: another schema version, or not a latency table.
        """
        if not isinstance(d, dict) or "entries" not in d:
            raise ProfileError("not a latency table (no `entries`). HINT: build one with `nestflex latency-table`")
        if d.get("schema_version") != LATENCY_SCHEMA:
            raise ProfileError(f"latency table schema {d.get('schema_version')!r}, this nestflex reads "
                               f"{LATENCY_SCHEMA}. HINT: rebuild the table with this version")
        return cls(d["entries"], d.get("threads", 1), d.get("batch", 1), d.get("backend", "onnxruntime"),
                   d.get("meta"))

    def save(self, path: str | Path) -> Path:
        """Write the table's JSON atomically (a crash never leaves half a table).

        Args:
            path: the file to write.
        """
        return write_json(path, self.to_dict())

    @classmethod
    def load(cls, path: str | Path) -> "LatencyTable":
        """Read a table :meth:`save` wrote.

        Args:
            path: the table's JSON file.

        Raises:
            ProfileError: a missing file, or not a table of this schema.
        """
        if not Path(path).is_file():
            raise ProfileError(f"latency table {path} does not exist. HINT: build it with `nestflex latency-table "
                               f"SPECS --out {path}` on the target device")
        return cls.from_dict(read_json(path))


def write_layer_specs(specs: Iterable[LayerSpec], path: str | Path, **meta: Any) -> Path:
    """Write the layer specs a table is built from (the training side's half of the handoff).

    Args:
        specs: the model's layers (:func:`nestflex.pruning.latency_specs` gives them).
        path: the JSON file to write, atomically.
        **meta: more fields for the record (the model's name, its input shape).
    """
    return write_json(path, {"kind": "nestflex-layer-specs", **meta, "layers": [s.to_dict() for s in specs]})


def read_layer_specs(path: str | Path) -> list[LayerSpec]:
    """The layer specs :func:`write_layer_specs` wrote.

    Args:
        path: the specs' JSON file.

    Raises:
        ProfileError: a missing file or one that holds no layer specs.
    """
    if not Path(path).is_file():
        raise ProfileError(f"layer specs {path} do not exist. HINT: write them on the training machine with "
                           f"`nestflex.pruning.write_model_specs(model, input_shape, path)`")
    data = read_json(path)
    if not isinstance(data, dict) or data.get("kind") != "nestflex-layer-specs":
        raise ProfileError(f"{path} is not a layer-spec file (no kind 'nestflex-layer-specs')")
    return [LayerSpec.from_dict(d) for d in data["layers"]]


def _model(spec: LayerSpec, in_width: int, out_width: int) -> tuple[bytes, tuple[int, ...]]:
    """One layer (and the ReLU a fused plan folds into a conv) as an ONNX model, random weights."""
    from nestflex.deploy.onnxgraph import program_to_onnx

    rng = np.random.default_rng(0)
    if spec.kind == "conv":
        cin = 1 if spec.depthwise else in_width
        weight = rng.standard_normal((out_width, cin, *spec.kernel), dtype=np.float32) * 0.1
        attrs = {"stride": list(spec.stride), "padding": list(spec.padding), "dilation": list(spec.dilation),
                 "depthwise": spec.depthwise}
        shape = (None, out_width if spec.depthwise else in_width, *spec.in_hw)
        nodes = [SimpleNamespace(name="y", op="conv2d", args=("x",), attrs=attrs, params={"weight": "w", "bias": "b"}),
                 SimpleNamespace(name="r", op="relu", args=("y",), attrs={}, params=None)]
    else:
        weight = rng.standard_normal((out_width, in_width), dtype=np.float32) * 0.1
        shape = (None, in_width) if spec.in_hw[0] == 1 else (None, spec.in_hw[0], in_width)
        nodes = [SimpleNamespace(name="r", op="linear", args=("x",), attrs={}, params={"weight": "w", "bias": "b"})]
    tensors = {"w": weight, "b": np.zeros(out_width, np.float32)}
    return program_to_onnx(nodes, tensors, {"x": shape}, ["r"], name="nestflex_latency"), shape


def _timer(threads: int, batch: int, repeats: int) -> Callable[[LayerSpec, int, int], float]:
    import onnxruntime as ort

    from nestflex.deploy.timing import median_ms

    def measure(spec: LayerSpec, in_width: int, out_width: int) -> float:
        model, shape = _model(spec, in_width, out_width)
        opts = ort.SessionOptions()
        # as the synthesized plan's sessions (deploy.backends.onnxruntime): all graph optimisations,
        # one inter-op thread, no CPU arena
        opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        opts.enable_cpu_mem_arena, opts.log_severity_level = False, 3
        session = ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])
        x = np.random.default_rng(1).standard_normal((batch, *shape[1:]), dtype=np.float32)
        # looped to >= 0.2 ms a sample: a 3 us layer timed alone is mostly timer and call jitter
        return median_ms(lambda: session.run(None, {"x": x}), repeats, warmup=2, min_ms=0.2)

    return measure


def measure_table(specs: Iterable[LayerSpec], threads: int = 1, batch: int = 1, repeats: int = 7,
                  log: Callable[[str], None] | None = None) -> LatencyTable:
    """Measure every distinct layer of ``specs`` in onnxruntime: the fine sweep and the coarse grid.

    Each point is one layer in its own session, timed as the median of ``repeats`` samples after
    two warm-up calls. Layers of the same shape are measured once.

    Args:
        specs: the layers at full widths (repeats are fine: one entry per :attr:`LayerSpec.key`).
        threads: onnxruntime intra-op threads (the synthesized plan's).
        batch: the batch size (the plan's); times are per batch.
        repeats: timed samples per point.
        log: called with one line per layer measured (``None``: quiet).

    Returns:
        The :class:`LatencyTable`, with the machine and the seconds it took in ``meta``.

    Raises:
        ProfileError: ``threads``, ``batch`` or ``repeats`` below 1.
    """
    for name, value in (("threads", threads), ("batch", batch), ("repeats", repeats)):
        if not isinstance(value, int) or value < 1:
            raise ProfileError(f"`{name}` must be an int >= 1, got {value!r}")
    import onnxruntime as ort

    from nestflex._machine import machine

    start = time.perf_counter()
    measure = _timer(threads, batch, repeats)
    entries: dict[str, dict[str, Any]] = {}
    for spec in specs:
        if spec.key in entries:
            continue
        fine = fine_widths(spec.out_channels)
        entry: dict[str, Any] = {"spec": spec.to_dict(), "fine": fine,
                                 "fine_ms": [round(measure(spec, spec.in_channels, w), 5) for w in fine]}
        grid_in = [] if spec.depthwise or spec.in_channels == 1 else coarse_widths(spec.in_channels)
        grid_out = coarse_widths(spec.out_channels) if grid_in else []
        entry.update(grid_in=grid_in, grid_out=grid_out,
                     grid_ms=[[round(measure(spec, i, o), 5) for o in grid_out] for i in grid_in])
        entries[spec.key] = entry
        if log is not None:
            log(f"latency table: {spec.key}: {len(fine) + len(grid_in) * len(grid_out)} points, "
                f"{entry['fine_ms'][-1]:.4f} ms at full width")
    meta = {"machine": machine(), "onnxruntime": ort.__version__, "python": platform.python_version(),
            "repeats": repeats, "seconds": round(time.perf_counter() - start, 2)}
    return LatencyTable(entries, threads, batch, meta=meta)
