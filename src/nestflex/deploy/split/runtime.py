"""Split inference on one device: the largest level cut at a split point, with the exits on each side.

SPINN and DynO run the first part of a network (the *head*) on the device and the rest (the
*tail*) on a server, sending every tensor that crosses the cut (METHODS §3-4). With a
progressive (multi-exit) bundle the exits before the split run on the device and the ones after
it on the server, so one inference is::

    device: stages up to the split, each early exit checked   -> answered here, or
            the crossing tensors                               -> codec frame -> server
    server: stages after the split, each early exit checked   -> logits, exit, confidence
    device: combine (SPINN's fallback: the most confident exit that ran, device or server)

:class:`SplitRuntime` holds both halves over the same paged weights, so the device (its
:meth:`~SplitRuntime.head`) and the tail server (its :meth:`~SplitRuntime.tail`) run the same
code; ``combine(head(x), tail(crossing))`` equals the unsplit
:class:`~nestflex.deploy.runtime.ProgressiveRuntime` exactly in float32 (invariant 4, tested).
:meth:`~SplitRuntime.next_local_exit` is SPINN's "keep computing locally past the split up to
the next exit" while the request is in flight.

Two split names are special: :data:`SERVER_ONLY` (``"input"``: the whole network on the server,
the input is what crosses) and, for the schedulers, ``None`` (device only: no server at all).

Example::

    import nestflex.deploy as nd
    rt = nd.SplitRuntime(nd.load("bundle.nfx"), "features.relu4")
    head = rt.head(x)                           # device
    tail = rt.tail(head.crossing)               # server (or nestflex.serve over gRPC)
    answer = rt.combine(head, tail)             # == ProgressiveRuntime(x) in float32
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch

from nestflex.deploy.backends.torch_program import run_program
from nestflex.deploy.bundle.loader import Bundle
from nestflex.deploy.bundle.program import cut_program
from nestflex.deploy.bundle.schema import BundleError
from nestflex.deploy.exits import ExitResult, _check_fallback, check_thresholds, get_confidence
from nestflex.deploy.runtime.capacity import CapacityRuntime, check_input as _check_input
from nestflex.deploy.runtime.progressive import ProgressiveRuntime

State = tuple[torch.Tensor, ...]

__all__ = ["SERVER_ONLY", "HeadResult", "TailResult", "SplitRuntime", "split_names"]

#: the split name that sends the input itself: the whole network runs on the server
SERVER_ONLY = "input"


def split_names(bundle: Bundle) -> list[str]:
    """Every split a :class:`SplitRuntime` accepts: :data:`SERVER_ONLY` then the bundle's split points."""
    return [SERVER_ONLY, *(s.name for s in bundle.spec.splits)]


@dataclass(frozen=True)
class _Segment:
    """A run of program nodes between two cuts, and the exit that ends it (if any)."""

    inputs: list[str]
    nodes: list[Any]
    outputs: list[str]
    exit: int | None  # global exit index; the final exit is num_exits - 1


@dataclass
class HeadResult:
    """What the device part of a batch produced.

    Attributes:
        n: batch size.
        logits: ``(n, C)`` answers of the samples that exited on the device (rows of the others are 0).
        exit_index: ``(n,)`` exit each sample stopped at so far (``-1``: still running).
        confidence: ``(n,)`` confidence of the answering exit (device exits only so far).
        rest: indices of the samples still running (they need the tail).
        crossing: the tensors that cross the cut, for the ``rest`` samples only.
        best_confidence, best_logits, best_exit: per ``rest`` sample, its most confident device
            exit (for the ``most_confident`` fallback); ``None`` when no device exit ran.
    """

    n: int
    logits: torch.Tensor | None
    exit_index: torch.Tensor
    confidence: torch.Tensor
    rest: torch.Tensor
    crossing: State
    best_confidence: torch.Tensor | None = None
    best_logits: torch.Tensor | None = None
    best_exit: torch.Tensor | None = None


@dataclass
class TailResult:
    """The tail's answer for the samples it received (what a server sends back).

    Attributes:
        logits: ``(m, C)`` logits of the exit that answered.
        exit_index: ``(m,)`` global exit index where computation stopped.
        answer_index: ``(m,)`` global exit index whose logits answered.
        confidence: ``(m,)`` confidence of the answer.
        passed: ``(m,)`` bool: an exit passed its threshold (else the fallback chose among the tail's exits).
    """

    logits: torch.Tensor
    exit_index: torch.Tensor
    answer_index: torch.Tensor
    confidence: torch.Tensor
    passed: torch.Tensor


class SplitRuntime:
    """The bundle's largest level cut at ``split``, with an exit set's heads on both sides.

    Args:
        bundle: a loaded bundle.
        split: a split point's name or node (``bundle.spec.splits``), or :data:`SERVER_ONLY`.
        exit_set: the exit set to run (``"exits"``/``"flex_exits"`` or their kinds), or ``None``
            for the backbone alone (one exit: the final one). Its heads must sit on the shared
            backbone (the split cuts that backbone).
        capacity: a :class:`CapacityRuntime` to share (switched to the largest level); new if ``None``.

    Attributes:
        split: the split's name; ``node``: the program node it cuts after (``None`` for server only).
        num_exits: exits including the final one; ``device_exits``: how many run on the device.
        thresholds, confidence, fallback: the exit set's shipped policy.
        crossing_shapes: per-sample shapes of the tensors that cross the cut.

    Raises:
        BundleError: unknown split or exit set, or an exit set with its own backbone.
    """

    def __init__(self, bundle: Bundle, split: str, exit_set: str | None = "exits",
                 capacity: CapacityRuntime | None = None) -> None:
        top = bundle.num_levels - 1
        self.bundle = bundle
        self.capacity = capacity if capacity is not None else CapacityRuntime(bundle, top, plan=None)
        if self.capacity.level != top:
            self.capacity.set_level(top)
        nodes = self.capacity.nodes
        if split == SERVER_ONLY:
            self.split, self.node = SERVER_ONLY, None
        else:
            sp = next((s for s in bundle.spec.splits if split in (s.name, s.node)), None)
            if sp is None:
                raise BundleError(f"`split` must be one of {', '.join(split_names(bundle))}, got {split!r}. "
                                  f"HINT: nestflex inspect BUNDLE lists the split points")
            self.split, self.node = sp.name, sp.node
        self._prog: ProgressiveRuntime | None = None
        taps: tuple[str, ...] = ()
        if exit_set is not None and bundle.exit_sets:
            self._prog = ProgressiveRuntime(bundle, self.capacity, exit_set, plan=None)
            if self._prog.spec.backbone != "shared":
                raise BundleError(f"exit set {exit_set!r} has its own backbone, so a split of the capacity program "
                                  f"cannot carry it. HINT: pass exit_set=None to split the backbone alone")
            taps = self._prog.spec.taps
            self.thresholds = list(self._prog.thresholds)
            self.confidence, self.fallback = self._prog.confidence, self._prog.fallback
            self._heads = self._prog._eager_heads  # the split cuts the eager program
        else:
            self.thresholds, self.confidence, self.fallback = [], "max_prob", "most_confident"
            self._heads = [lambda state: state[0]]
        self.num_exits = len(taps) + 1
        index = {n.name: i for i, n in enumerate(nodes)}
        cuts = sorted(set(taps) | ({self.node} if self.node else set()), key=index.__getitem__)
        tap_exit = {t: k for k, t in enumerate(taps)}
        segments = []
        for (ins, body, outs), cut in zip(cut_program(nodes, cuts), [*cuts, None]):
            k = self.num_exits - 1 if cut is None else tap_exit.get(cut)
            segments.append(_Segment(ins, body, outs, k))
        at = 0 if self.node is None else cuts.index(self.node) + 1
        self._device, self._server = segments[:at], segments[at:]
        self.device_exits = sum(s.exit is not None for s in self._device)
        #: the first exit after the split when it is an early one (SPINN's local continuation), else None
        self.next_exit = next((s.exit for s in self._server if s.exit is not None), None)
        if self.next_exit == self.num_exits - 1:
            self.next_exit = None
        self.crossing_names = list(self._server[0].inputs)
        x = torch.empty(0, *bundle.spec.input.shape)  # shapes of what crosses, from an empty batch
        self.crossing_shapes = [tuple(t.shape[1:]) for t in self._run(self._device, (x,))] if self._device else \
            [tuple(bundle.spec.input.shape)]

    # -- plumbing ------------------------------------------------------------------------------

    def _stage(self, seg: _Segment, state: State) -> State:
        env = dict(zip(seg.inputs, state))
        result = run_program(seg.nodes, env, self.capacity._store.tensors, self.capacity.level)
        return tuple(env[o] for o in seg.outputs) if seg.outputs else (result,)

    def _run(self, segments: Sequence[_Segment], state: State) -> State:
        for seg in segments:
            state = self._stage(seg, state)
        return state

    def _policy(self, thresholds: float | Sequence[float] | None, confidence: Any, fallback: str | None):
        thr = check_thresholds(self.thresholds if thresholds is None else thresholds, self.num_exits - 1)
        fallback = self.fallback if fallback is None else fallback
        _check_fallback(fallback)
        return thr, get_confidence(self.confidence if confidence is None else confidence), fallback

    def _progress(self, segments, state, thr, conf_fn, n, best=None, stop_at_first_exit=False):
        """Run ``segments`` with early exit on a batch; returns the exited samples' answers and the rest."""
        dev = state[0].device
        active = torch.arange(n, device=dev)
        exit_index = torch.full((n,), -1, dtype=torch.long, device=dev)
        answer_index = torch.full((n,), -1, dtype=torch.long, device=dev)
        conf_out = torch.zeros(n, device=dev)
        logits_out: torch.Tensor | None = None
        best_conf, best_logits, best_k = best if best is not None else (None, None, None)
        last = None
        for seg in segments:
            state = self._stage(seg, state)
            if seg.exit is None:
                continue
            logits = self._heads[seg.exit](state)
            conf = conf_fn(logits)
            if logits_out is None:
                logits_out = logits.new_zeros((n, logits.shape[-1]))
            if best_conf is None:
                best_conf, best_logits = conf, logits
                best_k = torch.full_like(active, seg.exit)
            else:  # strict: ties keep the earlier exit, as the unsplit policy does
                better = conf > best_conf
                best_conf = torch.where(better, conf, best_conf)
                best_logits = torch.where(better[:, None], logits, best_logits)
                best_k = torch.where(better, torch.full_like(best_k, seg.exit), best_k)
            last = (logits, conf, seg.exit)
            if seg.exit == self.num_exits - 1 or stop_at_first_exit:
                break
            leave = conf > thr[seg.exit]
            if leave.any():
                idx = active[leave]
                exit_index[idx] = answer_index[idx] = seg.exit
                logits_out[idx] = logits[leave]
                conf_out[idx] = conf[leave]
                stay = ~leave
                active, state = active[stay], tuple(t[stay] for t in state)
                best_conf, best_logits, best_k = best_conf[stay], best_logits[stay], best_k[stay]
                if active.numel() == 0:
                    break
        return logits_out, exit_index, answer_index, conf_out, active, state, (best_conf, best_logits, best_k), last

    # -- the two halves ------------------------------------------------------------------------

    @torch.no_grad()
    def head(self, x: torch.Tensor, thresholds: float | Sequence[float] | None = None,
             confidence: Any = None) -> HeadResult:
        """The device's part: stages up to the split with their early exits.

        Returns:
            a :class:`HeadResult`: the samples answered here and the crossing tensors of the rest.
        """
        _check_input(x, self.bundle.input_spec, "SplitRuntime.head")
        thr, conf_fn, _ = self._policy(thresholds, confidence, None)
        n = x.shape[0]
        logits, exit_index, _, conf, rest, state, best, _ = self._progress(self._device, (x,), thr, conf_fn, n)
        return HeadResult(n, logits, exit_index, conf, rest, state, *best)

    @torch.no_grad()
    def next_local_exit(self, head: HeadResult, confidence: Any = None) -> tuple[torch.Tensor, torch.Tensor, int] | None:
        """SPINN's local continuation: the tail's stages up to its first exit, on the device.

        Returns:
            ``(logits, confidence, exit index)`` for the ``rest`` samples, or ``None`` when
            nothing remains (every sample exited on the device) or the next exit is the final one
            (continuing would run the whole tail here).
        """
        if head.rest.numel() == 0 or self.next_exit is None:
            return None
        _, conf_fn, _ = self._policy(None, confidence, None)
        out = self._progress(self._server, head.crossing, [1.0] * (self.num_exits - 1), conf_fn,
                             int(head.rest.numel()), stop_at_first_exit=True)
        logits, conf, k = out[7]
        return logits, conf, k

    @torch.no_grad()
    def tail(self, crossing: Sequence[torch.Tensor], thresholds: float | Sequence[float] | None = None,
             confidence: Any = None, fallback: str | None = None) -> TailResult:
        """The server's part: the stages after the split with their exits, on the crossing tensors.

        Raises:
            BundleError: the tensors do not match :attr:`crossing_shapes`.
        """
        crossing = tuple(crossing)
        shapes = [tuple(t.shape[1:]) for t in crossing if isinstance(t, torch.Tensor)]
        if len(shapes) != len(crossing) or shapes != self.crossing_shapes or \
                len({t.shape[0] for t in crossing}) != 1:
            raise BundleError(f"split {self.split!r}: the tail takes tensors of per-sample shapes "
                              f"{self.crossing_shapes} with one batch size, got "
                              f"{[tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__ for t in crossing]}"
                              f". HINT: send what SplitRuntime.head returned for the same split")
        thr, conf_fn, fallback = self._policy(thresholds, confidence, fallback)
        m = crossing[0].shape[0]
        logits, exit_index, answer_index, conf, active, _, best, last = self._progress(
            self._server, crossing, thr, conf_fn, m)
        passed = exit_index >= 0
        if active.numel():
            final_logits, final_conf, final_k = last
            exit_index[active] = final_k
            if fallback == "most_confident":
                logits[active], conf[active], answer_index[active] = best[1], best[0], best[2]
            else:
                logits[active], conf[active], answer_index[active] = final_logits, final_conf, final_k
        return TailResult(logits, exit_index, answer_index, conf, passed)

    def combine(self, head: HeadResult, tail: TailResult | None, fallback: str | None = None) -> ExitResult:
        """One answer per sample from the device's and the tail's parts.

        With ``tail=None`` (server failed, refused or late), the samples still running are answered
        by their most confident device exit (SPINN's robustness rule); a split with no device exit
        then has no answer and raises.

        Raises:
            BundleError: ``tail=None`` and some sample has no device exit to fall back on.
        """
        fallback = self.fallback if fallback is None else fallback
        n, rest = head.n, head.rest
        exit_index, conf = head.exit_index.clone(), head.confidence.clone()
        answer_index = exit_index.clone()
        if rest.numel() == 0:
            return ExitResult(head.logits, exit_index, answer_index, conf)
        if tail is None:
            if head.best_logits is None:
                raise BundleError(f"split {self.split!r} has no device exit to answer from without the server")
            logits = head.logits.clone()
            logits[rest], conf[rest] = head.best_logits, head.best_confidence
            exit_index[rest] = answer_index[rest] = head.best_exit
            return ExitResult(logits, exit_index, answer_index, conf)
        logits = tail.logits.new_zeros((n, tail.logits.shape[-1])) if head.logits is None else head.logits.clone()
        t_logits, t_conf, t_answer = tail.logits.clone(), tail.confidence.clone(), tail.answer_index.clone()
        if fallback == "most_confident" and head.best_confidence is not None:
            # the tail chose among its own exits; an earlier device exit wins ties (as unsplit)
            device = ~tail.passed & (head.best_confidence >= t_conf)
            t_logits[device], t_conf[device], t_answer[device] = head.best_logits[device], \
                head.best_confidence[device], head.best_exit[device]
        logits[rest], conf[rest], answer_index[rest] = t_logits, t_conf, t_answer
        exit_index[rest] = tail.exit_index
        return ExitResult(logits, exit_index, answer_index, conf)

    def __call__(self, x: torch.Tensor, thresholds: float | Sequence[float] | None = None) -> ExitResult:
        """Head, tail and combine in this process: the unsplit answer, for checks."""
        head = self.head(x, thresholds)
        tail = self.tail(head.crossing, thresholds) if head.rest.numel() else None
        return self.combine(head, tail)

    def __repr__(self) -> str:
        return (f"SplitRuntime(split={self.split!r}, exits={self.num_exits} ({self.device_exits} on the device), "
                f"crossing={self.crossing_shapes})")
