"""Training-side helpers (Lightning): the baseline classification module."""

from nestflex.training.module import ImageClassifier

__all__ = ["ImageClassifier"]
