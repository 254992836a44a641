"""Benchmarks: how fast the device runs each level, and why."""
