"""Benchmarks: how the default recipe and its data behave."""
