"""What FilterPruning's budget mode counts: MACs (``target_macs``) or a cost model's units (``target_cost``).

Both budgets run the same way (every step kept, the last one scaled to land at the target,
:func:`~nestflex.pruning.budget_scale`); only the measure differs. :class:`Budget` is that
measure, so the callback has one code path for both.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from nestflex.errors import PruningError
from nestflex.graph import StructureGraph
from nestflex.pruning.cost import CostModel
from nestflex.pruning.roadmap import Footprint
from nestflex.pruning.step import budget_limit, budget_reached

__all__ = ["COST_DIGITS", "Budget", "make_budget"]

#: decimals a footprint's cost is recorded with; the budget prices steps the same way, so the step
#: that lands at the target is also recorded at or below it
COST_DIGITS = 6
#: the budget mode's name (the roadmap's ``mode``) -> the FilterPruning argument that asks for it
BUDGET_ARGS = {"macs": "target_macs", "cost": "target_cost"}


@dataclass(frozen=True)
class Budget:
    """At most ``target`` of the starting model's MACs (``mode`` ``macs``) or of its cost under
    ``cost`` (``mode`` ``cost``, e.g. milliseconds from a latency table).

    Examples:
        >>> from nestflex.graph import trace
        >>> from nestflex.models import create_model
        >>> g = trace(create_model("vgg11", width=0.125))
        >>> b = Budget("macs", 0.5)
        >>> (b.arg, b.unit, b.price(g) == g.macs(), b.limit(1000))
        ('target_macs', 'MACs', True, 500)
    """

    mode: str
    target: float
    cost: CostModel | None = None

    @property
    def arg(self) -> str:
        """The FilterPruning argument that set it, for messages."""
        return BUDGET_ARGS[self.mode]

    @property
    def unit(self) -> str:
        return "MACs" if self.mode == "macs" else self.cost.unit

    def price(self, graph: StructureGraph, widths: Mapping[int, int] | None = None) -> float:
        """The model's MACs, or its cost rounded as its footprint will record it."""
        if self.mode == "macs":
            return graph.macs(widths)
        return round(float(self.cost(graph, widths)), COST_DIGITS)

    def of(self, footprint: Footprint) -> float:
        """What a recorded footprint spends."""
        return footprint.macs if self.mode == "macs" else footprint.cost

    def limit(self, start: float) -> float:
        """The most the budget allows a model whose start spent ``start``."""
        return budget_limit(start, self.target)

    def reached(self, footprint: Footprint, start: Footprint) -> bool:
        return budget_reached(self.of(footprint), self.limit(self.of(start)))

    def share(self, footprint: Footprint, start: Footprint) -> float:
        """The footprint's share of the start's MACs or cost."""
        return self.of(footprint) / self.of(start)

    def amount(self, value: float) -> str:
        """``value`` for a log line: MACs with thousands separators, a cost to 4 significant digits."""
        return f"{value:,}" if self.mode == "macs" else f"{value:.4g}"

    def describe(self) -> str:
        """``"the MACs"`` or ``"the latency cost"``, for log lines."""
        return "the MACs" if self.mode == "macs" else f"the {self.cost.name} cost"


def make_budget(target_macs: float | None, target_cost: float | None, cost: CostModel | None) -> Budget | None:
    """The budget FilterPruning's arguments ask for, checked; ``None`` in the accuracy mode.

    Args:
        target_macs: a fraction of the starting MACs in (0, 1), or ``None``.
        target_cost: a fraction of the starting cost under ``cost`` in (0, 1), or ``None``
            (at most one of the two is given: the caller checks the modes).
        cost: the cost model FilterPruning was given (:func:`~nestflex.pruning.get_cost`), or ``None``.

    Raises:
        PruningError: a target outside (0, 1), or ``target_cost`` without a cost model.
    """
    hints = {"target_macs": "0.3 keeps 30% of the MACs", "target_cost": "0.5 keeps half the cost (e.g. the time)"}
    what = {"target_macs": "the starting model's MACs", "target_cost": "the starting model's cost under `cost`"}
    for arg, value in (("target_macs", target_macs), ("target_cost", target_cost)):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and 0.0 < value < 1.0
        if value is not None and not ok:
            raise PruningError(f"`{arg}` is a fraction of {what[arg]} in (0, 1), got {value!r}. HINT: {hints[arg]}")
    if target_cost is not None and cost is None:
        raise PruningError(f"`target_cost`={target_cost!r} is a share of the model's cost under `cost`, and no "
                           f"`cost` was given. HINT: pass cost= a latency table (a LatencyTable, its JSON from "
                           f"`nestflex latency-table`, or a LatencyCost), or use `target_macs` for a MACs budget")
    if target_macs is not None:
        return Budget("macs", float(target_macs))
    if target_cost is not None:
        return Budget("cost", float(target_cost), cost)
    return None
