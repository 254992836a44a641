"""Benchmarks: what split inference sends and gains."""
