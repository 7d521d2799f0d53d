"""Paired, interleaved timing built on :class:`torch.utils.benchmark.Timer`.

Single timings on the shared 2-core machines vary by +-30%, so no number in this harness is a
lone timing. Every section times its contenders in *repeats*: each repeat times every contender
once (in an order rotated from repeat to repeat, so no contender always runs first or right after
the same neighbour), the ratio ``time(contender) / time(reference)`` is formed inside the repeat,
and the summary is the median (and inter-quartile range) of those per-repeat ratios. A load spike
slows every contender of a repeat about equally, so it cancels in the ratio; the median discards
the repeats where it did not.

One measurement = one ``Timer.blocked_autorange`` call: it first runs the statement untimed
(at least once, to pick a block size), so a contender is always timed right after a run of its
own, never straight after a switch from another model; on a slow step (seconds) that is one
untimed + one timed call. Sections that need an exact number of calls after a ``setup`` (the
RescaleNet measuring steps) use ``Timer.timeit(number)``, which also runs the statement untimed
twice first, each time after ``setup``.

``Measure`` is any zero-argument callable returning seconds per call; :func:`paired_repeats`
accepts fakes, which is how the tests check the ratio arithmetic.
"""
from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch
from torch.utils.benchmark import Timer

__all__ = ["Measure", "Summary", "PairedTimes", "summarize", "timer_measure", "paired_repeats"]

Measure = Callable[[], float]  # -> seconds per call of one contender's statement


@dataclass(frozen=True)
class Summary:
    """Median and inter-quartile range of a list of values (ratios or seconds)."""

    median: float
    q1: float
    q3: float
    n: int

    @property
    def iqr(self) -> float:
        return self.q3 - self.q1

    def __format__(self, spec: str) -> str:
        spec = spec or ".2f"
        return f"{self.median:{spec}} [{self.q1:{spec}}, {self.q3:{spec}}]"


def summarize(values: list[float]) -> Summary:
    """Median and quartiles (inclusive method: q1 = q3 = the value when there is one)."""
    if not values:
        raise ValueError("nothing to summarize")
    if len(values) == 1:
        v = float(values[0])
        return Summary(v, v, v, 1)
    q1, median, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return Summary(float(median), float(q1), float(q3), len(values))


def timer_measure(fn: Callable[[], object], *, setup: Callable[[], object] | None = None,
                  number: int | None = None, min_run_time: float = 0.2, label: str = "",
                  description: str = "", num_threads: int | None = None) -> Measure:
    """A :data:`Measure` timing ``fn()`` with :class:`torch.utils.benchmark.Timer`.

    ``number=None``: ``Timer.blocked_autorange(min_run_time)``, the median seconds per call over
    its blocks. ``number=n``: ``Timer.timeit(n)``, the mean over ``n`` calls that follow one call
    of ``setup`` (e.g. resetting RescaleNet's measuring state before each block of measuring
    steps). The Timer runs at ``num_threads`` torch threads, by default the current
    ``torch.get_num_threads()`` (the Timer's own default would be 1).
    """
    glob = {"_fn": fn, "_setup": setup or (lambda: None)}
    threads = torch.get_num_threads() if num_threads is None else num_threads
    timer = Timer(stmt="_fn()", setup="_setup()", globals=glob, num_threads=threads,
                  label=label, description=description)
    if number is None:
        return lambda: timer.blocked_autorange(min_run_time=min_run_time).median
    if number < 1:
        raise ValueError(f"number must be at least 1, got {number}")
    return lambda: timer.timeit(number).mean


@dataclass
class PairedTimes:
    """Seconds per call of every contender in every repeat; ratios are formed per repeat."""

    baseline: str
    times: dict[str, list[float]] = field(default_factory=dict)

    @property
    def names(self) -> list[str]:
        return list(self.times)

    @property
    def repeats(self) -> int:
        return len(self.times[self.baseline])

    def ratios(self, name: str, reference: str | None = None) -> list[float]:
        """``time(name) / time(reference)`` in each repeat (reference: the baseline)."""
        ref = self.times[reference or self.baseline]
        return [t / r for t, r in zip(self.times[name], ref, strict=True)]

    def ratio(self, name: str, reference: str | None = None) -> Summary:
        """Median (and quartiles) over repeats of the per-repeat ratio: never a ratio of medians."""
        return summarize(self.ratios(name, reference))

    def seconds(self, name: str) -> Summary:
        return summarize(self.times[name])


def paired_repeats(measures: Mapping[str, Measure], baseline: str, repeats: int, *,
                   rotate: bool = True,
                   progress: Callable[[int, str, float], None] | None = None) -> PairedTimes:
    """Time every contender once per repeat, ``repeats`` times, interleaved.

    Repeat ``r`` runs the contenders in their given order rotated left by ``r`` (``rotate``), so
    the positions even out over the repeats. ``progress(repeat, name, seconds)`` is called after
    each measurement.
    """
    if baseline not in measures:
        raise KeyError(f"baseline {baseline!r} is not among the contenders {list(measures)}")
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    order = list(measures)
    result = PairedTimes(baseline, {name: [] for name in order})
    for r in range(repeats):
        k = r % len(order) if rotate else 0
        for name in order[k:] + order[:k]:
            seconds = float(measures[name]())
            result.times[name].append(seconds)
            if progress is not None:
                progress(r, name, seconds)
    return result
