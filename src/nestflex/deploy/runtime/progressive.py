"""The progressive runtime: batched early exit over an exit set's stages and heads (SPINN, SDN and
FlexDNN exits), on the capacity backbone or on the set's own.
"""

from __future__ import annotations

import operator
from typing import Any, Callable, Sequence

import torch

from nestflex.deploy.backends.eager import run_program
from nestflex.deploy.backends.plan import load_plan
from nestflex.deploy.bundle.loader import EXIT_SETS, Bundle
from nestflex.deploy.bundle.program import cut_program
from nestflex.deploy.bundle.schema import EXIT_SET_KEYS, BundleError, ExitSet
from nestflex.deploy.bundle.schema import ProgramNode as Node
from nestflex.deploy.exits import ConfidenceFn, ExitResult, check_thresholds, early_exit
from nestflex.deploy.runtime.capacity import CapacityRuntime, _check_input, _Store

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
        capacity: for a shared backbone, the :class:`CapacityRuntime` to run on (switched to the
            largest level); a new one if ``None``.
        exit_set: which set: ``"exits"`` / ``"progressive"`` or ``"flex_exits"`` / ``"flexdnn"``.
        plan: an :class:`~nestflex.deploy.backends.ExecutionPlan`: its entry for this set (if any)
            says which backend runs the stages and heads (``onnxruntime``: the bundle's stage and
            head graphs) and which early exits are evaluated; ``None``: eager, every exit;
            ``"auto"``: the plan ``nestflex tune`` stored beside the bundle, if there is one.
        active: the early exits to evaluate (indices in ``[0, num_exits - 1)``), overriding the
            plan's; a dropped exit's head never runs and its samples go on to the next kept exit.
            ``None``: the plan's choice, else all.

    Attributes:
        spec: the set's :class:`~nestflex.deploy.bundle.schema.ExitSet`.
        exits: the same as a dict (its manifest form).
        exit_set: the set's key, ``"exits"`` or ``"flex_exits"``.
        backend: the backend running the stages and heads.
        active: the early exits evaluated, ascending (all of them unless the plan or ``active`` says).

    Raises:
        BundleError: the bundle has no such exit set, or ``active`` names an exit it does not have.
    """

    def __init__(self, bundle: Bundle, capacity: CapacityRuntime | None = None, exit_set: str = "exits",
                 plan: Any = "auto", active: Sequence[int] | None = None) -> None:
        if isinstance(plan, str) and plan == "auto":
            plan = load_plan(bundle)
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
        if ex.backbone == "shared":
            self.capacity = capacity if capacity is not None else \
                CapacityRuntime(bundle, bundle.num_levels - 1, plan=None)  # exits run the eager program
            if self.capacity.level != bundle.num_levels - 1:
                self.capacity.set_level(bundle.num_levels - 1)
            self._level = bundle.num_levels - 1
            nodes, store = self.capacity.nodes, self.capacity._store
        else:
            self.capacity = None
            self._level = 0
            nodes = ex.program.nodes
            store = _Store(bundle, ex.program.tensor_names(), {}, 1)
            store.page(0)
        self._backbone_store = store
        self._heads = [h.program.nodes for h in ex.heads]
        self._head_store = _Store(bundle, list(dict.fromkeys(t for h in ex.heads for t in h.program.tensor_names())),
                                  {}, 1)
        self._head_store.page(0)
        stages = cut_program(nodes, ex.taps)
        self._eager_stages = [self._make_stage(*s) for s in stages]
        self._eager_heads = self._make_heads()
        self._stages, self._heads_fns = self._eager_stages, self._eager_heads
        self.backend, self._session_bytes = "eager", 0
        self._fused = None  # the backend's one-call early exit for a single sample, if it has one
        entry = None if plan is None else plan.exits.get(key)
        if active is None and entry is not None:
            active = entry.active
        self._active: tuple[int, ...] = self._check_active(active)
        if entry is not None:
            from nestflex.deploy.backends.plan import resolve

            backend, threads = resolve(entry)
            self._stages, self._heads_fns = backend.prepare_exits(self, threads)
            self.backend = backend.name
            torch.set_num_threads(threads)
            if backend.own_weights:  # the sessions hold the stages and heads: keep no second copy
                self._head_store.release(0)
                if self.capacity is None or capacity is None:  # an own backbone, or one the caller does not run
                    self._backbone_store.release(self._level)

    @property
    def num_exits(self) -> int:
        return len(self._heads) + 1

    @property
    def active(self) -> tuple[int, ...]:
        """The early exits evaluated, ascending (read-only: the fused graph was built for them)."""
        return self._active

    def _check_active(self, active: Any) -> tuple[int, ...]:
        early = self.num_exits - 1
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
        """Weight bytes resident: backbone (the active level if shared) plus heads, plus the
        onnxruntime sessions' copies when the plan runs the exits there."""
        return self._backbone_store.resident_bytes + self.own_bytes

    @property
    def own_bytes(self) -> int:
        """Weight bytes this runtime holds beyond a shared backbone's: the heads (paged, or in the
        onnxruntime sessions with the stages), and an own backbone."""
        own = 0 if self.capacity is not None else self._backbone_store.resident_bytes
        return own + self._head_store.resident_bytes + self._session_bytes

    def _make_stage(self, inputs: list[str], nodes: list[Node], outputs: list[str]) -> Callable[..., Any]:
        def run(*values: torch.Tensor) -> tuple[torch.Tensor, ...]:
            env = dict(zip(inputs, values))
            result = run_program(nodes, env, self._backbone_store.tensors, self._level)
            return tuple(env[o] for o in outputs) if outputs else (result,)

        return run

    def _make_heads(self) -> list[Callable[[tuple[torch.Tensor, ...]], torch.Tensor]]:
        def head(program: Sequence[Node]) -> Callable[[tuple[torch.Tensor, ...]], torch.Tensor]:
            return lambda state: run_program(program, {program[0].name: state[0]}, self._head_store.tensors, 0)

        return [head(p) for p in self._heads] + [lambda state: state[0]]

    def _head_fns(self) -> list[Callable[[tuple[torch.Tensor, ...]], torch.Tensor]]:
        return self._heads_fns

    def _ready(self, x: torch.Tensor) -> None:
        _check_input(x, self.bundle.input_spec, "ProgressiveRuntime")
        if self.capacity is not None and self.capacity.level != self._level:
            raise BundleError(f"the exits sit on level {self._level}, but the shared CapacityRuntime is at level "
                              f"{self.capacity.level}. HINT: call capacity.set_level({self._level}) first")

    @torch.no_grad()
    def all_exits(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Logits of every exit for the whole batch (no early exit), final exit last."""
        self._ready(x)
        heads, state, out = self._head_fns(), (x,), []
        for stage, head in zip(self._stages, heads):
            state = stage(*state)
            out.append(head(state))
        return out

    @torch.no_grad()
    def exit_logits(self, x: torch.Tensor, k: int) -> torch.Tensor:
        """Logits of exit ``k`` alone, running only the stages before it (what stopping there costs).

        Raises:
            BundleError: ``k`` outside ``[0, num_exits)``.
        """
        if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k < self.num_exits:
            raise BundleError(f"`k` must be an exit index in [0, {self.num_exits - 1}], got {k!r}")
        self._ready(x)
        state: tuple[torch.Tensor, ...] = (x,)
        for stage in self._stages[: k + 1]:
            state = stage(*state)
        return self._head_fns()[k](state)

    @torch.no_grad()
    def path(self, x: torch.Tensor, k: int) -> torch.Tensor:
        """Logits of exit ``k`` after every stage and head up to it: what a sample that leaves at
        ``k`` costs under the policy (the kept heads before it were evaluated and declined; a
        dropped ``k``'s own head runs too, what stopping there would cost)."""
        if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k < self.num_exits:
            raise BundleError(f"`k` must be an exit index in [0, {self.num_exits - 1}], got {k!r}")
        self._ready(x)
        heads, state, out = self._head_fns(), (x,), x
        for j, (stage, head) in enumerate(zip(self._stages[: k + 1], heads)):
            state = stage(*state)
            if j == k or j in self.active:
                out = head(state)
        return out

    def _grouped(self) -> tuple[list[Callable[..., Any]], list[Callable[..., Any]], list[int]]:
        """Stages and heads of the kept exits: the stages between two kept exits as one callable;
        with the exits' numbers (the final one last)."""
        stages, heads, ends = self._stages, self._head_fns(), [*self.active, self.num_exits - 1]

        def chain(run: Sequence[Callable[..., Any]]) -> Callable[..., Any]:
            def go(*state: torch.Tensor) -> Any:
                for stage in run:
                    state = stage(*state)
                    state = (state,) if isinstance(state, torch.Tensor) else state
                return state

            return go

        starts = [0, *(k + 1 for k in ends[:-1])]
        return [chain(stages[a:b + 1]) for a, b in zip(starts, ends)], [heads[k] for k in ends], ends

    @torch.no_grad()
    def __call__(
        self,
        x: torch.Tensor,
        thresholds: float | Sequence[float] | None = None,
        confidence: str | ConfidenceFn | None = None,
        fallback: str | None = None,
    ) -> ExitResult:
        """Batched early exit (:func:`nestflex.deploy.exits.early_exit`): exited samples leave the batch.

        A single frame on an onnxruntime exit plan runs the whole policy as one fused graph
        (:mod:`nestflex.deploy.backends.fused_exits`) when the set's own confidence and fallback apply.
        Only the :attr:`active` early exits are evaluated; ``exit_index`` and ``answer_index``
        number the exits of the whole set.

        Args:
            x: normalised input batch.
            thresholds, confidence, fallback: override the bundle's calibrated values
                (``thresholds``: one per early exit of the set, kept or not).
        """
        self._ready(x)
        thresholds = self.thresholds if thresholds is None else thresholds
        confidence = self.confidence if confidence is None else confidence
        fallback = self.fallback if fallback is None else fallback
        if (self._fused is not None and x.shape[0] == 1 and confidence == self.confidence
                and fallback == self.fallback):  # one frame: the whole policy in one session call
            return self._fused(x, check_thresholds(thresholds, self.num_exits - 1))
        if len(self.active) == self.num_exits - 1:
            return early_exit(self._stages, self._head_fns(), x, thresholds, confidence, fallback)
        thr = check_thresholds(thresholds, self.num_exits - 1)
        stages, heads, ends = self._grouped()
        got = early_exit(stages, heads, x, [thr[k] for k in ends[:-1]], confidence, fallback)
        number = torch.tensor(ends, device=got.exit_index.device)
        return ExitResult(got.logits, number[got.exit_index], number[got.answer_index], got.confidence)
