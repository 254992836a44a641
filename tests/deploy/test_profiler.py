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


def test_waits_for_the_cpu_enter_the_slowdown_as_contention_not_the_latency(monkeypatch, tmp_path):
    from nestflex.deploy import profiler as mod

    # the run-queue clock at: watch, frame 1 start, end, frame 2 start, end, frame 3 end
    readings = iter([0.0, 4.0, 4.0, 4.0, 4.5, 4.5])
    monkeypatch.setattr(mod._RunQueueClock, "read", lambda self: next(readings))
    monkeypatch.setattr(mod._RunQueueClock, "watch", lambda self: True)
    p = OnlineProfiler(window=4, log=tmp_path / "f.csv", flush_every=1)
    assert p.watch_thread()
    p.frame_started()  # 4 ms runnable, not running, since the watch began
    p.record("cam", 0, None, 1.0, 2.0)
    # median call ratio 0.5, times 1 + 4 ms waited / 1 ms run
    assert p.slowdown() == pytest.approx(0.5 * 5.0) and p.latency_ms("cam", 0) == 1.0
    p.frame_started()
    p.record("cam", 0, None, 1.0, 2.0)  # 0.5 ms of its 1 ms wall time spent preempted
    assert p.contention() == pytest.approx(1 + 4.5 / 1.5)
    assert p.slowdown("cam") == pytest.approx(0.5 * 4.0) and p.stats()["cpu_wait_ms"] == pytest.approx(2.25)
    p.record("cam", 0, None, 2.0, 2.0)  # a frame with no start mark (a split app's): no wait charged
    rows = list(csv.reader((tmp_path / "f.csv").open()))
    assert [r[-1] for r in rows[1:]] == ["4.0", "0.5", "0.0"]


def test_one_long_stall_moves_the_contention_a_little():
    class Clock:  # the run-queue clock: 50 ms of waiting arrive before the last frame
        now = 0.0

        def watch(self):
            return True

        def read(self):
            return self.now

        def close(self):
            pass

    p = OnlineProfiler(window=8, max_ratio=20.0)
    p._runq = clock = Clock()
    p.watch_thread()
    for _ in range(31):
        p.frame_started()
        p.record("cam", 0, None, 1.0, 1.0)
    clock.now = 50.0
    p.frame_started()  # clipped to 19 x its 1 ms prediction
    p.record("cam", 0, None, 1.0, 1.0)
    assert p.contention() == pytest.approx(1 + 19.0 / 32) and p.slowdown() == pytest.approx(1 + 19.0 / 32)


def test_the_real_clock_reads_this_threads_waits_where_linux_reports_them():
    import os
    import threading

    p = OnlineProfiler()
    if not os.path.exists("/proc/thread-self/schedstat"):
        assert not p.watch_thread()
        p.frame_started()
        assert p._wait_ms == 0.0
        return
    seen = []

    def worker():
        seen.append(p.watch_thread())
        p.frame_started()
        seen.append(p._wait_ms)
        p.record("cam", 0, None, 1.0, 1.0)

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert seen[0] is True and seen[1] >= 0.0
    p.close()  # the file is closed with the profiler; nothing is measured after
    p.frame_started()
    assert p._runq._fd is None and p._wait_ms == 0.0
