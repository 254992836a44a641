"""Benchmarks: whether nested levels hold up against independent models, and whether their time follows their MACs."""
