"""Benchmarks: what early exits (SPINN/SDN, FlexDNN) save."""
