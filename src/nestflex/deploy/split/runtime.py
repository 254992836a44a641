"""Split inference on one device: the largest level cut at a split point, with the exits on each side.

SPINN and DynO run the first part of a network (the *head*) on the device and the rest (the
*tail*) on a server, sending every tensor that crosses the cut (METHODS §3-4). With a
progressive (multi-exit) bundle the exits before the split run on the device and the ones after
it on the server, so one inference is::

    device: stages up to the split, each early exit checked   -> answered here, or
            the crossing tensors                               -> codec frame -> server
    server: stages after the split, each early exit checked   -> logits, exit, confidence
    device: combine (SPINN's fallback: the most confident exit that ran, device or server)

:class:`SplitRuntime` runs on onnxruntime, numpy in and numpy out (no torch): the largest level's
op program is cut at the split and at every exit tap, each piece (a *segment*) is an ONNX graph
written from the program (:func:`~nestflex.deploy.backends.graphs.cut_graphs`, kept in the
bundle's tuned folder) in its own session, and the exit heads are the exit set's head graphs
(:func:`~nestflex.deploy.backends.graphs.exit_graphs`), the same ones
:class:`~nestflex.deploy.runtime.ProgressiveRuntime` runs. The device (its :meth:`~SplitRuntime.head`)
and the tail server (its :meth:`~SplitRuntime.tail`) run the same code, and the policy is the one
of :mod:`nestflex.deploy.exits` (the tail is :func:`~nestflex.deploy.exits.early_exit` over the
segments after the split); ``combine(head(x), tail(crossing))`` equals the unsplit
:class:`~nestflex.deploy.runtime.ProgressiveRuntime` (invariant 4, tested: the same exits and
answers, logits within float32 rounding of onnxruntime's kernels on differently cut graphs).
:meth:`~SplitRuntime.next_local_exit` is SPINN's "keep computing locally past the split up to the
next exit" while the request is in flight.

Arrays: :class:`HeadResult` and :class:`TailResult` hold numpy arrays (what crosses to the codec
and the wire); the answers (:meth:`~SplitRuntime.combine`, calling the runtime) come back in the
type of the input given to :meth:`~SplitRuntime.head` (numpy, or torch for a torch tensor:
:mod:`nestflex.deploy._arrays`).

Two split names are special: :data:`SERVER_ONLY` (``"input"``: the whole network on the server,
the input is what crosses) and, for the schedulers, ``None`` (device only: no server at all).

Example::

    import nestflex.deploy as nd
    rt = nd.SplitRuntime(nd.load("bundle.nfx"), "features.relu4")
    head = rt.head(x)                           # device
    tail = rt.tail(head.crossing)               # server (or nestflex.serve over gRPC)
    answer = rt.combine(head, tail)             # == ProgressiveRuntime(x)
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from nestflex.deploy._arrays import is_torch, like, to_numpy
from nestflex.deploy.backends.base import tuned_dir
from nestflex.deploy.backends.graphs import cut_graphs, exit_graphs
from nestflex.deploy.backends.onnxruntime import _session
from nestflex.deploy.bundle.loader import EXIT_SETS, Bundle
from nestflex.deploy.bundle.constants import EXIT_SET_KEYS
from nestflex.deploy.bundle.errors import BundleError
from nestflex.deploy.bundle.exit_records import ExitSet
from nestflex.deploy.exits import (
    ExitResult,
    _check_fallback,
    _cut,
    check_thresholds,
    early_exit,
    get_confidence,
)
from nestflex.deploy.runtime.capacity import check_input as _check_input

#: the arrays one stage hands the next (numpy)
State = tuple[np.ndarray, ...]

__all__ = ["SERVER_ONLY", "CPU", "HeadResult", "TailResult", "SplitRuntime", "split_names", "exit_count"]

#: the split name that sends the input itself: the whole network runs on the server
SERVER_ONLY = "input"

#: onnxruntime's CPU provider list: what a device runs, and the default of :class:`SplitRuntime`
CPU = ("CPUExecutionProvider",)


def split_names(bundle: Bundle) -> list[str]:
    """Every split a :class:`SplitRuntime` accepts: :data:`SERVER_ONLY` then the bundle's split points."""
    return [SERVER_ONLY, *(s.name for s in bundle.spec.splits)]


class _Stage:
    """One graph's session, opened on its first run (or :meth:`open`), once, from any thread.

    Why lazily: a device that sends every frame to the server (the server-only split, no local
    continuation) never runs the tail's sessions, and one that is opened holds the model's weights
    again; they open when a run needs them (a fallback, a device-only frame, the server's first
    request). The head's own sessions are opened with the runtime, so its first frame builds nothing.
    """

    def __init__(self, bundle: Bundle, path: Path, threads: int, providers: Sequence[str] | None,
                 head: bool = False) -> None:
        self._args, self._head = (bundle, path, threads, providers), head
        self.bytes = path.stat().st_size  # what its session holds: its graph file's size
        self.session: Any = None
        self._fn: Callable[..., Any] | None = None
        self._lock = threading.Lock()

    def open(self) -> _Stage:
        if self._fn is None:
            with self._lock:
                if self._fn is None:
                    self.session = _open(*self._args)
                    self._fn = _head_fn(self.session) if self._head else _stage_fn(self.session)
        return self

    @property
    def opened(self) -> bool:
        return self._fn is not None

    def __call__(self, *values: Any) -> Any:
        return (self._fn or self.open()._fn)(*values)


@dataclass(frozen=True)
class _Segment:
    """A run of program nodes between two cuts as one session, and the exit that ends it (if any)."""

    inputs: list[str]
    outputs: list[str]
    exit: int | None  # global exit index; the final exit is num_exits - 1
    run: _Stage  # run(*inputs) -> outputs (the logits alone for the last segment)

    @property
    def bytes(self) -> int:
        return self.run.bytes


def _open(bundle: Bundle, path: Path, threads: int, providers: Sequence[str] | None) -> Any:
    """An onnxruntime session for ``path``: on the CPU through the backends' session (all graph
    optimisations, the optimised graph cached in the bundle's tuned folder, as the backends keep
    theirs), else on ``providers`` in order (no cache: an optimised graph is specific to its provider)."""
    if providers is None or tuple(providers) == CPU:
        return _session(path, threads, tuned_dir(bundle) / f"{path.stem}.optimized.onnx")
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    return ort.InferenceSession(str(path), opts, providers=list(providers))


def _stage_fn(session: Any) -> Callable[..., State]:
    names = [i.name for i in session.get_inputs()]

    def run(*values: np.ndarray) -> State:
        return tuple(session.run(None, dict(zip(names, values))))

    return run


def _head_fn(session: Any) -> Callable[[State], np.ndarray]:
    name = session.get_inputs()[0].name

    def run(state: State) -> np.ndarray:  # a head reads the tapped value: its segment's first output
        return session.run(None, {name: state[0]})[0]

    return run


def _final_head(state: State) -> np.ndarray:
    return state[0]


def _segments(bundle: Bundle, cuts: Sequence[str], tap_exit: Mapping[str, int], num_exits: int, threads: int,
              providers: Sequence[str] | None) -> list[_Segment]:
    """The largest level cut after each of ``cuts`` (in execution order), each piece in a session;
    a piece ending at a tap carries that exit, the last one the final exit."""
    paths, io = cut_graphs(bundle, cuts)
    out = []
    for path, (ins, outs), cut in zip(paths, io, [*cuts, None]):
        exit_ = num_exits - 1 if cut is None else tap_exit.get(cut)
        out.append(_Segment(ins, outs, exit_, _Stage(bundle, path, threads, providers)))
    return out


def _crossing_shapes(bundle: Bundle, split: Any, first: _Segment) -> list[tuple[int, ...]]:
    """Per-sample shapes of what crosses the cut (``first``'s inputs): the bundle's input for the
    server-only split, the split record's tensors for a split point; read from ``first``'s session
    (opening it) only where the bundle does not name them all."""
    known = ({first.inputs[0]: tuple(bundle.input_spec["shape"])} if split is None and len(first.inputs) == 1
             else {} if split is None else {name: tuple(shape) for name, shape in split.tensors})
    if all(n in known for n in first.inputs):
        return [tuple(int(d) for d in known[n]) for n in first.inputs]
    shapes = {i.name: i.shape[1:] for i in first.run.open().session.get_inputs()}
    return [tuple(int(d) for d in shapes[n]) for n in first.inputs]


def _exit_spec(bundle: Bundle, exit_set: str | None) -> tuple[str, ExitSet] | None:
    """The exit set to split (its key and spec), ``None`` for the backbone alone (asked for, or a
    bundle without exits)."""
    if exit_set is None or not bundle.exit_sets:
        return None
    key = EXIT_SET_KEYS.get(exit_set, exit_set)
    ex = bundle.spec.exit_set(key) if key in EXIT_SETS else None
    if ex is None:
        raise BundleError(f"`exit_set` must be one of the bundle's exit sets ({', '.join(bundle.exit_sets)}, or "
                          f"their kinds) or None for the backbone alone, got {exit_set!r}")
    if ex.backbone != "shared":
        raise BundleError(f"exit set {exit_set!r} has its own backbone, so a split of the capacity program "
                          f"cannot carry it. HINT: pass exit_set=None to split the backbone alone")
    return key, ex


def exit_count(bundle: Bundle, exit_set: str | None) -> int:
    """:attr:`SplitRuntime.num_exits` of any split of ``bundle`` with ``exit_set``, without building one."""
    spec = _exit_spec(bundle, exit_set)
    return 1 if spec is None else len(spec[1].taps) + 1


@dataclass
class HeadResult:
    """What the device part of a batch produced (numpy arrays).

    Attributes:
        n: batch size.
        logits: ``(n, C)`` float32 answers of the samples that exited on the device (rows of the others are 0).
        exit_index: ``(n,)`` int64 exit each sample stopped at so far (``-1``: still running).
        confidence: ``(n,)`` float32 confidence of the answering exit (device exits only so far).
        rest: ``(m,)`` int64 indices of the samples still running (they need the tail).
        crossing: the arrays that cross the cut, for the ``rest`` samples only (``m`` rows each,
            of the split's :attr:`~SplitRuntime.crossing_shapes`).
        best_confidence: ``(m,)`` per ``rest`` sample, the confidence of its most confident
            device exit (for the ``most_confident`` fallback); ``None`` when no device exit ran.
        best_logits: ``(m, C)`` the logits of that exit; ``None`` when no device exit ran.
        best_exit: ``(m,)`` the index of that exit; ``None`` when no device exit ran.
    """

    n: int
    logits: np.ndarray
    exit_index: np.ndarray
    confidence: np.ndarray
    rest: np.ndarray
    crossing: State
    best_confidence: np.ndarray | None = None
    best_logits: np.ndarray | None = None
    best_exit: np.ndarray | None = None
    # the head's input when it was a torch tensor: the answer goes back in its type and device
    _like: Any = field(default=None, repr=False, compare=False)


@dataclass
class TailResult:
    """The tail's answer for the samples it received (what a server sends back; numpy arrays).

    Attributes:
        logits: ``(m, C)`` float32 logits of the exit that answered.
        exit_index: ``(m,)`` int64 global exit index where computation stopped.
        answer_index: ``(m,)`` int64 global exit index whose logits answered.
        confidence: ``(m,)`` float32 confidence of the answer.
        passed: ``(m,)`` bool: an exit passed its threshold (else the fallback chose among the tail's exits).
    """

    logits: np.ndarray
    exit_index: np.ndarray
    answer_index: np.ndarray
    confidence: np.ndarray
    passed: np.ndarray


class SplitRuntime:
    """The bundle's largest level cut at ``split``, with an exit set's heads on both sides, on onnxruntime.

    Args:
        bundle: a loaded bundle.
        split: a split point's name or node (``bundle.spec.splits``), or :data:`SERVER_ONLY`.
        exit_set: the exit set to run (``"exits"``/``"flex_exits"`` or their kinds), or ``None``
            for the backbone alone (one exit: the final one; also what a bundle without exits
            runs). Its heads must sit on the shared backbone (the split cuts that backbone).
        threads: intra-op threads of each session.
        providers: onnxruntime execution providers, in order of preference; ``None`` is the CPU
            (:data:`CPU`; a tail server chooses its own, see :mod:`nestflex.serve.server`).

    Attributes:
        split: the split's name.
        node: the program node it cuts after (``None`` for server only).
        num_exits: exits including the final one.
        device_exits: how many exits run on the device.
        next_exit: the first exit after the split when it is an early one (SPINN's local
            continuation), else ``None``.
        thresholds: the exit set's shipped thresholds, one per early exit.
        confidence: the exit set's shipped confidence measure.
        fallback: the exit set's shipped fallback (what answers a sample no early exit takes).
        crossing_names: the values that cross the cut.
        crossing_shapes: their per-sample shapes.
        own_bytes: what its sessions hold once all are open (the segments and the exit heads, both
            sides of the split), counted as the engine counts a level's or an exit set's sessions:
            each session's graph file size, weights included. The head's sessions open with the
            runtime, the others on their first run (:attr:`resident_bytes`, :meth:`device_bytes`).

    Raises:
        BundleError: unknown split or exit set, an exit set with its own backbone, or bad
            ``threads`` / ``providers``.
    """

    def __init__(self, bundle: Bundle, split: str, exit_set: str | None = "exits", *, threads: int = 1,
                 providers: Sequence[str] | None = None) -> None:
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise BundleError(f"`threads` must be an int >= 1 (intra-op threads of each session), got {threads!r}")
        if providers is not None and (isinstance(providers, str) or not providers
                                      or not all(isinstance(p, str) for p in providers)):
            raise BundleError(f"`providers` must be None (the CPU) or a non-empty sequence of onnxruntime provider "
                              f"names, got {providers!r}. HINT: providers=(\"CUDAExecutionProvider\", "
                              f"\"CPUExecutionProvider\")")
        self.bundle = bundle
        self.num_classes = int(bundle.spec.num_classes)
        if split == SERVER_ONLY:
            self.split, self.node = SERVER_ONLY, None
        else:
            sp = next((s for s in bundle.spec.splits if split in (s.name, s.node)), None)
            if sp is None:
                raise BundleError(f"`split` must be one of {', '.join(split_names(bundle))}, got {split!r}. "
                                  f"HINT: nestflex inspect BUNDLE lists the split points")
            self.split, self.node = sp.name, sp.node
        spec = _exit_spec(bundle, exit_set)
        self.exit_set = None if spec is None else spec[0]
        if spec is None:
            self.taps: tuple[str, ...] = ()
            self.thresholds, self.confidence, self.fallback = [], "max_prob", "most_confident"
            head_files: list[Path] = []
        else:
            key, ex = spec
            self.taps = tuple(ex.taps)
            self.thresholds, self.confidence, self.fallback = list(ex.thresholds), ex.confidence, ex.fallback
            head_files = exit_graphs(bundle, key)[1]
        self.num_exits = len(self.taps) + 1
        # one head per early exit (the exit set's head graphs, reading the tapped value), the final exit's logits last
        self._heads: list[Callable[[State], np.ndarray]] = [
            *(_Stage(bundle, p, threads, providers, head=True) for p in head_files), _final_head]
        index = {n.name: i for i, n in enumerate(bundle.spec.capacity.program.nodes)}
        cuts = sorted(set(self.taps) | ({self.node} if self.node else set()), key=index.__getitem__)
        segments = _segments(bundle, cuts, {t: k for k, t in enumerate(self.taps)}, self.num_exits, threads,
                             providers)
        at = 0 if self.node is None else cuts.index(self.node) + 1
        self._device, self._server = segments[:at], segments[at:]
        # every segment after the split ends at an exit (the cuts there are taps): the tail is early_exit over them
        assert all(s.exit is not None for s in self._server), "a segment after the split has no exit"
        self.device_exits = sum(s.exit is not None for s in self._device)
        self.next_exit = self._server[0].exit if self._server[0].exit != self.num_exits - 1 else None
        self.crossing_names = list(self._server[0].inputs)
        self.own_bytes = sum(p.stat().st_size for p in head_files) + sum(s.bytes for s in segments)
        self.crossing_shapes = _crossing_shapes(bundle, None if self.node is None else sp, self._server[0])
        for stage in self._device_stages(False):  # the head runs on every frame: open now, not on the first
            stage.open()

    def _device_stages(self, continue_locally: bool) -> list[_Stage]:
        """The sessions a device runs for the head (its segments and exit heads) and, with
        ``continue_locally``, for the local continuation to the next early exit."""
        out = [s.run for s in self._device] + [self._heads[s.exit] for s in self._device if s.exit is not None]
        if continue_locally and self.next_exit is not None:
            out += [self._server[0].run, self._heads[self.next_exit]]
        return [s for s in out if isinstance(s, _Stage)]

    def open(self, continue_locally: bool = True, tail: bool = False) -> SplitRuntime:
        """Open now the sessions a device runs at this split: the head's (open already), the local
        continuation's with ``continue_locally``, every one with ``tail`` (a device that runs the
        whole network here). What a config switch calls between frames, so that no frame pays for
        opening a session."""
        stages = self._device_stages(continue_locally)
        if tail:
            stages += [s.run for s in self._server] + [h for h in self._heads if isinstance(h, _Stage)]
        for stage in stages:
            stage.open()
        return self

    def device_bytes(self, continue_locally: bool = True) -> int:
        """What a device holds to send frames at this split: the head's sessions and, with
        ``continue_locally``, the local continuation's (graph file sizes, as :attr:`own_bytes`). The
        rest of :attr:`own_bytes` opens only when a frame runs the tail here (device only, or a
        fallback with no exit to answer from)."""
        return sum(s.bytes for s in self._device_stages(continue_locally))

    @property
    def resident_bytes(self) -> int:
        """What its opened sessions hold now (graph file sizes): at least ``device_bytes(False)``
        (:meth:`device_bytes`), at most :attr:`own_bytes`."""
        stages = [s.run for s in self._device + self._server] + list(self._heads)
        return sum(s.bytes for s in stages if isinstance(s, _Stage) and s.opened)

    # -- plumbing ------------------------------------------------------------------------------

    def _policy(self, thresholds: float | Sequence[float] | None, confidence: Any,
                fallback: str | None) -> tuple[list[float], Callable[[Any], Any], str]:
        """The thresholds (one per early exit, checked), the confidence measure and the fallback,
        the shipped ones where ``None``."""
        thr = check_thresholds(self.thresholds if thresholds is None else thresholds, self.num_exits - 1)
        fallback = self.fallback if fallback is None else fallback
        _check_fallback(fallback)
        return thr, get_confidence(self.confidence if confidence is None else confidence), fallback

    def _exit(self, k: int, state: State, conf_fn: Callable[[Any], Any]) -> tuple[np.ndarray, np.ndarray]:
        """Exit ``k``'s logits and confidence on its segment's outputs."""
        logits = self._heads[k](state)
        return logits, np.asarray(to_numpy(conf_fn(logits)))

    def _empty_crossing(self) -> State:
        return tuple(np.zeros((0, *s), dtype=np.float32) for s in self.crossing_shapes)

    # -- the two halves ------------------------------------------------------------------------

    def head(self, x: Any, thresholds: float | Sequence[float] | None = None, confidence: Any = None) -> HeadResult:
        """The device's part: the segments up to the split with their early exits; a sample whose
        confidence passes an exit's threshold leaves the batch there (the policy of
        :mod:`nestflex.deploy.exits`: strictly above the threshold rounded to the confidence's dtype).

        Args:
            x: normalised input batch ``(N, *input shape)``, numpy or torch.
            thresholds: override the exit set's thresholds (one per early exit of the set).
            confidence: override the exit set's confidence measure (a registered name).

        Returns:
            a :class:`HeadResult` (numpy): the samples answered here and the crossing arrays of the rest.

        Raises:
            BundleError: ``x`` is not a float batch of the bundle's input shape.
            ExitError: a bad threshold or confidence.
        """
        arr = _check_input(x, self.bundle.input_spec, "SplitRuntime.head")
        thr, conf_fn, _ = self._policy(thresholds, confidence, None)
        n = arr.shape[0]
        logits_out = np.zeros((n, self.num_classes), dtype=np.float32)
        exit_index = np.full(n, -1, dtype=np.int64)
        conf_out = np.zeros(n, dtype=np.float32)
        active = np.arange(n, dtype=np.int64)
        state: State = (arr,)
        best: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None  # confidence, logits, exit of each active sample
        for seg in self._device:
            if active.size == 0:
                break
            state = seg.run(*state)
            if seg.exit is None:
                continue
            logits, conf = self._exit(seg.exit, state, conf_fn)
            if best is None:
                best = (conf, logits, np.full(active.size, seg.exit, dtype=np.int64))
            else:  # strict: ties keep the earlier exit, as the unsplit policy does
                better = conf > best[0]
                best = (np.where(better, conf, best[0]), np.where(better[:, None], logits, best[1]),
                        np.where(better, seg.exit, best[2]))
            leave = conf > _cut(thr[seg.exit], conf)
            if leave.any():
                idx = active[leave]
                exit_index[idx] = seg.exit
                logits_out[idx] = logits[leave]
                conf_out[idx] = conf[leave]
                stay = ~leave
                active, state = active[stay], tuple(t[stay] for t in state)
                best = tuple(b[stay] for b in best)  # type: ignore[assignment]
        if active.size == 0:  # nothing crosses: empty arrays of the crossing's shapes
            state = self._empty_crossing()
        return HeadResult(n, logits_out, exit_index, conf_out, active, tuple(state),
                          *(best if best is not None else (None, None, None)), _like=x if is_torch(x) else None)

    def next_local_exit(self, head: HeadResult, confidence: Any = None) -> tuple[np.ndarray, np.ndarray, int] | None:
        """SPINN's local continuation: the tail's segments up to its first exit, on the device.

        Returns:
            ``(logits, confidence, exit index)`` (numpy) for the ``rest`` samples, or ``None`` when
            nothing remains (every sample exited on the device) or the next exit is the final one
            (continuing would run the whole tail here).
        """
        if head.rest.size == 0 or self.next_exit is None:
            return None
        _, conf_fn, _ = self._policy(None, confidence, None)
        state = tuple(head.crossing)
        for seg in self._server:  # the first one ends at next_exit
            state = seg.run(*state)
            if seg.exit is not None:
                logits, conf = self._exit(seg.exit, state, conf_fn)
                return logits, conf, seg.exit
        return None

    def tail(self, crossing: Sequence[Any], thresholds: float | Sequence[float] | None = None,
             confidence: Any = None, fallback: str | None = None) -> TailResult:
        """The server's part: the segments after the split with their exits, on the crossing arrays
        (:func:`nestflex.deploy.exits.early_exit` over them, with the thresholds of the tail's exits).

        Args:
            crossing: what :meth:`head` returned as ``crossing`` (numpy; torch tensors are read as numpy).
            thresholds: override the exit set's thresholds (one per early exit of the whole
                set, device ones included).
            confidence: override the exit set's confidence measure.
            fallback: override the exit set's fallback (``"final"`` or ``"most_confident"``).

        Returns:
            a :class:`TailResult` (numpy) with global exit indices.

        Raises:
            BundleError: the arrays do not match :attr:`crossing_shapes`.
        """
        crossing = tuple(crossing)
        arrays = [np.ascontiguousarray(to_numpy(t), dtype=np.float32) if hasattr(t, "shape") else None
                  for t in crossing]
        shapes = [tuple(a.shape[1:]) for a in arrays if a is not None]
        if len(shapes) != len(crossing) or shapes != self.crossing_shapes or \
                len({a.shape[0] for a in arrays}) != 1:
            got = [tuple(t.shape) if hasattr(t, "shape") else type(t).__name__ for t in crossing]
            raise BundleError(f"split {self.split!r}: the tail takes arrays of per-sample shapes "
                              f"{self.crossing_shapes} with one batch size, got {got}. "
                              f"HINT: send what SplitRuntime.head returned for the same split")
        thr, conf_fn, fallback = self._policy(thresholds, confidence, fallback)
        m, first, last = arrays[0].shape[0], self.device_exits, len(self._server) - 1
        if m == 0:
            return TailResult(np.zeros((0, self.num_classes), np.float32), np.zeros(0, np.int64),
                              np.zeros(0, np.int64), np.zeros(0, np.float32), np.zeros(0, bool))
        got = early_exit([s.run for s in self._server], [self._heads[s.exit] for s in self._server], tuple(arrays),
                         thr[first:], conf_fn, fallback)
        return TailResult(got.logits, got.exit_index + first, got.answer_index + first, got.confidence,
                          got.exit_index < last)

    def combine(self, head: HeadResult, tail: TailResult | None, fallback: str | None = None) -> ExitResult:
        """One answer per sample from the device's and the tail's parts, in the type of the head's input.

        With ``tail=None`` (server failed, refused or late), the samples still running are answered
        by their most confident device exit (SPINN's robustness rule); a split with no device exit
        then has no answer and raises.

        Raises:
            BundleError: ``tail=None`` and some sample has no device exit to fall back on.
        """
        fallback = self.fallback if fallback is None else fallback
        _check_fallback(fallback)
        rest = head.rest
        logits, conf = head.logits.copy(), head.confidence.copy()
        exit_index = head.exit_index.copy()
        answer_index = exit_index.copy()
        if rest.size and tail is None:
            if head.best_logits is None:
                raise BundleError(f"split {self.split!r} has no device exit to answer from without the server")
            logits[rest], conf[rest] = head.best_logits, head.best_confidence
            exit_index[rest] = answer_index[rest] = head.best_exit
        elif rest.size:
            t_logits, t_conf, t_answer = tail.logits.copy(), tail.confidence.copy(), tail.answer_index.copy()
            if fallback == "most_confident" and head.best_confidence is not None:
                # the tail chose among its own exits; an earlier device exit wins ties (as unsplit)
                device = ~tail.passed & (head.best_confidence >= t_conf)
                t_logits[device], t_conf[device] = head.best_logits[device], head.best_confidence[device]
                t_answer[device] = head.best_exit[device]
            logits[rest], conf[rest], answer_index[rest] = t_logits, t_conf, t_answer
            exit_index[rest] = tail.exit_index
        return ExitResult(*like(head._like, (logits, exit_index, answer_index, conf)))

    def __call__(self, x: Any, thresholds: float | Sequence[float] | None = None) -> ExitResult:
        """Head, tail and combine in this process: the unsplit answer, for checks (in ``x``'s array type)."""
        head = self.head(x, thresholds)
        tail = self.tail(head.crossing, thresholds) if head.rest.size else None
        return self.combine(head, tail)

    def __repr__(self) -> str:
        return (f"SplitRuntime(split={self.split!r}, exits={self.num_exits} ({self.device_exits} on the device), "
                f"crossing={self.crossing_shapes})")
