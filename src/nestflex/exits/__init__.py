"""Early exits: progressive multi-exit networks (SPINN / Shallow-Deep Networks), their loss and
calibration; FlexDNN's fine-grained exits in :mod:`nestflex.exits.flexdnn`.

The progressive exits, one module each:

* :class:`MultiExitNetwork` (:mod:`~nestflex.exits.model`): exits on any traceable backbone, at
  fractions of its MACs or at named split points (:mod:`~nestflex.exits.placement`), with heads
  from a registry (:mod:`~nestflex.exits.heads`: ``sdn``, ``msdnet``, yours);
* the overthinking-aware loss (:mod:`~nestflex.exits.loss`) and :class:`OverthinkingSchedule`
  (:mod:`~nestflex.exits.callback`), the callback that sets its weights from the step;
* :class:`MultiExitClassifier` (:mod:`~nestflex.exits.classifier`): the LightningModule,
  ``joint`` or ``exits_only``;
* confidence measures and the exit policy, re-exported from :mod:`nestflex.deploy.exits` (one
  implementation for training and runtime);
* calibration on a validation split (:mod:`~nestflex.exits.calibration`), per-exit thresholds
  for every accuracy level (:mod:`~nestflex.exits.front`) and the recipes' tables and plots
  (:mod:`~nestflex.exits.report`).

FlexDNN (:mod:`nestflex.exits.flexdnn`) builds on them; its public names are exported here too.

Everything except :class:`MultiExitClassifier`, :class:`OverthinkingSchedule` and
:class:`FlexDNNExits` needs torch alone; those three import Lightning and are loaded on first
access, so ``import nestflex.exits`` costs torch, not Lightning.

Examples:
    >>> import torch
    >>> from nestflex.models import create_model
    >>> net = MultiExitNetwork(create_model("vgg11", width=0.25)).eval()
    >>> len(net(torch.randn(2, 3, 32, 32))), net.num_exits
    (7, 7)
    >>> out = net.early_exit(torch.randn(4, 3, 32, 32), thresholds=0.5)
    >>> out.logits.shape
    torch.Size([4, 10])
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from nestflex._lazy import lazy_exports
from nestflex.deploy.exits import (
    FALLBACKS,
    ExitError,
    ExitResult,
    apply_policy,
    check_thresholds,
    decide,
    early_exit,
    get_confidence,
    list_confidences,
    register_confidence,
)
from nestflex.exits.calibration import (
    DEFAULT_THRESHOLDS,
    calibrate,
    collect_logits,
    evaluate_thresholds,
    exit_profile,
    lossless_thresholds,
)
from nestflex.exits.flexdnn import (
    CompactHead,
    FilterSubsetExit,
    FlexDNNConfig,
    FlexDNNResult,
    InsertionPlan,
    RankedDropout,
    build_flex_network,
    evaluate_flex,
    exit_filter_counts,
    fine_grained_exit,
    flexdnn,
    insertion_plan,
    load_flex_network,
    operating_points,
    subset_cost,
)
from nestflex.exits.flexdnn import fine_grained as _fine_grained
from nestflex.exits.flexdnn import plan as _plan
from nestflex.exits.flexdnn import search as _search
from nestflex.exits.front import threshold_front
from nestflex.exits.heads import create_head, get_head, list_heads, register_head
from nestflex.exits.loss import WEIGHTINGS, loss_weights, multi_exit_loss, tau_schedule
from nestflex.exits.model import MultiExitNetwork
from nestflex.exits.placement import DEFAULT_POSITIONS, resolve_positions

# FlexDNN's modules lived here before nestflex.exits.flexdnn (issue 39): their old paths
# (`from nestflex.exits.search import ...`, `nestflex.exits.search.Candidate`) name the same modules.
_MOVED = {"fine_grained": _fine_grained, "plan": _plan, "search": _search}
for _old, _module in _MOVED.items():
    sys.modules.setdefault(f"{__name__}.{_old}", _module)

if TYPE_CHECKING:  # the lazy names below, for type checkers, IDEs and the API reference (read statically)
    from nestflex.exits.callback import OverthinkingSchedule
    from nestflex.exits.classifier import MODES, MultiExitClassifier
    from nestflex.exits.flexdnn.callback import FlexDNNExits

#: names whose modules import Lightning, loaded on first access
_LAZY = {
    "MultiExitClassifier": "nestflex.exits.classifier",
    "MODES": "nestflex.exits.classifier",
    "OverthinkingSchedule": "nestflex.exits.callback",
    "FlexDNNExits": "nestflex.exits.flexdnn.callback",
}

__all__ = [
    # the network, where its exits go, their heads
    "MultiExitNetwork",
    "DEFAULT_POSITIONS",
    "resolve_positions",
    "register_head",
    "list_heads",
    "get_head",
    "create_head",
    # training: the loss and its weights
    "tau_schedule",
    "loss_weights",
    "multi_exit_loss",
    "WEIGHTINGS",
    # the exit policy (nestflex.deploy.exits)
    "ExitError",
    "register_confidence",
    "list_confidences",
    "get_confidence",
    "check_thresholds",
    "decide",
    "apply_policy",
    "early_exit",
    "ExitResult",
    "FALLBACKS",
    # calibration and thresholds
    "DEFAULT_THRESHOLDS",
    "collect_logits",
    "evaluate_thresholds",
    "lossless_thresholds",
    "exit_profile",
    "calibrate",
    "threshold_front",
    # FlexDNN (nestflex.exits.flexdnn)
    "FilterSubsetExit",
    "RankedDropout",
    "CompactHead",
    "exit_filter_counts",
    "fine_grained_exit",
    "InsertionPlan",
    "insertion_plan",
    "subset_cost",
    "FlexDNNConfig",
    "FlexDNNResult",
    "flexdnn",
    "evaluate_flex",
    "build_flex_network",
    "load_flex_network",
    "operating_points",
    # Lightning (lazy: _LAZY; written out so static readers such as the API reference see them)
    "MultiExitClassifier",
    "MODES",
    "OverthinkingSchedule",
    "FlexDNNExits",
]


_lazy_getattr, __dir__ = lazy_exports(__name__, _LAZY)


def __getattr__(name: str) -> Any:
    if name in _MOVED:  # the old module paths: nestflex.exits.search etc.
        return _MOVED[name]
    return _lazy_getattr(name)
