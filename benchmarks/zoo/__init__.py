"""Benchmarks: which models the structure graph handles."""
