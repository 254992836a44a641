"""Nested (multi-capacity) layers: every weight stored once, level ``k`` reads a width prefix.

:func:`nest_` turns a plain network (convs, linears, BatchNorms) into a multi-capacity one *in
place*: each conv/linear keeps one full-size weight whose channels are in nested order and, at
level ``k``, computes with ``weight[:out_k, :in_k]``; each BatchNorm becomes a
:class:`NestedNorm` holding one small BatchNorm per level (switchable BN, Yu et al. 2019), because
a channel's statistics at level ``k`` depend on the input channels level ``k`` adds. Switching
level (:func:`set_level`) flips an integer on every nested layer: nothing is copied.

Module names and conv/linear parameter names do not change, so optimizers and Lightning
checkpoints keep working; BatchNorm tensors move to ``<bn>.levels.<k>.<name>``.

``trace`` sees nested convs/linears as ordinary layers at full width; for a plain model of one
level (tracing, export, MACs) use :func:`extract_level`.
"""

from __future__ import annotations

import copy
from typing import Iterator, Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from nestflex.capacity.levels import LevelPlan
from nestflex.errors import CapacityError
from nestflex.graph import trace

__all__ = [
    "NestedConv2d",
    "NestedLinear",
    "NestedNorm",
    "Source",
    "nest_",
    "set_level",
    "get_level",
    "num_levels",
    "is_nested",
    "nested_modules",
    "level_regions",
    "extract_level",
]

Region = tuple[slice, ...] | None  # None: the tensor is not used at that level


class _Nested:
    """Marker + level state shared by the nested layers."""

    level: int = 0
    nest_out: tuple[int, ...] = ()
    nest_in: tuple[int, ...] = ()


class NestedConv2d(nn.Conv2d, _Nested):
    """A Conv2d that computes with ``weight[:nest_out[level], :nest_in[level]]``."""

    depthwise: bool = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        o = self.nest_out[self.level]
        if self.depthwise:
            w, groups = self.weight[:o], o
        else:
            w, groups = self.weight[:o, : self.nest_in[self.level] // self.groups], self.groups
        b = self.bias[:o] if self.bias is not None else None
        return F.conv2d(x, w, b, self.stride, self.padding, self.dilation, groups)

    def regions(self, levels: int) -> dict[str, list[Region]]:
        out = {}
        for k in range(levels):
            o = slice(0, self.nest_out[k])
            w = (o,) if self.depthwise else (o, slice(0, self.nest_in[k] // self.groups))
            out.setdefault("weight", []).append(w)
            if self.bias is not None:
                out.setdefault("bias", []).append((o,))
        return out


class NestedLinear(nn.Linear, _Nested):
    """A Linear that computes with ``weight[:nest_out[level], :nest_in[level]]``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        o, i = self.nest_out[self.level], self.nest_in[self.level]
        return F.linear(x, self.weight[:o, :i], self.bias[:o] if self.bias is not None else None)

    def regions(self, levels: int) -> dict[str, list[Region]]:
        out = {}
        for k in range(levels):
            out.setdefault("weight", []).append((slice(0, self.nest_out[k]), slice(0, self.nest_in[k])))
            if self.bias is not None:
                out.setdefault("bias", []).append((slice(0, self.nest_out[k]),))
        return out


class NestedNorm(nn.Module, _Nested):
    """Switchable BatchNorm: one BatchNorm per level (``levels[k]`` has level ``k``'s width).

    Level ``k``'s affine parameters and running statistics are its own, so training a larger
    level never touches what a smaller level computes with.

    Args:
        norms: one BatchNorm per level, smallest level first; ``norms[k]`` has level ``k``'s
            width (its number of features).
    """

    def __init__(self, norms: Sequence[nn.Module]) -> None:
        super().__init__()
        self.levels = nn.ModuleList(norms)
        self.nest_out = self.nest_in = tuple(_norm_width(n) for n in norms)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.levels[self.level](x)

    def regions(self, levels: int) -> dict[str, list[Region]]:
        out: dict[str, list[Region]] = {}
        for i, norm in enumerate(self.levels):
            for name, _ in norm.named_parameters():
                out[f"levels.{i}.{name}"] = [(slice(None),) if k == i else None for k in range(levels)]
        return out


def _norm_width(norm: nn.Module) -> int:
    ref = norm.weight if getattr(norm, "weight", None) is not None else norm.running_mean
    return int(ref.shape[0])


class Source:
    """Where one level's weights come from: a state dict and its kept channels.

    Args:
        state: tensors by the *plain* model's names (pruned shapes allowed).
        kept: per group name, the original channels the state's tensors hold, in their order;
            a group not listed holds every channel.
    """

    def __init__(self, state: Mapping[str, torch.Tensor], kept: Mapping[str, Sequence[int]] | None = None) -> None:
        self.state, self.kept = state, dict(kept or {})


def _rows(idx: list[int], factor: int) -> torch.Tensor:
    t = torch.as_tensor(idx, dtype=torch.long)
    return (t[:, None] * factor + torch.arange(factor)).flatten()


def nest_(
    model: nn.Module,
    plan: LevelPlan,
    sources: Sequence[Source],
    input_shape: Sequence[int] | None = None,
) -> nn.Module:
    """Turn the unpruned ``model`` into a multi-capacity model in place.

    Channels of every group in ``plan`` are laid out in ``plan.order``; level ``k`` uses the
    first ``plan.widths[k][g]`` of them. Weights come from ``sources`` (one per level): a
    tensor entry used by level ``k`` but by no smaller level takes its value from
    ``sources[k]``. Level 0 is active afterwards.

    Args:
        model: the unpruned network to nest (modified in place).
        plan: the nested channel order and per-level widths
            (:func:`~nestflex.capacity.levels.plan_levels`).
        sources: where each level's weights come from, one :class:`Source` per level,
            level 0 first.
        input_shape: per-sample input shape for tracing ``model``; default: the model's own
            (:func:`nestflex.graph.input_shape_of`).

    Returns:
        ``model`` itself, now nested, at level 0.

    Raises:
        CapacityError: ``model`` is already nested, ``sources`` does not have one entry per
            level, the model does not match the plan (missing group, other width), a layer
            type nested layers do not support, or a source tensor of the wrong shape.

    Examples:
        >>> from nestflex.models import create_model
        >>> from nestflex.capacity.levels import LevelPlan
        >>> net = create_model("vgg11", width=0.125)
        >>> g = "features.conv1"
        >>> plan = LevelPlan((1, 0), {g: list(range(8))}, ({g: 4}, {g: 8}), (1, 2))
        >>> own = Source(net.state_dict())
        >>> _ = nest_(net, plan, [own, own])
        >>> net.features.conv1.weight.shape[0], net.features.conv1.nest_out
        (8, (4, 8))
    """
    if is_nested(model):
        raise CapacityError(f"{type(model).__name__} is already nested")
    if len(sources) != plan.num_levels:
        raise CapacityError(f"`sources` must have one entry per level ({plan.num_levels}), got {len(sources)}")
    graph = trace(model, input_shape)
    groups = {g.name: g for g in graph.groups}
    for name, order in plan.order.items():
        if name not in groups:
            raise CapacityError(
                f"the plan grows group {name!r}, which {type(model).__name__} does not have (groups: "
                f"{', '.join(groups)}). HINT: the roadmap comes from another model"
            )
        if groups[name].width != len(order):
            raise CapacityError(
                f"group {name!r} has {groups[name].width} channels, the plan expects {len(order)} (unpruned). "
                "HINT: pass a freshly built, unpruned model of the roadmap's architecture"
            )
    K = plan.num_levels

    def width(g, k: int) -> int:
        return plan.widths[k][g.name] if g.name in plan.order else g.width

    def positions(g, k: int) -> list[int]:
        """Indices into source k's tensors of level k's channels, in nested order."""
        order = plan.order.get(g.name, list(range(g.width)))[: width(g, k)]
        kept = sources[k].kept.get(g.name) if g.name in plan.order else None
        if kept is None:
            return order
        where = {c: i for i, c in enumerate(kept)}
        missing = [c for c in order if c not in where]
        if missing:
            raise CapacityError(f"source of level {k} lacks channels {missing[:5]} of group {g.name!r}")
        return [where[c] for c in order]

    # (module, attr) -> {dim: (group, factor)}
    dims: dict[tuple[str, str], dict[int, tuple]] = {}
    roles: dict[str, set[str]] = {}
    for g in graph.groups:
        for m in g.members:
            if m.layout is not None and g.name in plan.order:
                raise CapacityError(
                    f"group {g.name!r} reaches `{m.module}` through a concatenation ({m.layout}); nested "
                    "levels slice each layer's channels as one prefix, which a concatenated dim is not. HINT: "
                    "grow levels of models without channel concatenation, or prune such a model to one size"
                )
            if m.copies > 1 and g.name in plan.order:
                raise CapacityError(
                    f"group {g.name!r} is interleaved ({m.copies} blocks at `{m.module}`: a grouped conv, or the q, k, "
                    "v of attention heads); nested levels slice each layer's channels as one prefix, which the "
                    "blocks are not. HINT: grow levels of models without grouped convs or pruned heads, or prune "
                    "such a model to one size"
                )
            dims.setdefault((m.module, m.attr), {})[m.dim] = (g, m.factor)
            roles.setdefault(m.module, set()).add(m.role)

    def gather(key: str, k: int, spec: dict[int, tuple], full_shape) -> torch.Tensor:
        if key not in sources[k].state:
            raise CapacityError(f"the weights of level {k} have no tensor {key!r}")
        val = sources[k].state[key]
        for dim, (g, f) in spec.items():
            val = val.index_select(dim, _rows(positions(g, k), f).to(val.device))
        want = [full_shape[d] if d not in spec else width(spec[d][0], k) * spec[d][1] for d in range(len(full_shape))]
        if list(val.shape) != want:
            raise CapacityError(
                f"level {k}'s tensor {key!r} has shape {tuple(sources[k].state[key].shape)}, which does not fit "
                f"the plan (expected {tuple(want)} after selecting its channels). HINT: the checkpoint and the "
                "roadmap come from different runs"
            )
        return val

    for name, module in list(model.named_modules()):
        if name not in roles:
            continue
        if isinstance(module, _BatchNorm):
            spec_of = {a: dims.get((name, a), {}) for a in ("weight", "bias", "running_mean", "running_var")}
            norms = []
            for k in range(K):
                norm = copy.deepcopy(module)
                for attr, spec in spec_of.items():
                    t = getattr(module, attr, None)
                    if t is None:
                        continue
                    val = gather(f"{name}.{attr}", k, spec, t.shape).detach().clone().to(t.dtype)
                    if isinstance(t, nn.Parameter):
                        setattr(norm, attr, nn.Parameter(val, requires_grad=t.requires_grad))
                    else:
                        norm._buffers[attr] = val
                if getattr(module, "num_batches_tracked", None) is not None and f"{name}.num_batches_tracked" in sources[k].state:
                    norm.num_batches_tracked = sources[k].state[f"{name}.num_batches_tracked"].clone()
                norm.num_features = _norm_width(norm)
                norms.append(norm)
            nested = NestedNorm(norms)
            _set_submodule(model, name, nested)
            continue
        if type(module) not in (nn.Conv2d, nn.Linear):
            raise CapacityError(
                f"`{name}` ({type(module).__name__}) carries nested channels, but only nn.Conv2d, nn.Linear and "
                "BatchNorm layers can be nested"
            )
        if isinstance(module, nn.Conv2d) and module.padding_mode != "zeros":
            raise CapacityError(f"`{name}` uses padding_mode={module.padding_mode!r}; nested convs support 'zeros' only")
        for attr in ("weight", "bias"):
            p = getattr(module, attr, None)
            if p is None:
                continue
            spec = dims.get((name, attr), {})
            full = torch.empty_like(p.detach())
            for k in reversed(range(K)):  # smaller levels overwrite the prefix they own
                region = tuple(slice(0, width(spec[d][0], k) * spec[d][1]) if d in spec else slice(None) for d in range(p.dim()))
                full[region] = gather(f"{name}.{attr}", k, spec, p.shape).to(p.dtype)
            p.data = full
        w_spec = dims.get((name, "weight"), {})
        depthwise = "depthwise" in roles[name]

        def widths_of(dim: int, size: int) -> tuple[int, ...]:
            if dim not in w_spec:
                return (size,) * K
            g, f = w_spec[dim]
            return tuple(width(g, k) * f for k in range(K))

        out_w = widths_of(0, module.weight.shape[0])
        if isinstance(module, nn.Conv2d):
            module.__class__ = NestedConv2d
            module.depthwise = depthwise
            in_w = out_w if depthwise else widths_of(1, module.in_channels)
            if not depthwise and module.groups > 1 and in_w != (module.in_channels,) * K:
                raise CapacityError(f"`{name}` is a grouped conv on nested channels; it cannot be nested")
        else:
            module.__class__ = NestedLinear
            in_w = widths_of(1, module.in_features)
        module.nest_out, module.nest_in = out_w, in_w
    leftover = [n for n, m in model.named_modules() if isinstance(m, _BatchNorm) and not _inside_nested_norm(model, n)]
    if leftover:
        raise CapacityError(
            f"BatchNorm layers {leftover} are not in any channel group, so their statistics would be shared by "
            "every level. HINT: the model has an op the graph cannot see through before them"
        )
    set_level(model, 0)
    return model


def _inside_nested_norm(model: nn.Module, name: str) -> bool:
    parts = name.split(".")
    return any(isinstance(model.get_submodule(".".join(parts[:i])), NestedNorm) for i in range(1, len(parts)))


def _set_submodule(model: nn.Module, name: str, new: nn.Module) -> None:
    parent, _, attr = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, attr, new)


def nested_modules(model: nn.Module) -> Iterator[tuple[str, nn.Module]]:
    """``(name, module)`` of every nested layer."""
    return ((n, m) for n, m in model.named_modules() if isinstance(m, _Nested))


def is_nested(model: nn.Module) -> bool:
    """Whether ``model`` has any nested layer (is a multi-capacity model).

    Args:
        model: the network to check.
    """
    return any(True for _ in nested_modules(model))


def num_levels(model: nn.Module) -> int:
    """Number of levels of a nested model (0 if it is not nested).

    Args:
        model: the network to inspect.
    """
    return max((len(m.nest_out) for _, m in nested_modules(model)), default=0)


def get_level(model: nn.Module) -> int:
    """The active level of a nested model.

    Args:
        model: a nested (multi-capacity) model.

    Raises:
        CapacityError: ``model`` is not nested.
    """
    for _, m in nested_modules(model):
        return m.level
    raise CapacityError(f"{type(model).__name__} is not a multi-capacity model. HINT: build it with nest_()")


def set_level(model: nn.Module, level: int) -> nn.Module:
    """Make every nested layer compute at ``level`` (cheap: sets an int per layer).

    Args:
        model: a nested (multi-capacity) model.
        level: the level to activate, ``0`` (the seed) to ``num_levels(model) - 1``.

    Returns:
        ``model`` itself.

    Raises:
        CapacityError: ``level`` outside ``[0, num_levels)``, or a model that is not nested.
    """
    k = num_levels(model)
    if k == 0:
        raise CapacityError(f"{type(model).__name__} is not a multi-capacity model. HINT: build it with nest_()")
    if not isinstance(level, int) or isinstance(level, bool) or not 0 <= level < k:
        raise CapacityError(f"`level` must be an int in [0, {k - 1}], got {level!r}")
    for _, m in nested_modules(model):
        m.level = level
    return model


def level_regions(model: nn.Module) -> dict[str, list[Region]]:
    """For every parameter, the slice each level computes with (``None``: unused at that level).

    Parameters outside nested layers are used whole by every level.

    Args:
        model: a nested (multi-capacity) model.

    Returns:
        Per parameter name, one region per level: a tuple of slices into the parameter, or
        ``None`` where that level does not use it.
    """
    K = num_levels(model)
    out: dict[str, list[Region]] = {}
    for name, m in nested_modules(model):
        for attr, regions in m.regions(K).items():
            out[f"{name}.{attr}" if name else attr] = regions
    for name, _ in model.named_parameters():
        out.setdefault(name, [(slice(None),)] * K)
    return out


def extract_level(model: nn.Module, level: int) -> nn.Module:
    """A plain copy of the network at ``level``: ordinary, contiguous Conv2d/Linear/BatchNorm.

    Its outputs equal the multi-capacity model's at ``level``; trace it for MACs and params, or
    export it. The multi-capacity model is left as it was.

    Args:
        model: a nested (multi-capacity) model.
        level: the level to extract, ``0`` to ``num_levels(model) - 1``.

    Raises:
        CapacityError: ``model`` is not nested, or ``level`` is out of range.
    """
    current = get_level(model)
    set_level(model, level)
    try:
        plain = copy.deepcopy(model)
    finally:
        set_level(model, current)
    for name, m in list(nested_modules(plain)):
        if isinstance(m, NestedNorm):
            new = m.levels[level]
        elif isinstance(m, NestedConv2d):
            o = m.nest_out[level]
            i = o if m.depthwise else m.nest_in[level]
            new = nn.Conv2d(i, o, m.kernel_size, m.stride, m.padding, m.dilation, o if m.depthwise else m.groups,
                            m.bias is not None, device=m.weight.device, dtype=m.weight.dtype)
            with torch.no_grad():
                new.weight.copy_(m.weight[:o] if m.depthwise else m.weight[:o, : i // m.groups])
                if m.bias is not None:
                    new.bias.copy_(m.bias[:o])
        else:
            o, i = m.nest_out[level], m.nest_in[level]
            new = nn.Linear(i, o, m.bias is not None, device=m.weight.device, dtype=m.weight.dtype)
            with torch.no_grad():
                new.weight.copy_(m.weight[:o, :i])
                if m.bias is not None:
                    new.bias.copy_(m.bias[:o])
        new.train(m.training)
        if name:
            _set_submodule(plain, name, new)
        else:
            plain = new
    return plain
