"""Training-side profilers whose JSON outputs go into bundles."""

from nestflex.profiling.precision import (
    DEFAULT_PRECISIONS,
    PRECISIONS,
    BFloat16Layer,
    build_mixed_precision_model,
    plan_assignment,
    profile_layer_precision,
)
from nestflex.profiling.split_quant import DEFAULT_BITWIDTHS, lowest_bits, profile_split_quantization

__all__ = [
    "DEFAULT_BITWIDTHS",
    "DEFAULT_PRECISIONS",
    "PRECISIONS",
    "BFloat16Layer",
    "build_mixed_precision_model",
    "lowest_bits",
    "plan_assignment",
    "profile_layer_precision",
    "profile_split_quantization",
]
