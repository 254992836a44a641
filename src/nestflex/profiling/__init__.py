"""Training-side profilers whose JSON outputs go into bundles, and the per-layer latency table.

The latency table (:mod:`nestflex.profiling.latency`) is also built on the device
(``nestflex latency-table``), which has no torch: so this package imports nothing until a name
is first read, and the table's module imports numpy and onnxruntime only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nestflex._lazy import lazy_exports

if TYPE_CHECKING:  # the lazy names, for type checkers and the API reference (read statically)
    from nestflex.profiling.latency import (
        LATENCY_SCHEMA,
        LatencyTable,
        LayerSpec,
        measure_table,
        read_layer_specs,
        write_layer_specs,
    )
    from nestflex.profiling.precision import (
        DEFAULT_PRECISIONS,
        PRECISIONS,
        BFloat16Layer,
        build_mixed_precision_model,
        plan_assignment,
        profile_layer_precision,
    )
    from nestflex.profiling.split_quant import DEFAULT_BITWIDTHS, lowest_bits, profile_split_quantization

_HOMES = {
    **dict.fromkeys(("DEFAULT_PRECISIONS", "PRECISIONS", "BFloat16Layer", "build_mixed_precision_model",
                     "plan_assignment", "profile_layer_precision"), "nestflex.profiling.precision"),
    **dict.fromkeys(("DEFAULT_BITWIDTHS", "lowest_bits", "profile_split_quantization"), "nestflex.profiling.split_quant"),
    **dict.fromkeys(("LATENCY_SCHEMA", "LatencyTable", "LayerSpec", "measure_table", "read_layer_specs",
                     "write_layer_specs"), "nestflex.profiling.latency"),
}
__getattr__, __dir__ = lazy_exports(__name__, _HOMES)

__all__ = [
    "DEFAULT_BITWIDTHS",
    "DEFAULT_PRECISIONS",
    "PRECISIONS",
    "BFloat16Layer",
    "build_mixed_precision_model",
    "plan_assignment",
    "profile_layer_precision",
    "lowest_bits",
    "profile_split_quantization",
    "LATENCY_SCHEMA",
    "LatencyTable",
    "LayerSpec",
    "measure_table",
    "read_layer_specs",
    "write_layer_specs",
]
