"""Runtimes for a loaded bundle: multi-capacity (paged levels) and progressive (batched early exit).

Backend: **torch eager over a small op program** read from the manifest. Each component
(backbone, exit head) is a :class:`~nestflex.deploy.bundle.schema.Program`: nodes (``conv2d``,
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
    rt = nd.CapacityRuntime(nd.load("bundle.nfx"), level=0)
    report = rt.set_level(2); report.page_in_bytes
    logits = rt(x)
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import torch

from nestflex.deploy.backends.eager import run_program
from nestflex.deploy.backends.plan import load_plan
from nestflex.deploy.bundle.loader import Bundle
from nestflex.deploy.bundle.program import Region, cut_program
from nestflex.deploy.bundle.schema import BundleError
from nestflex.deploy.bundle.schema import ProgramNode as Node

__all__ = ["PagingReport", "CapacityRuntime"]

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
        level: the level to make resident first (default: the largest).
        plan: an :class:`~nestflex.deploy.backends.ExecutionPlan`, ``None`` (eager everywhere), or
            ``"auto"``: the plan ``nestflex tune`` stored beside the bundle, if there is one.
        batch: the batch size it will mostly run: the plan's choices for that size
            (:meth:`~nestflex.deploy.backends.ExecutionPlan.for_batch`; batch 1's by default).

    Attributes:
        level: the resident level.
        num_levels: levels in the bundle.
        last_report: the :class:`PagingReport` of the latest switch (the initial load included).

    Example::

        rt = nd.CapacityRuntime(bundle, level=0)
        rt.set_level(1).page_in_bytes
    """

    def __init__(self, bundle: Bundle, level: int | None = None, plan: Any = "auto", batch: int = 1) -> None:
        cap = bundle.spec.capacity
        if isinstance(plan, str) and plan == "auto":
            plan = load_plan(bundle)
        if level is None:
            level = cap.num_levels - 1
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
            from nestflex.deploy.backends.plan import resolve

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
