"""GPU timing behind one small interface.

A timer runs ``count`` iterations; each iteration is ``prepare(i)`` (untimed: L2 flush, output
poisoning), ``call(i)`` (timed) and ``after(i)`` (untimed: e.g. copying a sampled output), and
the timer returns one latency in milliseconds per iteration.

- ``CuptiTimer`` (cupti-python activity tracing) measures from the first GPU activity start to
  the last activity end of everything ``call(i)`` launched, on any stream. Host time before the
  first launch does not count.
- ``EventTimer`` (CUDA events on the current stream) is the fallback when CUPTI cannot load.
  It includes launch gaps and misses work on other streams, so results say which timer made
  them and the CLI warns when the fallback is used.
"""

from __future__ import annotations

import abc
from typing import Callable

import torch

from dsa_bench.errors import DsaBenchError

Step = Callable[[int], None]
TIMERS = ("cupti", "events")


class L2Flusher:
    """Evicts the L2 cache by writing a buffer of twice its size (outside any timed span)."""

    def __init__(self, device: torch.device) -> None:
        l2_bytes = int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0)) or 64 * 2**20
        self.bytes = 2 * l2_bytes
        self._buffer = torch.empty(self.bytes // 4, dtype=torch.int32, device=device)

    def flush(self) -> None:
        self._buffer.zero_()


class Timer(abc.ABC):
    #: how results name this timer
    name: str

    @abc.abstractmethod
    def time_iterations(self, call: Step, count: int, prepare: Step, after: Step) -> list[float]:
        """Latency in ms of ``call(i)`` for ``i in range(count)``."""


class EventTimer(Timer):
    name = "cuda_events"

    def time_iterations(self, call: Step, count: int, prepare: Step, after: Step) -> list[float]:
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(count)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(count)]
        for i in range(count):
            prepare(i)
            starts[i].record()
            call(i)
            ends[i].record()
            after(i)
        torch.cuda.synchronize()
        return [s.elapsed_time(e) for s, e in zip(starts, ends)]


def make_timer(kind: str) -> Timer:
    """The timer ``choose_timer`` picked ('cupti' or 'events')."""
    if kind == "events":
        return EventTimer()
    from dsa_bench.cupti_timer import CuptiTimer

    return CuptiTimer()


def choose_timer(requested: str, device: torch.device) -> tuple[str | None, str | None]:
    """(timer name or None for correctness only, warning to show or None) for a run.

    'auto' takes CUPTI when it loads and falls back to CUDA events with a warning; naming a
    timer forces it, and naming one that cannot work is an error.
    """
    if requested not in ("auto", *TIMERS):
        raise DsaBenchError(f"unknown timer {requested!r}; expected auto, {', '.join(TIMERS)}")
    if device.type != "cuda":
        if requested != "auto":
            raise DsaBenchError(f"--timer {requested} needs a CUDA device; this run is on {device}")
        return None, None
    from dsa_bench.cupti_timer import cupti_problem

    problem = cupti_problem()
    if requested == "cupti" and problem is not None:
        raise DsaBenchError(f"CUPTI timing was requested but is unavailable: {problem}")
    if requested == "auto" and problem is not None:
        return "events", (
            f"CUPTI is unavailable ({problem}); timing with CUDA events instead. Event timings include "
            "launch gaps and see only the current stream; every result is labelled 'cuda_events'."
        )
    return ("events" if requested == "events" else "cupti"), None
