"""A level's weights, read from the bundle's safetensors file: numpy arrays, paged per level.

A nested layer's weight is one full tensor in nested order; level ``k`` computes with a prefix of
it (the manifest's ``regions`` give the prefix shape per level, ``None`` when a level does not use
a tensor at all, e.g. another level's BatchNorm). :class:`WeightStore` keeps exactly the entries
one level uses: an upgrade reads from the (memory-mapped) file only the entries the new level adds
(the prefix box minus the resident one, as at most one box per dimension), a downgrade copies the
smaller prefix and drops the rest. :func:`level_tensors` reads one level's tensors once (what a
graph writer needs).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
from safetensors import safe_open

from nestflex.deploy.bundle.program import Region

__all__ = ["WeightStore", "level_tensors"]


def _dtype(name: str) -> np.dtype:
    """numpy's dtype for a safetensors dtype name (the schema admits float and integer types only)."""
    return np.dtype(name)


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


class WeightStore:
    """The tensors one level uses (numpy), read from the bundle's safetensors file on demand.

    :meth:`release` drops every tensor but remembers the level: a level that runs elsewhere (an
    onnxruntime session holds its own copy) keeps nothing here, and the first eager use
    (:attr:`tensors`: a split, an eager exit head) pages the level in again.
    """

    def __init__(self, bundle: Any, names: Sequence[str], regions: Mapping[str, Sequence[Region]], levels: int) -> None:
        table = bundle.spec.weights.tensors  # the schema checked that every program tensor is here
        self.file = safe_open(str(bundle.weights_path), framework="numpy")
        self.dtypes = {n: _dtype(table[n].dtype) for n in names}
        self.regions = {n: [None if r is None else list(r) for r in regions[n]] if n in regions
                        else [list(table[n].shape)] * levels for n in names}
        self._tensors: dict[str, np.ndarray] = {}
        self.level: int | None = None  # the level the resident tensors hold
        self.wanted: int | None = None  # the level asked for (differs after release())

    @property
    def tensors(self) -> dict[str, np.ndarray]:
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
        return sum(t.nbytes for t in self._tensors.values())

    def page(self, level: int) -> tuple[int, int]:
        page_in = page_out = 0
        tensors = self._tensors
        for name, regs in self.regions.items():
            old = tensors.get(name)
            new_shape = regs[level]
            size = self.dtypes[name].itemsize
            if new_shape is None:
                if old is not None:
                    page_out += old.size * size
                    del tensors[name]
                continue
            if old is not None and list(old.shape) == new_shape:
                continue
            if not new_shape:  # a scalar
                tensors[name] = np.asarray(self.file.get_tensor(name))
                page_in += size
                continue
            inter = [min(a, b) for a, b in zip(old.shape, new_shape)] if old is not None else [0] * len(new_shape)
            region = tuple(slice(0, s) for s in inter)
            if old is not None and inter == new_shape:  # a pure downgrade: keep a compact copy of the prefix
                fresh = old[region].copy()
            else:
                fresh = np.empty(new_shape, dtype=self.dtypes[name])
                if old is not None:
                    fresh[region] = old[region]
                view = self.file.get_slice(name)
                for box in _delta_boxes(inter, new_shape):
                    part = view[box]
                    fresh[box] = part
                    page_in += part.size * size
            if old is not None:
                kept = 1
                for s in inter:
                    kept *= s
                page_out += (old.size - kept) * size
            tensors[name] = fresh
        self.level = self.wanted = level
        return page_in, page_out


def level_tensors(bundle: Any, level: int, names: Sequence[str] | None = None,
                  regions: Mapping[str, Sequence[Region]] | None = None, levels: int | None = None) -> dict[str, np.ndarray]:
    """The tensors ``names`` (default: the capacity program's) cut to ``level``'s region, read once.

    ``regions``/``levels`` default to the capacity program's; an exit set's own backbone or a
    head passes its names with no regions (every level reads the whole tensor).
    """
    cap = bundle.spec.capacity
    names = cap.program.tensor_names() if names is None else list(names)
    regions = cap.regions if regions is None else regions
    store = WeightStore(bundle, names, regions, cap.num_levels if levels is None else levels)
    store.page(level)
    return store.tensors
