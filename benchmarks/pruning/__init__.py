"""Benchmarks: how far and how well NestDNN's TRR prunes, and at what cost."""
