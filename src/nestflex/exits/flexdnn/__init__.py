"""FlexDNN: fine-grained early exits, searched and planned on a trained, frozen network.

Where a progressive exit (:mod:`nestflex.exits`, SPINN/SDN) reads a whole layer at a position
you choose, a FlexDNN exit reads the top ``k`` filters of a layer's collective ranking, with an
architecture found by search, at positions an insertion plan chooses. The result is the same
:class:`~nestflex.exits.MultiExitNetwork` as the progressive exits', so calibration, the exit
policy and the bundle are shared. The walk of a run, one module each:

* :mod:`~nestflex.exits.flexdnn.fine_grained`: the exit modules (:class:`FilterSubsetExit`,
  :class:`CompactHead`, :class:`RankedDropout`);
* :mod:`~nestflex.exits.flexdnn.search`: over-parameterised exits per location, trained with
  ranked dropout and pruned while their exit rate holds;
* :mod:`~nestflex.exits.flexdnn.plan`: which exits to keep (:func:`insertion_plan`);
* :mod:`~nestflex.exits.flexdnn.pipeline`: :func:`flexdnn`, the whole run, and its
  :class:`FlexDNNConfig` / :class:`FlexDNNResult`;
* :mod:`~nestflex.exits.flexdnn.spec`: the result's JSON spec and files, and the network rebuilt
  from them (:func:`load_flex_network`, :func:`build_flex_network`);
* :mod:`~nestflex.exits.flexdnn.callback`: :class:`FlexDNNExits`, the Lightning callback that
  runs it at the end of ``fit`` (also ``nestflex.callbacks.FlexDNNExits``).

Everything but :class:`FlexDNNExits` needs torch alone; the callback imports Lightning and is
loaded on first access. docs/flexdnn.md is the user guide.

Every name here is also exported by :mod:`nestflex.exits`, and the modules' old paths
(``nestflex.exits.fine_grained``, ``.search``, ``.plan``) still import. One name is taken twice:
``nestflex.exits.flexdnn`` *as an attribute* is the function :func:`flexdnn`, as it was when
FlexDNN was one module, so ``from nestflex.exits import flexdnn`` and ``import
nestflex.exits.flexdnn as f`` bind the function; ``from nestflex.exits.flexdnn import ...`` and
``importlib.import_module("nestflex.exits.flexdnn")`` reach this package.

Examples:
    >>> import torch
    >>> from nestflex.exits.flexdnn import CompactHead, FilterSubsetExit, exit_filter_counts
    >>> exit_filter_counts(16, 2)
    [8, 16]
    >>> ex = FilterSubsetExit(torch.tensor([3, 0, 7]), CompactHead(3, [4], num_classes=10, in_hw=(16, 16)))
    >>> ex(torch.randn(2, 8, 16, 16)).shape
    torch.Size([2, 10])
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nestflex._lazy import lazy_exports
from nestflex.exits.flexdnn.fine_grained import (
    CompactHead,
    FilterSubsetExit,
    RankedDropout,
    exit_filter_counts,
    fine_grained_exit,
)
from nestflex.exits.flexdnn.pipeline import (
    FlexDNNConfig,
    FlexDNNResult,
    evaluate_flex,
    flexdnn,
    operating_points,
)
from nestflex.exits.flexdnn.plan import InsertionPlan, insertion_plan, subset_cost
from nestflex.exits.flexdnn.spec import build_flex_network, load_flex_network

if TYPE_CHECKING:  # the lazy names below, for type checkers, IDEs and the API reference (read statically)
    from nestflex.exits.flexdnn.callback import FlexDNNExits

#: names whose modules import Lightning, loaded on first access
_LAZY = {"FlexDNNExits": "nestflex.exits.flexdnn.callback"}

__all__ = [
    # the run and its result
    "flexdnn",
    "FlexDNNConfig",
    "FlexDNNResult",
    "evaluate_flex",
    "operating_points",
    # the network rebuilt from the result's files
    "load_flex_network",
    "build_flex_network",
    # the exit modules
    "FilterSubsetExit",
    "CompactHead",
    "RankedDropout",
    "exit_filter_counts",
    "fine_grained_exit",
    # the insertion plan
    "InsertionPlan",
    "insertion_plan",
    "subset_cost",
    # the Lightning callback (lazy: _LAZY)
    "FlexDNNExits",
]


__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
