"""The one timing helper (nestflex.deploy.timing), against a fake clock and a reference median."""

import statistics

import pytest

from nestflex.deploy import timing
from nestflex.errors import NestflexError


class FakeClock:
    """``perf_counter`` that moves only when a timed function says how long it took."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now

    def work(self, durations):
        it = iter(durations)

        def fn():
            self.now += next(it)

        return fn


@pytest.fixture
def clock(monkeypatch):
    c = FakeClock()
    monkeypatch.setattr(timing.time, "perf_counter", c)
    return c


def test_samples_skip_the_warmup_and_median_matches_the_reference(clock):
    durations = [9.0, 0.003, 0.001, 0.002, 0.010, 0.004]  # the first call is the warm-up
    assert timing.time_samples(clock.work(durations), repeats=5) == pytest.approx(durations[1:])
    assert timing.median_s(clock.work(durations), repeats=5) == pytest.approx(statistics.median(durations[1:]))
    assert timing.median_ms(clock.work(durations), repeats=5) == pytest.approx(1e3 * statistics.median(durations[1:]))
    assert timing.median_ms(clock.work(durations[1:]), repeats=5, warmup=0) == pytest.approx(3.0)


def test_min_ms_loops_short_calls_and_divides(clock):
    calls = []

    def fn():
        calls.append(1)
        clock.now += 1e-4  # 0.1 ms: needs 10 loops for a 0.95 ms sample

    samples = timing.time_samples(fn, repeats=3, min_ms=0.95)
    assert samples == pytest.approx([1e-4] * 3)
    assert len(calls) == 1 + 3 + 3 * 10  # warm-up, three calls to set the loop count, 3 samples x 10 loops


def test_alternating_runs_every_entry_within_each_repeat(clock):
    order = []

    def make(name, seconds):
        def fn():
            order.append(name)
            clock.now += seconds

        return fn

    out = timing.alternating_samples({"a": make("a", 0.002), "b": make("b", 0.001)}, repeats=2)
    assert order == ["a", "b", "a", "b", "a", "b"]  # warm-ups, then a and b in turn
    assert out == {"a": pytest.approx([0.002] * 2), "b": pytest.approx([0.001] * 2)}
    med = timing.alternating_median_ms({"a": make("a", 0.002), "b": make("b", 0.001)}, repeats=2)
    assert med == {"a": pytest.approx(2.0), "b": pytest.approx(1.0)}
    assert timing.alternating_median_s({"a": make("a", 0.002)}, repeats=1) == {"a": pytest.approx(0.002)}


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"repeats": 0}, r"`repeats` must be an int >= 1, got 0\."),
        ({"repeats": True}, r"`repeats` must be an int >= 1, got True\."),
        ({"repeats": 1, "warmup": -1}, r"`warmup` must be an int >= 0, got -1\."),
        ({"repeats": 1, "min_ms": -1.0}, r"`min_ms` must be a number >= 0, got -1.0\. HINT"),
    ],
)
def test_bad_arguments_raise(kwargs, match):
    with pytest.raises(timing.TimingError, match=match):
        timing.median_ms(lambda: None, **kwargs)
    assert issubclass(timing.TimingError, NestflexError)


def test_real_clock_gives_positive_times():
    assert timing.median_ms(lambda: sum(range(100)), repeats=3) > 0
