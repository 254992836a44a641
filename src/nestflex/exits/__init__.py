"""Progressive multi-exit networks (SPINN / Shallow-Deep Networks) and their calibration.

* :class:`MultiExitNetwork`: exits on any traceable backbone, at fractions of its MACs or at named
  split points (:mod:`~nestflex.exits.placement`), with heads from a registry
  (:mod:`~nestflex.exits.heads`: ``sdn``, ``msdnet``, yours);
* the overthinking-aware loss (:mod:`~nestflex.exits.loss`) and :class:`OverthinkingSchedule`,
  the callback that sets its weights from the step;
* :class:`MultiExitClassifier`: the LightningModule, ``joint`` or ``exits_only``;
* confidence measures and the exit policy, re-exported from :mod:`nestflex.deploy.exits` (one
  implementation for training and runtime);
* calibration on a validation split (:mod:`~nestflex.exits.calibration`), and per-exit
  thresholds for every accuracy level (:mod:`~nestflex.exits.front`).

Everything except :class:`MultiExitClassifier`, :class:`OverthinkingSchedule` and
:class:`FlexDNNExits` needs torch alone; those three import Lightning and are loaded on first access.

Example:
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

import importlib
from typing import Any

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
from nestflex.exits.front import threshold_front
from nestflex.exits.heads import create_head, get_head, list_heads, register_head
from nestflex.exits.loss import WEIGHTINGS, loss_weights, multi_exit_loss, tau_schedule
from nestflex.exits.model import MultiExitNetwork
from nestflex.exits.placement import DEFAULT_POSITIONS, resolve_positions
from nestflex.exits.fine_grained import (
    CompactHead,
    FilterSubsetExit,
    RankedDropout,
    exit_filter_counts,
    fine_grained_exit,
)
from nestflex.exits.plan import InsertionPlan, insertion_plan, subset_cost
from nestflex.exits.flexdnn import (
    FlexDNNConfig,
    FlexDNNResult,
    build_flex_network,
    evaluate_flex,
    flexdnn,
    operating_points,
)

_LAZY = {
    "MultiExitClassifier": "nestflex.exits.classifier",
    "MODES": "nestflex.exits.classifier",
    "OverthinkingSchedule": "nestflex.exits.callback",
    "FlexDNNExits": "nestflex.exits.flex_callback",
}

__all__ = [
    "ExitError",
    "MultiExitNetwork",
    "DEFAULT_POSITIONS",
    "resolve_positions",
    "register_head",
    "list_heads",
    "get_head",
    "create_head",
    "tau_schedule",
    "loss_weights",
    "multi_exit_loss",
    "WEIGHTINGS",
    "register_confidence",
    "list_confidences",
    "get_confidence",
    "check_thresholds",
    "decide",
    "apply_policy",
    "early_exit",
    "ExitResult",
    "FALLBACKS",
    "DEFAULT_THRESHOLDS",
    "collect_logits",
    "evaluate_thresholds",
    "lossless_thresholds",
    "exit_profile",
    "calibrate",
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
    "operating_points",
    "threshold_front",
    *_LAZY,
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'nestflex.exits' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
