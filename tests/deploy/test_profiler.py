"""The online profiler: moving medians, the slowdown factor with its outlier guard, exit rates, logs."""

from __future__ import annotations

import csv
import json

import pytest

from nestflex.deploy.profiler import LOG_FIELDS, OnlineProfiler, ProfilerError


def test_slowdown_is_the_windowed_median_of_measured_over_predicted():
    p = OnlineProfiler(window=5)
    assert p.slowdown() == 1.0 and p.slowdown("cam", default=2.0) == 2.0  # nothing measured yet
    for ms in (2.0, 2.0, 2.0, 2.0, 2.0):
        p.record("cam", 1, None, ms, 1.0)
    assert p.slowdown() == p.slowdown("cam") == 2.0
    for ms in (3.0, 3.0, 3.0):  # a sustained change moves the median within half a window
        p.record("cam", 1, None, ms, 1.0)
    assert p.slowdown() == 3.0
    p.record("other", 0, None, 1.0, 1.0)
    assert p.slowdown("other") == 1.0 and p.slowdown() == 3.0  # the device window mixes apps


def test_one_outlier_moves_nothing_and_ratios_are_clipped():
    p = OnlineProfiler(window=9, max_ratio=4.0)
    for _ in range(8):
        p.record("cam", 0, None, 1.0, 1.0)
    p.record("cam", 0, None, 500.0, 1.0)  # one frame preempted by the OS
    assert p.slowdown() == 1.0
    q = OnlineProfiler(window=3, max_ratio=4.0)
    for _ in range(3):
        q.record("cam", 0, None, 100.0, 1.0)
    assert q.slowdown() == 4.0  # clipped
    q.record("cam", 0, None, 1.0, None)  # no prediction: latency recorded, no slowdown sample
    assert q.slowdown() == 4.0 and q.latency_ms("cam", 0) == 100.0


def test_latency_and_exit_rates_per_app_level_and_exit():
    p = OnlineProfiler(window=4)
    for e, ms in ((0, 1.0), (0, 1.2), (1, 2.0), (None, 3.0)):
        p.record("cam", 2, e, ms, 1.0)
    assert p.latency_ms("cam", 2, 0) == pytest.approx(1.1) and p.latency_ms("cam", 2, 1) == 2.0
    assert p.latency_ms("cam", 1, 0) is None
    assert p.exit_rates("cam", 2) == {0: 0.5, 1: 0.25, None: 0.25}
    st = p.stats()
    assert st["apps"]["cam"]["frames"] == 4 and st["apps"]["cam"]["latency_ms"]["2/0"] == pytest.approx(1.1)
    assert st["apps"]["cam"]["exit_rates"]["2"] == {"0": 0.5, "1": 0.25, "None": 0.25}
    p.forget("cam")
    assert p.latency_ms("cam", 2, 0) is None and "cam" not in p.stats()["apps"]


def test_json_and_csv_logs(tmp_path):
    log = tmp_path / "frames.csv"
    p = OnlineProfiler(window=4, log=log, flush_every=2)
    for k in range(3):
        p.record("cam", k, None, 1.0 + k, 1.0)
    p.close()
    rows = list(csv.reader(log.open()))
    assert rows[0] == list(LOG_FIELDS) and len(rows) == 4 and rows[3][1:4] == ["cam", "2", ""]
    p.write_json(tmp_path / "stats.json")
    assert json.loads((tmp_path / "stats.json").read_text())["apps"]["cam"]["frames"] == 3


@pytest.mark.parametrize("kwargs, match", [
    ({"window": 0}, r"`window` must be an int >= 1"),
    ({"window": 2.5}, r"`window` must be an int >= 1"),
    ({"max_ratio": 1.0}, r"`max_ratio` must be a finite number > 1"),
    ({"log": "/nonexistent/dir/log.csv"}, r"`log` '/nonexistent/dir/log.csv': folder '/nonexistent/dir' does not exist"),
])
def test_bad_arguments(kwargs, match):
    with pytest.raises(ProfilerError, match=match):
        OnlineProfiler(**kwargs)
