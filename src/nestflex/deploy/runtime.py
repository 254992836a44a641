"""Runtimes for a loaded bundle: multi-capacity (paged levels) and progressive (batched early exit).

Backend: **torch eager over a small op program** read from the manifest. Each component
(backbone, exit head) is a :class:`~nestflex.deploy.schema.Program`: nodes (``conv2d``,
``batch_norm``, ``relu``, pools, ``linear``, ``flatten``, ``add``/``sub``/``mul``,
``index_select``, ``param``) whose weights are safetensors tensors, validated once by the schema
when the bundle is loaded (ops, arguments, attributes, tensors, regions). A nested
layer's weight is one full tensor in nested order; level ``k`` computes with a prefix of it (the
``regions`` table of the manifest gives the prefix shape per level, ``null`` when a level does
not use a tensor at all, e.g. another level's BatchNorm). This is why the runtime can page:

* :meth:`CapacityRuntime.set_level` keeps exactly the tensor entries the new level uses. An
  upgrade reads from the (memory-mapped) safetensors file only the entries the new level adds
  (the prefix box minus the resident one, as at most one box per dimension); a downgrade copies
  the smaller prefix and drops the rest. It reports page-in/page-out bytes (the same accounting as
  :func:`nestflex.capacity.profile.paging_bytes`) and the seconds it took.
* Resident weight memory is the active level's own bytes, so it never exceeds the largest level.

ONNX files in the bundle serve other runtimes (onnxruntime, TensorRT, ...); an ONNX session
cannot share weights between levels or page a delta, so it is not the default here.

Example::

    import nestflex.deploy as nd
    rt = nd.load("bundle.nfx").capacity(level=0)
    report = rt.set_level(2); report.page_in_bytes
    logits = rt(x)
"""

from __future__ import annotations

import math
import operator
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import torch
import torch.nn.functional as F

from nestflex.deploy.bundle import EXIT_SETS, Bundle, BundleError
from nestflex.deploy.exits import ConfidenceFn, ExitResult, check_thresholds, early_exit
from nestflex.deploy.schema import EXIT_SET_KEYS, ExitSet, Program, ProgramNode

__all__ = ["OPS", "MAX_ACTIVATION_ELEMENTS", "PagingReport", "CapacityRuntime", "ProgressiveRuntime", "run_program", "cut_program",
           "check_shapes"]

Node = ProgramNode
Region = Sequence[int] | None


@dataclass(frozen=True)
class PagingReport:
    """What one :meth:`CapacityRuntime.set_level` call moved.

    Attributes:
        from_level: level resident before (``None`` on the first load).
        to_level: level resident after.
        page_in_bytes: bytes read from the bundle (entries the new level uses and the old did not).
        page_out_bytes: bytes released (entries the old level used and the new does not).
        seconds: wall time of the switch.
        resident_bytes: weight bytes resident after the switch.
    """

    from_level: int | None
    to_level: int
    page_in_bytes: int
    page_out_bytes: int
    seconds: float
    resident_bytes: int


# --------------------------------------------------------------------------------------------
# the op program


def _arg(a: Any, env: Mapping[str, Any]) -> Any:
    return env[a] if isinstance(a, str) else a


def _conv2d(node: Node, x: torch.Tensor, w: Mapping[str, torch.Tensor]) -> torch.Tensor:
    at = node.attrs
    weight = w["weight"]
    groups = weight.shape[0] if at.get("depthwise") else at["groups"]
    return F.conv2d(x, weight, w.get("bias"), at["stride"], at["padding"], at["dilation"], groups)


def _batch_norm(node: Node, x: torch.Tensor, w: Mapping[str, torch.Tensor]) -> torch.Tensor:
    return F.batch_norm(x, w["running_mean"], w["running_var"], w.get("weight"), w.get("bias"), False, 0.0,
                        node.attrs["eps"])


def _max_pool(node: Node, x: torch.Tensor, w) -> torch.Tensor:
    at = node.attrs
    return F.max_pool2d(x, at["kernel_size"], at["stride"], at["padding"], at["dilation"], at["ceil_mode"])


def _avg_pool(node: Node, x: torch.Tensor, w) -> torch.Tensor:
    at = node.attrs
    return F.avg_pool2d(x, at["kernel_size"], at["stride"], at["padding"], at["ceil_mode"], at["count_include_pad"],
                        at.get("divisor_override"))


def _size(v: Any) -> Any:
    return tuple(v) if isinstance(v, list) else v


#: op name -> fn(node, first input, weights of this node) for ops with one tensor input
OPS: dict[str, Callable[..., torch.Tensor]] = {
    "conv2d": _conv2d,
    "linear": lambda node, x, w: F.linear(x, w["weight"], w.get("bias")),
    "batch_norm": _batch_norm,
    "relu": lambda node, x, w: F.relu(x),
    "relu6": lambda node, x, w: F.hardtanh(x, 0.0, 6.0),
    "identity": lambda node, x, w: x,
    "max_pool2d": _max_pool,
    "avg_pool2d": _avg_pool,
    "adaptive_avg_pool2d": lambda node, x, w: F.adaptive_avg_pool2d(x, _size(node.attrs["output_size"])),
    "adaptive_max_pool2d": lambda node, x, w: F.adaptive_max_pool2d(x, _size(node.attrs["output_size"])),
    "flatten": lambda node, x, w: torch.flatten(x, node.attrs["start_dim"], node.attrs["end_dim"]),
}
_BINARY = {"add": operator.add, "sub": operator.sub, "mul": operator.mul}
#: ops run_program handles itself; with OPS and _BINARY exactly the schema's PROGRAM_OPS (tested)
_SPECIAL = ("input", "output", "param", "index_select")


def _node_weights(node: Node, tensors: Mapping[str, torch.Tensor], level: int) -> dict[str, torch.Tensor]:
    return {role: tensors[name] for role, name in node.level_params(level).items()}


def _nodes(nodes: Sequence[Node] | Sequence[Mapping[str, Any]]) -> Sequence[Node]:
    """Typed nodes; a program given as JSON dicts (the manifest form) is read and checked once here."""
    if nodes and isinstance(nodes[0], Mapping):
        return Program.from_json(list(nodes)).nodes
    return nodes


def run_program(nodes: Sequence[Node], env: dict[str, Any], tensors: Mapping[str, torch.Tensor], level: int = 0) -> Any:
    """Run ``nodes`` (:class:`~nestflex.deploy.schema.ProgramNode`, or their JSON dicts) in order;
    ``env`` holds the inputs by node name and receives every result.

    The program was validated when the bundle was loaded (:mod:`nestflex.deploy.schema`), so
    this loop only dispatches.

    Returns the ``output`` node's value (a tensor or a tuple), or ``None`` if ``nodes`` has none.
    """
    for node in _nodes(nodes):
        op = node.op
        if op == "input":
            continue
        if op == "output":
            args = [_arg(a, env) for a in node.args]
            return args[0] if len(args) == 1 else tuple(args)
        if op == "param":
            env[node.name] = tensors[node.params["value"]]
        elif op in _BINARY:
            a, b = (_arg(x, env) for x in node.args)
            env[node.name] = _BINARY[op](a, b)
        elif op == "index_select":  # FlexDNN exits: the top-k filters of the tapped map
            a, index = (_arg(x, env) for x in node.args)
            env[node.name] = torch.index_select(a, node.attrs["dim"], index)
        else:
            env[node.name] = OPS[op](node, _arg(node.args[0], env), _node_weights(node, tensors, level))
    return None


def cut_program(nodes: Sequence[Node], cuts: Sequence[str]) -> list[tuple[list[str], list[Node], list[str]]]:
    """Cut a program after each node named in ``cuts`` (in execution order).

    Returns one ``(inputs, nodes, outputs)`` per stage: stage ``k`` takes the values named by
    ``inputs`` (the program input for stage 0), runs ``nodes`` and returns the values named by
    ``outputs``: the cut node first, then every other value a later stage still needs (skip
    connections), in definition order; the last stage returns the program output.

    Raises:
        BundleError: a cut names no node of the program, or cuts are out of order.
    """
    nodes = _nodes(nodes)
    index = {n.name: i for i, n in enumerate(nodes)}
    for c in cuts:
        if c not in index:
            raise BundleError(f"cut point {c!r} is not a node of the program. HINT: the manifest is inconsistent")
    positions = [index[c] for c in cuts]
    if positions != sorted(positions) or len(set(positions)) != len(positions):
        raise BundleError(f"cut points {list(cuts)} are not in execution order")
    last_use: dict[str, int] = {}
    for i, n in enumerate(nodes):
        for a in n.args:
            if isinstance(a, str):
                last_use[a] = i
    inputs = [n.name for n in nodes if n.op == "input"]
    stages, start = [], 0
    params = {n.name: n for n in nodes if n.op == "param"}
    for c, p in zip([*cuts, None], [*positions, len(nodes) - 1]):
        body = list(nodes[start : p + 1])
        # a `param` node defined in an earlier stage is repeated where used: weights never cross a cut
        own = {n.name for n in body}
        used = [a for n in body for a in n.args if isinstance(a, str) and a in params and a not in own]
        body = [params[a] for a in dict.fromkeys(used)] + body
        if c is None:
            outputs: list[str] = []
        else:
            live = [n.name for n in nodes[: p + 1] if n.op != "param" and last_use.get(n.name, -1) > p]
            outputs = [c, *[name for name in live if name != c]]
        stages.append((inputs, body, outputs))
        inputs, start = outputs, p + 1
    return stages


# --------------------------------------------------------------------------------------------
# weights resident in memory, paged per level


def _delta_boxes(inter: Sequence[int], new: Sequence[int]) -> list[tuple[slice, ...]]:
    """Disjoint boxes that cover the prefix box ``new`` minus the prefix box ``inter``."""
    boxes = []
    for d in range(len(new)):
        if inter[d] >= new[d]:
            continue
        box = tuple([slice(0, inter[i]) for i in range(d)] + [slice(inter[d], new[d])]
                    + [slice(0, new[i]) for i in range(d + 1, len(new))])
        if all(s.stop > s.start for s in box):
            boxes.append(box)
    return boxes


class _Store:
    """The tensors one level uses, read from the bundle's safetensors file on demand.

    :meth:`release` drops every tensor but remembers the level: a level that runs elsewhere (an
    onnxruntime session holds its own copy) keeps nothing here, and the first eager use
    (:attr:`tensors`: a split, an eager exit head) pages the level in again.
    """

    def __init__(self, bundle: Bundle, names: Sequence[str], regions: Mapping[str, Sequence[Region]], levels: int) -> None:
        from safetensors import safe_open

        table = bundle.spec.weights.tensors  # the schema checked that every program tensor is here
        self.file = safe_open(str(bundle.weights_path), framework="pt")
        self.dtypes = {n: getattr(torch, table[n].dtype) for n in names}
        self.regions = {n: [None if r is None else list(r) for r in regions[n]] if n in regions
                        else [list(table[n].shape)] * levels for n in names}
        self._tensors: dict[str, torch.Tensor] = {}
        self.level: int | None = None  # the level the resident tensors hold
        self.wanted: int | None = None  # the level asked for (differs after release())

    @property
    def tensors(self) -> dict[str, torch.Tensor]:
        """The wanted level's tensors, paged in first if they were released."""
        if self.wanted is not None and self.level != self.wanted:
            self.page(self.wanted)
        return self._tensors

    def release(self, level: int) -> int:
        """Drop every resident tensor (bytes released), keeping ``level`` as the one to page in on demand."""
        freed = self.resident_bytes
        self._tensors.clear()
        self.level, self.wanted = None, level
        return freed

    def level_bytes(self, level: int) -> int:
        total = 0
        for n, regs in self.regions.items():
            if regs[level] is not None:
                numel = 1
                for s in regs[level]:
                    numel *= s
                total += numel * self.dtypes[n].itemsize
        return total

    @property
    def resident_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self._tensors.values())

    def page(self, level: int) -> tuple[int, int]:
        page_in = page_out = 0
        tensors = self._tensors
        for name, regs in self.regions.items():
            old = tensors.get(name)
            new_shape = regs[level]
            size = self.dtypes[name].itemsize
            if new_shape is None:
                if old is not None:
                    page_out += old.numel() * size
                    del tensors[name]
                continue
            if old is not None and list(old.shape) == new_shape:
                continue
            if not new_shape:  # a scalar
                tensors[name] = self.file.get_tensor(name)
                page_in += size
                continue
            inter = [min(a, b) for a, b in zip(old.shape, new_shape)] if old is not None else [0] * len(new_shape)
            region = tuple(slice(0, s) for s in inter)
            if old is not None and inter == new_shape:  # a pure downgrade: keep a compact copy of the prefix
                fresh = old[region].clone()
            else:
                fresh = torch.empty(new_shape, dtype=self.dtypes[name])
                if old is not None:
                    fresh[region] = old[region]
                view = self.file.get_slice(name)
                for box in _delta_boxes(inter, new_shape):
                    part = view[box]
                    fresh[box] = part
                    page_in += part.numel() * size
            if old is not None:
                kept = 1
                for s in inter:
                    kept *= s
                page_out += (old.numel() - kept) * size
            tensors[name] = fresh
        self.level = self.wanted = level
        return page_in, page_out


def _check_input(x: torch.Tensor, spec: Mapping[str, Any], where: str) -> None:
    shape = list(spec["shape"])
    if not isinstance(x, torch.Tensor) or x.dim() != len(shape) + 1 or list(x.shape[1:]) != shape:
        got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise BundleError(f"{where}: `x` must be a float tensor of shape (N, {', '.join(map(str, shape))}), got {got}. "
                          f"HINT: normalise with the bundle's input mean/std (bundle.input_spec) and batch it")


class CapacityRuntime:
    """Runs the multi-capacity backbone at one level; :meth:`set_level` pages only the delta.

    Args:
        bundle: a loaded :class:`~nestflex.deploy.bundle.Bundle`.
        level: the level to make resident first.
        plan: an :class:`~nestflex.deploy.backends.ExecutionPlan` (``None``: eager everywhere).
        batch: the batch size it will mostly run: the plan's choices for that size
            (:meth:`~nestflex.deploy.backends.ExecutionPlan.for_batch`; batch 1's by default).

    Attributes:
        level: the resident level.
        num_levels: levels in the bundle.
        last_report: the :class:`PagingReport` of the latest switch (the initial load included).

    Example::

        rt = bundle.capacity(level=0)
        rt.set_level(1).page_in_bytes
    """

    def __init__(self, bundle: Bundle, level: int, plan: Any = None, batch: int = 1) -> None:
        cap = bundle.spec.capacity
        self.bundle = bundle
        self.num_levels = cap.num_levels
        self.nodes: tuple[Node, ...] = cap.program.nodes
        self._store = _Store(bundle, cap.program.tensor_names(), cap.regions, self.num_levels)
        self.level: int | None = None
        self.last_report: PagingReport | None = None
        self.plan = plan  # an ExecutionPlan (nestflex.deploy.backends) or None: eager everywhere
        self.backend = "eager"
        self._fn: Callable[[torch.Tensor], torch.Tensor] = self._eager
        self._session_bytes = 0
        if plan is not None and len(plan.levels) != self.num_levels:
            raise BundleError(f"`plan` has {len(plan.levels)} levels, the bundle {self.num_levels}. HINT: run "
                              f"`nestflex tune` on this bundle")
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise BundleError(f"`batch` must be an int >= 1 (the batch size the runtime will run), got {batch!r}")
        self.batch = batch
        self._plan_levels = None if plan is None else plan.for_batch(batch)
        self.set_level(level)

    def level_bytes(self, level: int) -> int:
        """Weight bytes level ``level`` keeps resident."""
        self._check_level(level)
        return self._store.level_bytes(level)

    @property
    def resident_bytes(self) -> int:
        """Weight bytes resident now: the paged tensors, or the onnxruntime session's copy when the
        level runs in one (its paged tensors are then released, and paged in again only if something
        runs the level eagerly, e.g. :meth:`split`)."""
        return self._store.resident_bytes + self._session_bytes

    def _check_level(self, level: int) -> None:
        if isinstance(level, bool) or not isinstance(level, int) or not 0 <= level < self.num_levels:
            raise BundleError(f"`level` must be an int in [0, {self.num_levels - 1}] (the bundle's levels), got "
                              f"{level!r}. HINT: bundle.levels lists them, smallest first")

    def set_level(self, level: int) -> PagingReport:
        """Make ``level`` resident: read the entries it adds, release the ones it drops.

        Returns:
            a :class:`PagingReport` (bytes in/out, seconds, resident bytes after).

        Raises:
            BundleError: ``level`` outside ``[0, num_levels)``.
        """
        self._check_level(level)
        start = time.perf_counter()
        backend = None
        if self.plan is not None:  # the level's execution configuration switches with it
            from nestflex.deploy.backends import resolve

            backend, threads = resolve(self._plan_levels[level])
            # the old level's session goes first: its memory, and its idle threads, which spin for a
            # while after each run and would take the cores this switch needs
            self._fn, self._session_bytes = self._eager, 0
        if backend is not None and backend.own_weights:  # the session holds the level: page nothing in
            page_in, page_out = 0, self._store.release(level)
        else:
            page_in, page_out = self._store.page(level)
        if backend is not None:
            try:
                self._fn = backend.prepare(self, level, threads)
            except Exception:  # keep serving the old level, eagerly, rather than a half-switched one
                self._fn, self.backend, self._session_bytes = self._eager, "eager", 0
                if self.level is not None:
                    self._store.page(self.level)
                raise
            self.backend = backend.name
            torch.set_num_threads(threads)
        seconds = time.perf_counter() - start
        self.last_report = PagingReport(self.level, level, page_in, page_out, seconds, self.resident_bytes)
        self.level = level
        return self.last_report

    @torch.no_grad()
    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """Logits of the resident level for a normalised batch ``(N, *input shape)``, run by the
        level's planned backend (eager without a plan)."""
        _check_input(x, self.bundle.input_spec, "CapacityRuntime")
        return self._fn(x)

    @torch.no_grad()
    def _eager(self, x: torch.Tensor) -> torch.Tensor:
        return run_program(self.nodes, {self.nodes[0].name: x}, self._store.tensors, self.level)

    def split(self, name: str) -> tuple[Callable[..., tuple[torch.Tensor, ...]], Callable[..., torch.Tensor]]:
        """Head and tail of the resident level cut at split point ``name`` (a node or layer name).

        ``tail(*head(x))`` equals ``self(x)``; the head returns every tensor that crosses the cut.

        Raises:
            BundleError: no such split point.
        """
        splits = self.bundle.spec.splits
        split = next((s for s in splits if name in (s.name, s.node)), None)
        if split is None:
            raise BundleError(f"no split point {name!r} in the bundle; split points: "
                              f"{', '.join(s.name for s in splits)}")
        (ins, head_nodes, outs), (_, tail_nodes, _) = cut_program(self.nodes, [split.node])
        return self._stage(ins, head_nodes, outs), self._stage(outs, tail_nodes, [])

    def _stage(self, inputs: list[str], nodes: list[Node], outputs: list[str]) -> Callable[..., Any]:
        @torch.no_grad()
        def run(*values: torch.Tensor) -> Any:
            env = dict(zip(inputs, values))
            result = run_program(nodes, env, self._store.tensors, self.level)
            return tuple(env[o] for o in outputs) if outputs else result

        return run


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
            head graphs) and which early exits are evaluated; ``None``: eager, every exit.
        active: the early exits to evaluate (indices in ``[0, num_exits - 1)``), overriding the
            plan's; a dropped exit's head never runs and its samples go on to the next kept exit.
            ``None``: the plan's choice, else all.

    Attributes:
        spec: the set's :class:`~nestflex.deploy.schema.ExitSet`.
        exits: the same as a dict (its manifest form).
        exit_set: the set's key, ``"exits"`` or ``"flex_exits"``.
        backend: the backend running the stages and heads.
        active: the early exits evaluated, ascending (all of them unless the plan or ``active`` says).

    Raises:
        BundleError: the bundle has no such exit set, or ``active`` names an exit it does not have.
    """

    def __init__(self, bundle: Bundle, capacity: CapacityRuntime | None = None, exit_set: str = "exits",
                 plan: Any = None, active: Sequence[int] | None = None) -> None:
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
                bundle.capacity(bundle.num_levels - 1, plan=None)  # exits run the eager program
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
            from nestflex.deploy.backends import resolve

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
        (:mod:`nestflex.deploy.fused_exits`) when the set's own confidence and fallback apply.
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


# --------------------------------------------------------------------------------------------
# shape inference at load time

#: the largest activation (elements per sample) a program may produce; far above any CNN this
#: runtime serves (VGG-16 at 32x32: 65,536), far below what would exhaust a device's memory
MAX_ACTIVATION_ELEMENTS = 2**26


def check_shapes(spec: Any) -> list[str]:
    """Run every program of a validated manifest on an empty batch: shapes only, nothing read or computed.

    The schema checks each field on its own; this checks that they fit together as a network
    before anything runs: every level of the capacity program, every exit set's stages and heads,
    and every split's head and tail must accept the declared input shape, end in ``(num_classes,)``
    logits per sample, and keep every activation under :data:`MAX_ACTIVATION_ELEMENTS` per sample (a stride,
    padding or kernel edited inside its range can still break a conv, or blow an activation up).

    The batch has 0 samples: torch's CPU kernels check every shape and allocate nothing for the
    activations. (Meta tensors would do too, but their decompositions import ``torch._dynamo`` on
    first use, which a light runtime should not pay for at load.) Weights are uninitialised
    tensors of their declared shapes, index tensors zeros (their values are checked apart).

    Returns:
        one line per problem (empty when the bundle is consistent).
    """
    table = spec.weights.tensors
    cap = spec.capacity
    want = (int(spec.num_classes),)
    problems: list[str] = []

    def meta(names: Sequence[str], level: int, regions: Mapping[str, Sequence[Region]]) -> dict[str, torch.Tensor]:
        out = {}
        for n in names:
            regs = regions.get(n)
            shape = table[n].shape if regs is None else regs[level]
            if shape is not None:
                dtype = getattr(torch, table[n].dtype)
                out[n] = torch.empty(tuple(shape), dtype=dtype) if dtype.is_floating_point else \
                    torch.zeros(tuple(shape), dtype=dtype)
        return out

    def run(where: str, nodes: Sequence[Node], inputs: list[str], values: tuple, tensors, level: int,
            outputs: list[str] | None = None) -> Any:
        env = dict(zip(inputs, values))
        error = None
        try:
            result = run_program(nodes, env, tensors, level)
        except Exception as e:  # a shape error names what torch refused
            error = f"{where} fails shape inference ({type(e).__name__}: {str(e).splitlines()[0][:200]})"
        # an oversized activation is the root cause when a later node then fails on it
        big = [(k, math.prod(v.shape[1:])) for k, v in env.items()
               if isinstance(v, torch.Tensor) and v.dim() > 0 and math.prod(v.shape[1:]) > MAX_ACTIVATION_ELEMENTS]
        if big:
            problems.append(f"{where}: node {big[0][0]!r} produces {big[0][1]:,} elements per sample, above "
                            f"{MAX_ACTIVATION_ELEMENTS:,}")
            return None
        if error is not None:
            problems.append(error)
            return None
        return tuple(env[o] for o in outputs) if outputs else result

    def ends_in_logits(where: str, out: Any) -> None:
        if out is None:  # it failed: run() reported why
            return
        if not isinstance(out, torch.Tensor):  # an output node with several args gives a tuple
            problems.append(f"{where} ends in {len(out) if isinstance(out, tuple) else type(out).__name__} outputs, "
                            f"expected one tensor of logits")
        elif tuple(out.shape[1:]) != want:
            problems.append(f"{where} ends in per-sample shape {tuple(out.shape[1:])}, expected {want}")

    x = torch.empty(0, *spec.input.shape)
    nodes = cap.program.nodes
    top = cap.num_levels - 1
    for level in range(cap.num_levels):
        out = run(f"capacity program at level {level}", nodes, [nodes[0].name], (x,),
                  meta(cap.program.tensor_names(), level, cap.regions), level)
        ends_in_logits(f"capacity program at level {level}", out)
    if problems:
        return problems  # stages and splits cut the same program: one report is enough
    top_tensors = meta(cap.program.tensor_names(), top, cap.regions)
    for s in spec.splits:
        (ins, head, outs), (_, tail, _) = cut_program(nodes, [s.node])
        crossing = run(f"split {s.name!r} head", head, ins, (x,), top_tensors, top, outs)
        if crossing is not None:
            run(f"split {s.name!r} tail", tail, outs, crossing, top_tensors, top)
    for ex in spec.exit_sets:
        if ex.backbone == "shared":
            backbone, level, tensors = nodes, top, top_tensors
        else:
            backbone, level, tensors = ex.program.nodes, 0, meta(ex.program.tensor_names(), 0, {})
        heads = meta(list(dict.fromkeys(t for h in ex.heads for t in h.program.tensor_names())), 0, {})
        state: tuple = (x,)
        for k, (ins, body, outs) in enumerate(cut_program(backbone, ex.taps)):
            result = run(f"{ex.kind} exits, stage {k}", body, ins, state, tensors, level, outs or None)
            if result is None:
                break
            if k < len(ex.heads):  # a stage hands its outputs on; its head reads the first
                state = result if isinstance(result, tuple) else (result,)
                head = ex.heads[k].program.nodes
                logits = run(f"{ex.kind} exit {k} head", head, [head[0].name], state[:1], heads, 0)
            else:
                logits = result
            ends_in_logits(f"{ex.kind} exit {k}", logits)
    return problems
