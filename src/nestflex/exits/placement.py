"""Where exits go: fractions of the backbone's MACs (SPINN's equal spacing) or named layers.

Exits attach at the backbone's split points (:attr:`StructureGraph.split_points`: ReLU outputs,
found by tracing; on transformers the residual token stream after each block). A fraction ``f`` picks the split point whose ``macs_fraction`` (MACs up to and
including it / all MACs) is closest to ``f``; a name picks that split point. Split points sit
after every conv (or residual add) followed by a ReLU, so the chosen point is at most one layer
away from the requested fraction. Where two fractions would share a split point (backbones with
few activations), the closest assignment of distinct split points is used (see
:func:`resolve_positions`). The default positions (``positions=None``) are SPINN's six where the
backbone has room for them, else one exit at every place it has, with a warning
(:func:`default_positions`).

Examples:
    >>> from nestflex.graph import trace
    >>> from nestflex.models import create_model
    >>> points = resolve_positions(trace(create_model("vgg16")), (0.15, 0.3, "features.relu10"))
    >>> [p.name for p in points]
    ['features.relu2', 'features.relu4', 'features.relu10']
"""

from __future__ import annotations

import warnings
from typing import Sequence, Union

from nestflex.deploy.exits import ExitError
from nestflex.graph import SplitPoint, StructureGraph

__all__ = ["ALL", "DEFAULT_POSITIONS", "Position", "check_positions", "default_positions", "parse_positions",
           "resolve_positions"]

#: SPINN: six exits at 15%, 30%, ..., 90% of the backbone's MACs.
DEFAULT_POSITIONS: tuple[float, ...] = (0.15, 0.30, 0.45, 0.60, 0.75, 0.90)

#: The position list ``("all",)`` (``--flex-positions all``): every split point with a feature map,
#: one exit after every layer (FlexDNN's search inserts candidates "at each layer").
ALL = "all"

Position = Union[float, str]


def check_positions(positions: Sequence[Position]) -> list[Position]:
    """Validate exit positions without a model: fractions in (0, 1) or names, no duplicates.

    Raises:
        ExitError: empty, a fraction outside (0, 1), something neither a number nor a name, a
            duplicate, or ``"all"`` beside other positions.
    """
    if isinstance(positions, (str, float, int)) or not isinstance(positions, Sequence) or len(positions) == 0:
        raise ExitError(
            f"`positions` must be a non-empty sequence of MACs fractions in (0, 1) or layer names, got {positions!r}. "
            f"HINT: the SPINN default is {list(DEFAULT_POSITIONS)}; [{ALL!r}] puts one after every layer"
        )
    if ALL in positions and len(positions) > 1:
        raise ExitError(f"`positions` {list(positions)!r}: {ALL!r} means every split point and stands alone. "
                        f"HINT: pass [{ALL!r}] or list the positions")
    out: list[Position] = []
    for i, p in enumerate(positions):
        if isinstance(p, str):
            if not p:
                raise ExitError(f"`positions[{i}]` is an empty layer name")
        elif isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 < float(p) < 1.0:
            raise ExitError(
                f"`positions[{i}]` must be a MACs fraction in (0, 1) (exclusive) or a layer name, got {p!r}. "
                f"HINT: 0.5 puts an exit halfway through the backbone's MACs; the final exit is always there"
            )
        else:
            p = float(p)
        if p in out:
            raise ExitError(
                f"`positions` has the duplicate {p!r} (at index {i}); every exit needs its own position"
            )
        out.append(p)
    return out


def parse_positions(text: str) -> list[Position]:
    """Positions from a comma list (a command-line flag): numbers become fractions, the rest names.

    Examples:
        >>> parse_positions("0.15, 0.3,features.relu10")
        [0.15, 0.3, 'features.relu10']
    """
    out: list[Position] = []
    for item in (s.strip() for s in text.split(",")):
        try:
            out.append(float(item))
        except ValueError:
            out.append(item)
    return check_positions(out)


def _is_place(point: SplitPoint) -> bool:
    """An exit can read the point's tensor: a ``(C, H, W)`` map, or a transformer's stream after a
    block (``(T, C)`` tokens, ``(H, W, C)`` channels-last), as its layout says."""
    shape = _tap_shape(point)
    layout = getattr(point, "layout", "channels_first")
    return shape is not None and len(shape) == (2 if layout == "tokens" else 3)


def _places(graph: StructureGraph) -> list[SplitPoint]:
    """The split points an exit can attach to: feature maps and token streams (:func:`_is_place`)."""
    candidates = [p for p in graph.split_points if _is_place(p)]
    if not candidates:
        raise ExitError(
            f"the backbone has no split point with a (C, H, W) feature map or a token stream to attach exits to "
            f"(split points: {[p.name for p in graph.split_points]}). HINT: exits attach at activation outputs of "
            f"convolutions and after transformer blocks"
        )
    return candidates


def default_positions(graph: StructureGraph) -> list[Position]:
    """The default exit positions for a backbone: SPINN's six where they fit, else as many as fit.

    A backbone with fewer places for exits than :data:`DEFAULT_POSITIONS` (a small CNN of five
    conv layers has five) gets an exit at each place it has (as many as fit: ``n`` exits spread
    evenly in its MACs land on its ``n`` places), and a ``UserWarning`` that says so; positions
    passed explicitly never shrink like this (:func:`resolve_positions` refuses too many).

    Args:
        graph: the backbone's structure graph (:func:`nestflex.graph.trace`).

    Returns:
        :data:`DEFAULT_POSITIONS` (MACs fractions), or the names of all the backbone's places
        for exits, in execution order.

    Raises:
        ExitError: a backbone with no place for an exit at all.

    Examples:
        >>> from nestflex.graph import trace
        >>> from nestflex.models import create_model
        >>> default_positions(trace(create_model("vgg11", width=0.25)))
        [0.15, 0.3, 0.45, 0.6, 0.75, 0.9]
    """
    places = _places(graph)
    if len(places) >= len(DEFAULT_POSITIONS):
        return list(DEFAULT_POSITIONS)
    where = ", ".join(f"{p.name} ({p.macs_fraction:.0%})" for p in places)
    warnings.warn(
        f"the backbone has {len(places)} places for exits, fewer than the {len(DEFAULT_POSITIONS)} default positions "
        f"(SPINN's {list(DEFAULT_POSITIONS)} of the MACs): placing {len(places)} exits, one at each place (at its "
        f"share of the MACs): {where}. HINT: pass `positions` (MACs fractions or split point names) to choose them",
        UserWarning, stacklevel=2)
    return [p.name for p in places]


def resolve_positions(graph: StructureGraph, positions: Sequence[Position] | None = None) -> list[SplitPoint]:
    """The split point of every exit position, in execution order.

    Fractions go to the nearest split point. When two fractions would share one (a backbone with
    few activations, e.g. VGG-11), the assignment that minimises the total distance
    ``sum |macs_fraction - requested|`` over distinct, increasing split points is used instead;
    :attr:`MultiExitNetwork.positions` reports where exits actually are.

    Args:
        graph: the backbone's structure graph (:func:`nestflex.graph.trace`).
        positions: MACs fractions in (0, 1) and/or split point names (module or fx node names),
            in increasing order; or ``[ALL]``, every split point with a feature map; ``None``:
            :func:`default_positions` (SPINN's six, or as many as the backbone has places for).

    Returns:
        one :class:`SplitPoint` per position.

    Raises:
        ExitError: invalid positions (see :func:`check_positions`), an unknown name, a split
            point whose activation is neither a ``(C, H, W)`` feature map nor a token stream, positions out of execution
            order, or more positions than the backbone has places for.

    Examples:
        >>> from nestflex.graph import trace
        >>> from nestflex.models import create_model
        >>> [p.name for p in resolve_positions(trace(create_model("resnet20")), [0.5, "layer3.2.relu2"])]
        ['layer2.1.relu1', 'layer3.2.relu2']
    """
    if positions is None:
        positions = default_positions(graph)
    checked = check_positions(positions)
    candidates = _places(graph)
    if checked == [ALL] and not any(ALL in (p.name, p.node) for p in graph.split_points):
        return candidates
    fixed: dict[int, int] = {}  # position index -> candidate index, for names
    for i, pos in enumerate(checked):
        if not isinstance(pos, str):
            continue
        point = next((p for p in graph.split_points if pos in (p.name, p.node)), None)
        if point is None:
            names = [p.name for p in candidates]
            shown = ", ".join(names[:12]) + (f", ... ({len(names)} in all)" if len(names) > 12 else "")
            raise ExitError(
                f"`positions[{i}]`: no split point named `{pos}`; exits attach at activation outputs: {shown}. "
                f"HINT: `nestflex.graph.trace(model).split_points` lists them, or pass a MACs fraction"
            )
        if point not in candidates:
            raise ExitError(
                f"`positions[{i}]`: split point `{pos}` has per-sample shape {_tap_shape(point)}, "
                f"not a (C, H, W) feature map or a transformer's token stream. HINT: choose a convolutional "
                f"activation or a transformer block's end"
            )
        fixed[i] = candidates.index(point)
    # requested order must be execution order: names among themselves, fractions among themselves,
    # and each fraction against the names around it
    keys = [candidates[fixed[i]].macs_fraction if i in fixed else float(p) for i, p in enumerate(checked)]
    for i in range(1, len(checked)):
        if keys[i] < keys[i - 1] or (i in fixed and i - 1 in fixed and fixed[i] < fixed[i - 1]):
            raise ExitError(
                f"`positions` must follow execution order: `positions[{i}]`={checked[i]!r} comes before "
                f"`positions[{i - 1}]`={checked[i - 1]!r}. HINT: sort them"
            )
    if len(checked) > len(candidates):
        raise ExitError(
            f"{len(checked)} exit positions but the backbone has only {len(candidates)} places for exits "
            f"({', '.join(p.name for p in candidates)}). HINT: pass fewer positions"
        )
    chosen = _assign(checked, fixed, candidates)
    if chosen is None:
        raise ExitError(
            f"`positions` {checked!r} cannot each get their own split point in execution order "
            f"(the backbone has {len(candidates)}: {', '.join(p.name for p in candidates)}). "
            f"HINT: use fewer or more widely spaced positions"
        )
    return [candidates[j] for j in chosen]


def _assign(checked: list[Position], fixed: dict[int, int], candidates: list[SplitPoint]) -> list[int] | None:
    """Distinct increasing candidate indices minimising total |fraction - requested| (DP, O(m n))."""
    inf = float("inf")
    m, n = len(checked), len(candidates)

    def cost(i: int, j: int) -> float:
        if i in fixed:
            return 0.0 if fixed[i] == j else inf
        # ties: prefer the earlier split point (cheaper exit)
        return abs(candidates[j].macs_fraction - float(checked[i])) + 1e-12 * j

    # best[i][j]: min cost of placing positions 0..i with position i at candidate j
    best = [[inf] * n for _ in range(m)]
    back = [[-1] * n for _ in range(m)]
    for j in range(n):
        best[0][j] = cost(0, j)
    for i in range(1, m):
        run, arg = inf, -1  # min of best[i-1][0..j-1]
        for j in range(n):
            if j > 0 and best[i - 1][j - 1] < run:
                run, arg = best[i - 1][j - 1], j - 1
            if run < inf:
                c = cost(i, j)
                if run + c < best[i][j]:
                    best[i][j], back[i][j] = run + c, arg
    j = min(range(n), key=lambda k: best[m - 1][k])
    if best[m - 1][j] == inf:
        return None
    out = [j]
    for i in range(m - 1, 0, -1):
        j = back[i][j]
        out.append(j)
    return out[::-1]


def _tap_shape(point: SplitPoint) -> tuple[int, ...] | None:
    return next((shape for name, shape in point.tensors if name == point.node), None)
