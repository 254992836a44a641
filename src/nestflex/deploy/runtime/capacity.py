"""The multi-capacity runtime: one backbone, several nested levels, switched between frames (NestDNN).

Each level runs on a backend chosen by the execution plan (:mod:`nestflex.deploy.backends`):
by default ``onnxruntime`` on the level's ONNX graph (the bundle's, or one written from its op
program), numpy in and numpy out; the torch ``eager`` reference when a plan asks for it. Torch
tensors in give torch tensors out (:mod:`nestflex.deploy._arrays`).

Memory against switch time, the two NestDNN claims (``keep``): an onnxruntime session holds its
own copy of its level's weights, and nested levels cannot share one buffer (level ``k`` reads a
prefix along the input channels too, which is not contiguous). So either

* ``keep="all"`` (default): every level's session is built when the runtime is made and kept; a
  switch is a pointer swap, no session is built on the frame path; memory is the sum of the
  levels' weights rather than the largest level's; or
* ``keep="active"``: only the running level's session is held (one model's memory, NestDNN's
  claim); a switch drops it and builds the new one from the optimised graph cached beside the
  bundle (a few milliseconds, measured in benchmarks/deploy/deploy_footprint.py).

The paged ``eager`` backend keeps one copy of the nested weights and pages the delta on a switch
(the accounting of :func:`nestflex.capacity.profile.paging_bytes`). :attr:`CapacityRuntime.resident_bytes`
counts what the sessions hold (their graphs' sizes) plus any paged tensors.

Example::

    import nestflex.deploy as nd
    rt = nd.CapacityRuntime(nd.load("bundle.nfx"), level=0)
    report = rt.set_level(2); report.seconds
    logits = rt(x)          # x: numpy (N, *input shape), normalised
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import numpy as np

from nestflex.deploy._arrays import as_numpy, like, to_numpy
from nestflex.deploy.backends.base import LevelContext, Prepared
from nestflex.deploy.backends.graphs import split_graphs
from nestflex.deploy.backends.onnxruntime import _session
from nestflex.deploy.backends.plan import ExecutionPlan, ExitsPlan, LevelPlan, load_plan, resolve
from nestflex.deploy.bundle.loader import Bundle
from nestflex.deploy.bundle.errors import BundleError
from nestflex.deploy.bundle.weights import WeightStore

__all__ = ["PagingReport", "CapacityRuntime", "DEFAULT_BACKEND", "KEEP"]

#: what runs a level, an exit set or a split when no plan says otherwise
DEFAULT_BACKEND = "onnxruntime"
#: the choices of ``CapacityRuntime(keep=...)``
KEEP = ("all", "active")


@dataclass(frozen=True)
class PagingReport:
    """What one :meth:`CapacityRuntime.set_level` call moved.

    Attributes:
        from_level: level resident before (``None`` on the first load).
        to_level: level resident after.
        page_in_bytes: bytes read from the bundle (entries the new level uses and the old did not;
            for a backend with its own copy, the size of a session built by this switch).
        page_out_bytes: bytes released (entries the old level used and the new does not).
        seconds: wall time of the switch.
        resident_bytes: bytes resident after the switch.
    """

    from_level: int | None
    to_level: int
    page_in_bytes: int
    page_out_bytes: int
    seconds: float
    resident_bytes: int


def default_plan(bundle: Bundle, backend: str = DEFAULT_BACKEND) -> ExecutionPlan:
    """A plan running every level and every exit set of ``bundle`` on ``backend`` with one thread."""
    return ExecutionPlan(tuple(LevelPlan(backend, 1) for _ in range(bundle.num_levels)),
                         exits={k: ExitsPlan(backend, 1) for k in bundle.exit_sets})


def resolve_plan(bundle: Bundle, plan: Any) -> ExecutionPlan:
    """``"auto"`` (the tuned plan beside the bundle, else the default), ``None`` (the default), a
    backend name (every level and exit set on it) or an :class:`ExecutionPlan`."""
    if isinstance(plan, str):
        if plan == "auto":
            return load_plan(bundle) or default_plan(bundle)
        return default_plan(bundle, plan)
    if plan is None:
        return default_plan(bundle)
    return plan


def check_input(x: Any, spec: Mapping[str, Any], where: str) -> np.ndarray:
    """``x`` as a float32 numpy batch of the bundle's input shape (a torch tensor's own memory)."""
    arr, _ = as_numpy(x) if hasattr(x, "shape") else (None, None)
    shape = list(spec["shape"])
    if arr is None or arr.ndim != len(shape) + 1 or list(arr.shape[1:]) != shape or arr.dtype.kind != "f":
        got = f"{arr.dtype} {tuple(arr.shape)}" if arr is not None else type(x).__name__
        raise BundleError(f"{where}: `x` must be a float array of shape (N, {', '.join(map(str, shape))}), got {got}. "
                          f"HINT: normalise with the bundle's input mean/std (bundle.input_spec) and batch it")
    return np.ascontiguousarray(arr, dtype=np.float32)


class CapacityRuntime:
    """Runs the multi-capacity backbone at one level; :meth:`set_level` switches between frames.

    Args:
        bundle: a loaded :class:`~nestflex.deploy.bundle.Bundle`.
        level: the level to make resident first (default: the largest).
        plan: ``"auto"`` (the plan ``nestflex tune`` stored beside the bundle, else every level on
            ``onnxruntime``), ``None`` (every level on ``onnxruntime``), a backend name (every
            level on it: ``"eager"`` is the torch reference) or an
            :class:`~nestflex.deploy.backends.ExecutionPlan`.
        batch: the batch size it will mostly run: the plan's choices for that size
            (:meth:`~nestflex.deploy.backends.ExecutionPlan.for_batch`; batch 1's by default).
        keep: ``"all"``: prepare every level now and keep them, so no switch builds a session;
            ``"active"``: hold only the running level's (one model's memory; a switch builds the
            new level's session). See the module's notes.

    Attributes:
        level: the resident level.
        num_levels: levels in the bundle.
        backend: the backend running the resident level.
        last_report: the :class:`PagingReport` of the latest switch (the initial load included).

    Example::

        rt = nd.CapacityRuntime(bundle, level=0)
        rt.set_level(1).seconds
    """

    def __init__(self, bundle: Bundle, level: int | None = None, plan: Any = "auto", batch: int = 1,
                 keep: str = "all") -> None:
        cap = bundle.spec.capacity
        self.bundle = bundle
        self.num_levels = cap.num_levels
        self.nodes = cap.program.nodes
        self.plan: ExecutionPlan = resolve_plan(bundle, plan)
        if len(self.plan.levels) != self.num_levels:
            raise BundleError(f"`plan` has {len(self.plan.levels)} levels, the bundle {self.num_levels}. HINT: run "
                              f"`nestflex tune` on this bundle")
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise BundleError(f"`batch` must be an int >= 1 (the batch size the runtime will run), got {batch!r}")
        if keep not in KEEP:
            raise BundleError(f"`keep` must be one of {', '.join(map(repr, KEEP))}, got {keep!r}. HINT: \"all\" keeps "
                              f"every level ready (fast switches), \"active\" one level (one model's memory)")
        self.keep = keep
        self.batch = batch
        self._plan_levels = self.plan.for_batch(batch)
        self._store = WeightStore(bundle, cap.program.tensor_names(), cap.regions, self.num_levels)
        self._ready: dict[int, tuple[Any, Prepared]] = {}  # level -> (backend, prepared)
        self._splits: dict[str, tuple[Callable, Callable]] = {}
        self.level: int | None = None
        self.backend = ""
        self.last_report: PagingReport | None = None
        self._fn: Callable[[np.ndarray], np.ndarray] | None = None
        level = self.num_levels - 1 if level is None else level
        self._check_level(level)
        if keep == "all":
            for k in range(self.num_levels):
                if k != level:
                    self._prepare(k)
        self.set_level(level)

    def level_bytes(self, level: int) -> int:
        """Weight bytes level ``level`` reads (its prefix of the nested tensors)."""
        self._check_level(level)
        return self._store.level_bytes(level)

    @property
    def resident_bytes(self) -> int:
        """Bytes held now: every prepared level's own copy (a session's graph) plus paged tensors."""
        return self._store.resident_bytes + sum(p.bytes for _, p in self._ready.values())

    def _check_level(self, level: int) -> None:
        if isinstance(level, bool) or not isinstance(level, int) or not 0 <= level < self.num_levels:
            raise BundleError(f"`level` must be an int in [0, {self.num_levels - 1}] (the bundle's levels), got "
                              f"{level!r}. HINT: bundle.levels lists them, smallest first")

    def _tensors(self, level: int) -> Callable[[], Mapping[str, np.ndarray]]:
        def get() -> Mapping[str, np.ndarray]:
            if self._store.level != level:
                self._store.page(level)
            return self._store.tensors

        return get

    def _prepare(self, level: int) -> tuple[Any, Prepared, int]:
        """The level's backend and prepared callable, made now if not ready; with the bytes made."""
        if level in self._ready:
            return (*self._ready[level], 0)
        backend, threads = resolve(self._plan_levels[level])
        prepared = backend.prepare(LevelContext(self.bundle, level, threads, self._tensors(level)))
        self._ready[level] = (backend, prepared)
        return backend, prepared, prepared.bytes

    def set_level(self, level: int) -> PagingReport:
        """Make ``level`` the one that runs: a swap when it is prepared (the default), else prepared now.

        A level on a backend with its own copy of the weights (onnxruntime) pages nothing; one that
        runs on the runtime's tensors (``eager``) pages in the entries it adds and out those it drops.

        Returns:
            a :class:`PagingReport` (bytes in/out, seconds, resident bytes after).

        Raises:
            BundleError: ``level`` outside ``[0, num_levels)``.
        """
        self._check_level(level)
        start = time.perf_counter()
        if self.keep == "active":  # the old level's session goes first: its memory, and its idle threads
            self._ready = {k: v for k, v in self._ready.items() if k == level}
        backend, prepared, built = self._prepare(level)  # raises before anything changed
        if backend.own_weights:
            page_in, page_out = built, self._store.release(level)
        else:
            page_in, page_out = self._store.page(level)
            page_in += built
        self._fn, self.backend = prepared.fn, backend.name
        seconds = time.perf_counter() - start
        self.last_report = PagingReport(self.level, level, page_in, page_out, seconds, self.resident_bytes)
        self.level = level
        return self.last_report

    def __call__(self, x: Any) -> Any:
        """Logits of the resident level for a normalised batch ``(N, *input shape)`` (numpy, or a
        torch tensor: torch logits back)."""
        arr = check_input(x, self.bundle.input_spec, "CapacityRuntime")
        _, back = as_numpy(x)
        return back(self._fn(arr))

    def split(self, name: str) -> tuple[Callable[..., tuple], Callable[..., Any]]:
        """Head and tail of the largest level cut at split point ``name`` (a node or layer name), on
        onnxruntime: ``tail(*head(x))`` equals the largest level's logits; the head returns every
        array that crosses the cut. Numpy in and out.

        Raises:
            BundleError: no such split point.
        """
        splits = self.bundle.spec.splits
        split = next((s for s in splits if name in (s.name, s.node)), None)
        if split is None:
            raise BundleError(f"no split point {name!r} in the bundle; split points: "
                              f"{', '.join(s.name for s in splits)}")
        if split.node not in self._splits:
            head_path, tail_path, _ = split_graphs(self.bundle, split.node)
            self._splits[split.node] = (_runner(head_path), _runner(tail_path))
        head, tail = self._splits[split.node]
        return head, (lambda *values: tail(*values)[0])


def _runner(path: Any, threads: int = 1) -> Callable[..., tuple]:
    """``fn(*arrays) -> tuple of arrays`` over a session of the graph at ``path`` (numpy, or torch
    tensors in and out)."""
    session = _session(path, threads, None)
    names = [i.name for i in session.get_inputs()]

    def run(*values: Any) -> tuple:
        feed = {n: np.ascontiguousarray(to_numpy(v), dtype=np.float32) for n, v in zip(names, values)}
        return like(values[0], tuple(session.run(None, feed)))

    return run
