"""The pretrained tiny VGG of test_callback.py, shared with the other pruning test modules."""

from tests.pruning.test_callback import pretrained  # noqa: F401 - a fixture, found by name
