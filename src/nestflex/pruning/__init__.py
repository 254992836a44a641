"""NestDNN filter pruning: importance criteria, sensitivity profile, roadmap, pruning callback."""

from nestflex.errors import PruningError
from nestflex.pruning.callback import FilterPruning, load_pruned
from nestflex.pruning.collective import (
    CollectiveImportance,
    CollectiveRanking,
    collective_ranking,
    exit_accuracy_curve,
    min_filters,
    pooled_activations,
    pooled_responses,
)
from nestflex.pruning.cost import (
    COSTS,
    CostModel,
    LatencyCost,
    MacsCost,
    build_latency_table,
    cost_allocation,
    get_cost,
    latency_specs,
    write_model_specs,
)
from nestflex.pruning.decision import PairedDecision, SeedConfirmation, confirm_seed, paired_decision
from nestflex.pruning.evaluate import accuracy
from nestflex.pruning.importance import (
    Importance,
    RandomImportance,
    WeightNorm,
    get_importance,
    list_importances,
    register_importance,
)
from nestflex.pruning.roadmap import Footprint, Roadmap, apply_footprint, roadmap_network
from nestflex.pruning.sensitivity import (
    DEFAULT_FRACTIONS,
    allocation_weights,
    keep_top,
    plot_sensitivity,
    pruned_copy,
    sensitivity_profile,
)
from nestflex.pruning.step import StepDecision, budget_limit, budget_reached, budget_scale, decide_step, plan_step, shrink
from nestflex.pruning.trr import TRR, dataset_targets, sample_triplets

__all__ = [
    "PruningError",
    "FilterPruning",
    "load_pruned",
    "accuracy",
    "Importance",
    "WeightNorm",
    "RandomImportance",
    "TRR",
    "CollectiveImportance",
    "CollectiveRanking",
    "collective_ranking",
    "exit_accuracy_curve",
    "min_filters",
    "pooled_activations",
    "pooled_responses",
    "get_importance",
    "list_importances",
    "register_importance",
    "sample_triplets",
    "dataset_targets",
    "Footprint",
    "Roadmap",
    "apply_footprint",
    "roadmap_network",
    "DEFAULT_FRACTIONS",
    "sensitivity_profile",
    "allocation_weights",
    "keep_top",
    "pruned_copy",
    "plot_sensitivity",
    "plan_step",
    "shrink",
    "decide_step",
    "paired_decision",
    "PairedDecision",
    "confirm_seed",
    "SeedConfirmation",
    "budget_limit",
    "budget_reached",
    "budget_scale",
    "StepDecision",
    "COSTS",
    "CostModel",
    "MacsCost",
    "LatencyCost",
    "get_cost",
    "cost_allocation",
    "latency_specs",
    "write_model_specs",
    "build_latency_table",
]
