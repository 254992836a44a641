"""Training-side profilers whose JSON outputs go into bundles."""

from nestflex.profiling.split_quant import DEFAULT_BITWIDTHS, lowest_bits, profile_split_quantization

__all__ = ["DEFAULT_BITWIDTHS", "lowest_bits", "profile_split_quantization"]
