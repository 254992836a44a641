"""Bandwidth traces: a piecewise-constant rate in Mbit/s over time, looping, read from the trace
files of the Pensieve / Norway 3G / FCC sets (``time_seconds<TAB>throughput_Mbps``) or fixed."""

from __future__ import annotations

import bisect
import math
import os
from collections.abc import Sequence

from nestflex.testing.link.errors import LinkError, check_number, is_finite

__all__ = ["BandwidthTrace", "TraceLike", "as_trace"]

_MBIT = 1e6


class BandwidthTrace:
    """A piecewise-constant rate in Mbit/s over time, looping with period :attr:`period`.

    Sample ``i`` holds from ``times[i]`` until ``times[i + 1]`` (the last one until ``period``);
    past ``period`` the trace starts over. A 0 Mbit/s sample is an interval in which nothing is
    delivered (a transfer waits for the next positive sample), not an error.

    Args:
        times: sample times in seconds: the first 0, strictly increasing.
        mbps: throughput of each sample in Mbit/s (>= 0, at least one > 0).
        period: loop length in seconds (> ``times[-1]``). Default: the last sample lasts as long
            as the gap before it (1 s for a one-sample trace).
        name: shown in ``repr`` and in error messages (the file name for :meth:`load`).

    Raises:
        LinkError: mismatched lengths, no samples, a time or rate out of range, or all rates 0.
    """

    def __init__(self, times: Sequence[float], mbps: Sequence[float], *, period: float | None = None,
                 name: str = "trace") -> None:
        times, mbps = [float(t) for t in times], [float(r) for r in mbps]
        if not times or len(times) != len(mbps):
            raise LinkError(f"{name}: need as many times as rates and at least one sample, got {len(times)} "
                            f"times and {len(mbps)} rates. "
                            f"HINT: BandwidthTrace.constant(mbps) for a fixed rate")
        if times[0] != 0.0:
            raise LinkError(f"{name}: the first sample must be at time 0, got {times[0]!r}. "
                            f"HINT: subtract the first time (BandwidthTrace.load does)")
        for i, (t, r) in enumerate(zip(times, mbps)):
            if not (math.isfinite(t) and math.isfinite(r)) or r < 0:
                raise LinkError(f"{name}: sample {i} ({t!r} s, {r!r} Mbit/s) is not finite or has a "
                                f"negative rate. "
                                f"HINT: rates are throughputs in Mbit/s, >= 0")
            if i and t <= times[i - 1]:
                raise LinkError(f"{name}: times must increase strictly, sample {i} is at {t!r} s after "
                                f"{times[i - 1]!r} s. HINT: sort the samples and merge duplicates")
        if max(mbps) <= 0:
            raise LinkError(f"{name}: every rate is 0 Mbit/s, nothing would ever be delivered. "
                            f"HINT: model an outage with LinkProxy.set_down / outage, "
                            f"or give the trace some rate > 0")
        if period is None:
            period = times[-1] + (times[-1] - times[-2]) if len(times) > 1 else 1.0
        if not is_finite(period) or not period > times[-1]:
            raise LinkError(f"{name}: `period` must be finite and > the last sample time {times[-1]!r}, "
                            f"got {period!r}.")
        self.name = name
        self.times: tuple[float, ...] = tuple(times)
        self.mbps: tuple[float, ...] = tuple(mbps)
        self.period = float(period)
        self._bps = [r * _MBIT for r in mbps]
        self._edges = times + [self.period]  # segment i is [edges[i], edges[i + 1])
        cum = [0.0]  # bits delivered from 0 to edges[i]
        for i, bps in enumerate(self._bps):
            cum.append(cum[-1] + bps * (self._edges[i + 1] - self._edges[i]))
        self._cum = cum
        self._period_bits = cum[-1]

    # ------------------------------------------------------------------ construction
    @classmethod
    def constant(cls, mbps: float) -> BandwidthTrace:
        """A fixed rate of ``mbps`` Mbit/s (> 0)."""
        if not is_finite(mbps) or mbps <= 0:
            raise LinkError(f"a constant rate must be a finite number of Mbit/s > 0, got {mbps!r}. "
                            f"HINT: for an outage use LinkProxy.set_down")
        return cls([0.0], [float(mbps)], period=1.0, name=f"{float(mbps):g} Mbit/s")

    @classmethod
    def load(cls, path: str | os.PathLike, *, period: float | None = None) -> BandwidthTrace:
        """Read a trace file: one ``time_seconds<TAB>throughput_Mbps`` sample per line.

        Columns may be separated by any whitespace; blank lines and ``#`` comments are skipped.
        Times are taken relative to the first sample (they must increase strictly).

        Args:
            path: the trace file.
            period: loop length in seconds after shifting; default as in :class:`BandwidthTrace`.

        Raises:
            LinkError: the file is missing or empty, or a line is malformed, negative, not finite
                or not later than the line before it (the message names file, line and value).
        """
        name = os.fspath(path)
        try:
            with open(path, encoding="utf-8") as f:
                lines = f.read().splitlines()
        except (OSError, UnicodeDecodeError) as e:
            raise LinkError(f"cannot read bandwidth trace {name!r}: {e}. "
                            f"HINT: pass a text file of `time_seconds<TAB>throughput_Mbps` lines") from e
        times: list[float] = []
        mbps: list[float] = []
        for lineno, line in enumerate(lines, 1):
            text = line.split("#", 1)[0].strip()
            if not text:
                continue
            where = f"{name}:{lineno}"
            fields = text.split()
            if len(fields) != 2:
                raise LinkError(f"{where}: expected 2 columns `time_seconds<TAB>throughput_Mbps`, got "
                                f"{len(fields)} in {line!r}. HINT: one sample per line, e.g. `0.5\\t3.2`")
            try:
                t, r = float(fields[0]), float(fields[1])
            except ValueError:
                raise LinkError(f"{where}: {line!r} is not two numbers. "
                                f"HINT: time in seconds and throughput in Mbit/s, e.g. `0.5\\t3.2`") from None
            if not (math.isfinite(t) and math.isfinite(r)):
                raise LinkError(f"{where}: {line!r} has a value that is not finite. "
                                f"HINT: fix or delete the line")
            if t < 0 or r < 0:
                what, value = ("time", fields[0]) if t < 0 else ("throughput", fields[1])
                raise LinkError(f"{where}: {what} {value} is negative. "
                                f"HINT: times are seconds since the start, throughputs Mbit/s >= 0")
            if times and t <= times[-1]:
                raise LinkError(f"{where}: time {fields[0]} s is not later than the previous sample's "
                                f"{times[-1]!r} s. HINT: sort the lines by time and merge duplicates")
            times.append(t)
            mbps.append(r)
        if not times:
            raise LinkError(f"bandwidth trace {name!r} has no samples. "
                            f"HINT: one `time_seconds<TAB>throughput_Mbps` line per sample")
        t0 = times[0]
        return cls([t - t0 for t in times], mbps, period=period, name=name)

    def scaled(self, factor: float) -> BandwidthTrace:
        """The same trace with every rate multiplied by ``factor`` (> 0)."""
        factor = check_number("factor", factor, hint="a multiplier of every rate, > 0")
        if factor <= 0:
            raise LinkError(f"`factor` must be > 0, got {factor!r}.")
        return BandwidthTrace(self.times, [r * factor for r in self.mbps], period=self.period,
                              name=f"{self.name} x{factor:g}")

    # ------------------------------------------------------------------ queries
    def __len__(self) -> int:
        return len(self.times)

    def __repr__(self) -> str:
        return (f"BandwidthTrace({self.name!r}, samples={len(self)}, period={self.period:g} s, "
                f"mean={self.mean_mbps:.3g} Mbit/s)")

    @property
    def mean_mbps(self) -> float:
        """Time-weighted mean rate over one period, in Mbit/s."""
        return self._period_bits / self.period / _MBIT

    def rate(self, t: float) -> float:
        """The rate in Mbit/s at trace time ``t`` >= 0 (looping)."""
        if not t >= 0:
            raise LinkError(f"trace time must be >= 0, got {t!r}.")
        return self.mbps[self._segment(t % self.period)]

    def _segment(self, r: float) -> int:
        return bisect.bisect_right(self.times, r) - 1

    def bits_until(self, t: float) -> float:
        """Bits the trace delivers from time 0 to ``t`` >= 0 (the integral of the rate)."""
        if not t > 0:
            return 0.0
        k = math.floor(t / self.period)
        r = t - k * self.period
        i = self._segment(r)
        return k * self._period_bits + self._cum[i] + self._bps[i] * (r - self._edges[i])

    def time_for_bits(self, bits: float) -> float:
        """The earliest time at which :meth:`bits_until` reaches ``bits`` (0 for ``bits`` <= 0)."""
        if not bits > 0:
            return 0.0
        k = math.ceil(bits / self._period_bits) - 1  # whole periods before; the rest is in (0, period_bits]
        r = min(bits - k * self._period_bits, self._period_bits)  # min: float rounding past the end
        j = min(max(bisect.bisect_left(self._cum, r), 1), len(self._cum) - 1)  # first edge with cum >= r
        i = j - 1  # cum[i] < r <= cum[j], so segment i has a positive rate
        return k * self.period + self._edges[i] + (r - self._cum[i]) / self._bps[i]

    def finish_time(self, start: float, bits: float) -> float:
        """When ``bits`` bits sent from trace time ``start`` have all gone through the link."""
        if not bits > 0:
            return start
        return max(start, self.time_for_bits(self.bits_until(start) + bits))


TraceLike = BandwidthTrace | float | int | None


def as_trace(trace: TraceLike) -> BandwidthTrace | None:
    if trace is None or isinstance(trace, BandwidthTrace):
        return trace
    if isinstance(trace, (int, float)) and not isinstance(trace, bool):
        return BandwidthTrace.constant(trace)
    raise LinkError(f"a link rate must be a BandwidthTrace, a number of Mbit/s or None (unlimited), got "
                    f"{type(trace).__name__}. HINT: BandwidthTrace.load(path) for a trace file")
