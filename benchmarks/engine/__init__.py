"""Benchmarks: how the schedulers decide for apps sharing a device."""
