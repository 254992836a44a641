"""The process's resident set size, as the engine's memory budget reads it."""

import sys

import numpy as np
import pytest

from nestflex.deploy._memory import rss_bytes


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/statm is Linux's")
def test_rss_grows_by_what_the_process_touches():
    before = rss_bytes()
    block = np.ones(64 * 2**20, dtype=np.uint8)  # 64 MiB, every page written
    after = rss_bytes()
    assert before is not None and after - before >= 0.9 * block.nbytes
    del block


def test_rss_is_none_where_the_os_gives_none(monkeypatch):
    def refuse(*args, **kwargs):
        raise OSError("no /proc here")

    monkeypatch.setattr("builtins.open", refuse)
    assert rss_bytes() is None
