"""The progressive runtime: batched early exit over an exit set's stages and heads (SPINN, SDN and
FlexDNN exits), on the capacity backbone or on the set's own.
"""

from __future__ import annotations

import operator
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from nestflex.deploy._arrays import as_numpy
from nestflex.deploy.backends.base import ExitsContext
from nestflex.deploy.backends.plan import ExitsPlan, resolve
from nestflex.deploy.bundle.loader import EXIT_SETS, Bundle
from nestflex.deploy.bundle.constants import EXIT_SET_KEYS
from nestflex.deploy.bundle.errors import BundleError
from nestflex.deploy.bundle.exit_records import ExitSet
from nestflex.deploy.bundle.weights import WeightStore
from nestflex.deploy.exits import ConfidenceFn, ExitResult, check_thresholds, early_exit
from nestflex.deploy.runtime.capacity import DEFAULT_BACKEND, CapacityRuntime, check_input, resolve_plan

__all__ = ["ProgressiveRuntime"]

class ProgressiveRuntime:
    """Batched early exit over one exit set of the bundle, with the shared policy of :mod:`nestflex.deploy.exits`.

    A bundle may hold two exit sets with the same layout: the ``progressive`` one (SPINN/SDN
    exits; schema-1 key ``exits``) and the ``flexdnn`` one (FlexDNN's planned fine-grained exits;
    ``flex_exits``); both run here alike. When the set says ``backbone == "shared"`` the heads sit
    on the multi-capacity backbone's largest level (one copy of the weights); with ``"own"`` the
    set's backbone is its own component.

    Args:
        bundle: a loaded bundle with exits.
        capacity: for a shared backbone, a :class:`CapacityRuntime` whose tensors the ``eager``
            backend runs on (one copy of the weights; switched to the largest level); an
            onnxruntime exit set holds its own copy in its sessions and only checks the level.
        exit_set: which set: ``"exits"`` / ``"progressive"`` or ``"flex_exits"`` / ``"flexdnn"``.
        plan: ``"auto"`` (the plan ``nestflex tune`` stored beside the bundle, else onnxruntime),
            ``None`` (onnxruntime), a backend name, or an
            :class:`~nestflex.deploy.backends.ExecutionPlan`: its entry for this set says which
            backend runs the stages and heads and which early exits are evaluated.
        active: the early exits to evaluate (indices in ``[0, num_exits - 1)``), overriding the
            plan's; a dropped exit's head never runs and its samples go on to the next kept exit.
            ``None``: the plan's choice, else all.
        fused: on onnxruntime, run a single frame as one fused early-exit graph (one call per
            frame instead of one per stage and head) when the set's own confidence and fallback
            apply (and each frame of a batch of up to ``fused_batch``). Its price is memory once a
            larger batch opens the stage sessions: the graph holds a second copy of the set's float
            weights beside them (benchmarks/deploy/deploy_footprint.py measures the process with and
            without it).
            ``False``: stage by stage, sessions opened on first use.
        fused_batch: batches of up to this many frames run frame by frame through the fused graph
            (each frame still leaves at its own exit) rather than through the stage sessions: at
            batch 8 on the default recipe's bundle the frames one by one took as long as the
            batched stages (docs/deploy.md), and a process that only sees such batches never opens
            the stage sessions and their second copy of the weights. Larger batches go through the
            stages, where a sample that exits leaves the batch. ``1``: only single frames.

    Attributes:
        spec: the set's :class:`~nestflex.deploy.bundle.exit_records.ExitSet`.
        exits: the same as a dict (its manifest form).
        exit_set: the set's key, ``"exits"`` or ``"flex_exits"``.
        backend: the backend running the stages and heads.
        active: the early exits evaluated, ascending (all of them unless the plan or ``active`` says).

    Raises:
        BundleError: the bundle has no such exit set, or ``active`` names an exit it does not have.
    """

    def __init__(self, bundle: Bundle, capacity: CapacityRuntime | None = None, exit_set: str = "exits",
                 plan: Any = "auto", active: Sequence[int] | None = None, fused: bool = True,
                 fused_batch: int = 8) -> None:
        if not isinstance(fused_batch, int) or isinstance(fused_batch, bool) or fused_batch < 1:
            raise BundleError(f"`fused_batch` must be an int >= 1 (the largest batch run frame by frame through "
                              f"the fused graph; 1: single frames only), got {fused_batch!r}")
        self.fused_batch = fused_batch
        key = EXIT_SET_KEYS.get(exit_set, exit_set)
        if key not in EXIT_SETS:
            raise BundleError(f"`exit_set` must be one of {', '.join(EXIT_SETS)} (or the kinds "
                              f"{', '.join(EXIT_SET_KEYS)}), got {exit_set!r}")
        ex: ExitSet | None = bundle.spec.exit_set(key)
        if ex is None:
            present = ", ".join(bundle.exit_sets) or "none"
            hint = ("export it with a MultiExitNetwork (`exits=`) or run the recipe's exits stage before export"
                    if key == "exits" else "export it with `flex_exits=` and `flex_spec=` (FlexDNN's network and "
                    "spec) or run the recipe's flex stage before export")
            raise BundleError(f"bundle {str(bundle.path)!r} has no {key} (exit sets present: {present}). "
                              f"HINT: {hint}")
        self.bundle, self.spec, self.exit_set = bundle, ex, key
        self.exits: dict[str, Any] = bundle.exit_sets[key]
        self.thresholds: list[float] = list(ex.thresholds)
        self.confidence: str = ex.confidence
        self.fallback: str = ex.fallback
        plan = resolve_plan(bundle, plan)
        entry = plan.exits.get(key) or ExitsPlan(DEFAULT_BACKEND, 1)
        if active is None:
            active = entry.active
        self._num_heads = len(ex.heads)
        self._active: tuple[int, ...] = self._check_active(active)
        backend, threads = resolve(entry)
        if ex.backbone == "shared":
            self._level = bundle.num_levels - 1
            self.capacity = capacity
            if capacity is not None and capacity.level != self._level:
                capacity.set_level(self._level)
            if capacity is not None and not backend.own_weights:  # run on the capacity runtime's tensors
                store = capacity._store
            else:
                cap = bundle.spec.capacity
                store = WeightStore(bundle, cap.program.tensor_names(), cap.regions, cap.num_levels)
            nodes = bundle.spec.capacity.program.nodes
        else:
            self.capacity = None
            self._level = 0
            nodes = ex.program.nodes
            store = WeightStore(bundle, ex.program.tensor_names(), {}, 1)
        self._backbone_store = store
        self._head_store = WeightStore(bundle, list(dict.fromkeys(t for h in ex.heads for t in h.program.tensor_names())),
                                       {}, 1)
        prepared = backend.prepare_exits(ExitsContext(
            bundle, key, ex, threads, self.confidence, self.fallback, self._active, nodes, self._level,
            _paged(store, self._level), _paged(self._head_store, 0), bool(fused)))
        self._stages, self._heads_fns, self._fused, self._prepared_bytes = (
            prepared.stages, prepared.heads, prepared.fused, prepared.bytes)
        self.backend = backend.name

    @property
    def num_exits(self) -> int:
        return self._num_heads + 1

    @property
    def active(self) -> tuple[int, ...]:
        """The early exits evaluated, ascending (read-only: the fused graph was built for them)."""
        return self._active

    def _check_active(self, active: Any) -> tuple[int, ...]:
        early = self._num_heads
        if active is None:
            return tuple(range(early))
        given = active
        try:
            active = [active] if isinstance(active, (str, bytes)) else list(active)
            kept = sorted({operator.index(k) for k in active if not isinstance(k, bool)})
        except (TypeError, ValueError, RuntimeError):  # not a sequence of ints
            kept = None
        if kept is None or len(kept) != len(active) or any(not 0 <= k < early for k in kept):
            where = f"in [0, {early - 1}]" if early else "(it has none: only its final exit)"
            raise BundleError(f"`active` must list distinct early exits of {self.exit_set} {where}, got "
                              f"{given!r:.80}. HINT: the final exit always runs; re-run `nestflex tune` if the plan "
                              f"was written for another bundle")
        return tuple(kept)

    @property
    def resident_bytes(self) -> int:
        """Bytes resident: the backbone's paged weights (the active level's if shared) plus :attr:`own_bytes`."""
        shared = self._backbone_store.resident_bytes if self.spec.backbone == "shared" else 0
        return shared + self.own_bytes

    @property
    def own_bytes(self) -> int:
        """Bytes this runtime holds beyond a shared backbone's paged weights: the heads (paged, or in
        the onnxruntime sessions with the stages), and an own backbone."""
        own = 0 if self.spec.backbone == "shared" else self._backbone_store.resident_bytes
        return own + self._head_store.resident_bytes + self._prepared_bytes()

    def _head_fns(self) -> list[Callable[[tuple], np.ndarray]]:
        return self._heads_fns

    def _ready(self, x: Any) -> np.ndarray:
        arr = check_input(x, self.bundle.input_spec, "ProgressiveRuntime")
        if self.capacity is not None and self.capacity.level != self._level:
            raise BundleError(f"the exits sit on level {self._level}, but the shared CapacityRuntime is at level "
                              f"{self.capacity.level}. HINT: call capacity.set_level({self._level}) first")
        return arr

    def all_exits(self, x: Any) -> list[Any]:
        """Logits of every exit for the whole batch (no early exit), final exit last."""
        arr, back = self._ready(x), as_numpy(x)[1]
        heads, state, out = self._head_fns(), (arr,), []
        for stage, head in zip(self._stages, heads):
            state = stage(*state)
            out.append(head(state))
        return back(out)

    def exit_logits(self, x: Any, k: int) -> Any:
        """Logits of exit ``k`` alone, running only the stages before it (what stopping there costs).

        Raises:
            BundleError: ``k`` outside ``[0, num_exits)``.
        """
        if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k < self.num_exits:
            raise BundleError(f"`k` must be an exit index in [0, {self.num_exits - 1}], got {k!r}")
        arr, back = self._ready(x), as_numpy(x)[1]
        state: tuple = (arr,)
        for stage in self._stages[: k + 1]:
            state = stage(*state)
        return back(self._head_fns()[k](state))

    def path(self, x: Any, k: int) -> Any:
        """Logits of exit ``k`` after every stage and head up to it: what a sample that leaves at
        ``k`` costs under the policy (the kept heads before it were evaluated and declined; a
        dropped ``k``'s own head runs too, what stopping there would cost)."""
        if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k < self.num_exits:
            raise BundleError(f"`k` must be an exit index in [0, {self.num_exits - 1}], got {k!r}")
        arr, back = self._ready(x), as_numpy(x)[1]
        heads, state, out = self._head_fns(), (arr,), arr
        for j, (stage, head) in enumerate(zip(self._stages[: k + 1], heads)):
            state = stage(*state)
            if j == k or j in self.active:
                out = head(state)
        return back(out)

    def _grouped(self) -> tuple[list[Callable[..., Any]], list[Callable[..., Any]], list[int]]:
        """Stages and heads of the kept exits: the stages between two kept exits as one callable;
        with the exits' numbers (the final one last)."""
        stages, heads, ends = self._stages, self._head_fns(), [*self.active, self.num_exits - 1]

        def chain(run: Sequence[Callable[..., Any]]) -> Callable[..., Any]:
            def go(*state: np.ndarray) -> Any:
                for stage in run:
                    state = stage(*state)
                return state

            return go

        starts = [0, *(k + 1 for k in ends[:-1])]
        return [chain(stages[a:b + 1]) for a, b in zip(starts, ends)], [heads[k] for k in ends], ends

    def __call__(
        self,
        x: Any,
        thresholds: float | Sequence[float] | None = None,
        confidence: str | ConfidenceFn | None = None,
        fallback: str | None = None,
    ) -> ExitResult:
        """Batched early exit (:func:`nestflex.deploy.exits.early_exit`): exited samples leave the batch.

        A single frame on an onnxruntime exit plan runs the whole policy as one fused graph
        (:mod:`nestflex.deploy.backends.fused_exits`) when the set's own confidence and fallback apply,
        and so does each frame of a batch of up to ``fused_batch`` frames.
        Only the :attr:`active` early exits are evaluated; ``exit_index`` and ``answer_index``
        number the exits of the whole set. Numpy in, numpy out (a torch tensor in: torch out).

        Args:
            x: normalised input batch.
            thresholds: override the bundle's calibrated thresholds: one per early exit of the
                set, kept or not (or one number for all); ``None``: the calibrated ones.
            confidence: override the confidence measure (a registered name or a callable,
                :func:`~nestflex.deploy.exits.get_confidence`); ``None``: the set's own.
            fallback: override what answers a sample that passed no early exit
                (``"most_confident"`` or ``"final"``); ``None``: the set's own.
        """
        arr, back = self._ready(x), as_numpy(x)[1]
        thresholds = self.thresholds if thresholds is None else thresholds
        confidence = self.confidence if confidence is None else confidence
        fallback = self.fallback if fallback is None else fallback
        if (self._fused is not None and arr.shape[0] <= self.fused_batch and confidence == self.confidence
                and fallback == self.fallback):  # the whole policy in one session call per frame
            thr = check_thresholds(thresholds, self.num_exits - 1)
            parts = [self._fused(arr[i:i + 1], thr) for i in range(arr.shape[0])]
            got = parts[0] if len(parts) == 1 else ExitResult(
                *(np.concatenate([getattr(r, f) for r in parts]) for f in ("logits", "exit_index", "answer_index",
                                                                             "confidence")))
        elif len(self.active) == self.num_exits - 1:
            got = early_exit(self._stages, self._head_fns(), arr, thresholds, confidence, fallback)
        else:
            thr = check_thresholds(thresholds, self.num_exits - 1)
            stages, heads, ends = self._grouped()
            got = early_exit(stages, heads, arr, [thr[k] for k in ends[:-1]], confidence, fallback)
            number = np.asarray(ends, dtype=np.int64)
            got = ExitResult(got.logits, number[got.exit_index], number[got.answer_index], got.confidence)
        return ExitResult(*back((got.logits, got.exit_index, got.answer_index, got.confidence)))


def _paged(store: WeightStore, level: int) -> Callable[[], Mapping[str, np.ndarray]]:
    """The store's tensors for ``level``, paged in on first use (a backend with its own copy never asks)."""
    def get() -> Mapping[str, np.ndarray]:
        if store.level != level:
            store.page(level)
        return store.tensors

    return get
