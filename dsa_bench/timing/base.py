"""The timer interface: a step protocol, the binding rule every timer follows, and the statistic
reported from its samples.
"""

from __future__ import annotations

import abc
import statistics
from collections.abc import Callable

Step = Callable[[int], object]  # what a step returns is ignored


class Timer(abc.ABC):
    """Times calls. Every timer binds the functions it calls when it is constructed (the clock,
    the synchronisation, its own helpers), so a patch of its class or of the modules it uses made
    after construction does not change what it measures; the worker constructs it before it
    imports a solution."""

    #: how results name this timer
    name: str

    @abc.abstractmethod
    def time_iterations(self, call: Step, count: int, prepare: Step, after: Step) -> list[float]:
        """Latency in ms of ``call(i)`` for ``i in range(count)``."""


def trial_medians_ms(samples_ms: list[list[float]]) -> list[float]:
    return [statistics.median(s) for s in samples_ms]


def harness_latency_ms(samples_ms: list[list[float]]) -> float:
    """The latency dsa-bench reports for timed calls: the median of each trial, averaged over trials."""
    return statistics.fmean(trial_medians_ms(samples_ms))
