"""Benchmarks: what the light runtime costs a device and what it withstands."""
