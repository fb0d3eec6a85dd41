"""Timers without CUPTI: CUDA events on the current stream, and the host clock for CPU dry runs.
"""

from __future__ import annotations

import torch

from dsa_bench.timing.base import Step, Timer


class EventTimer(Timer):
    name = "cuda_events"

    def __init__(self) -> None:
        event = torch.cuda.Event
        self._event, self._record, self._elapsed = event, event.record, event.elapsed_time
        self._sync = torch.cuda.synchronize

    def time_iterations(self, call: Step, count: int, prepare: Step, after: Step) -> list[float]:
        starts = [self._event(enable_timing=True) for _ in range(count)]
        ends = [self._event(enable_timing=True) for _ in range(count)]
        for i in range(count):
            prepare(i)
            self._record(starts[i])
            call(i)
            self._record(ends[i])
            # Idle the device between calls, as the CUPTI timer does, so the next call's
            # preparation never overlaps work a solution left running on another stream.
            self._sync()
            after(i)
        return [self._elapsed(s, e) for s, e in zip(starts, ends, strict=True)]


class HostClockTimer(Timer):
    """Host wall clock around each call: for exercising the protocol without a GPU (tests, dry
    runs). Its numbers are not GPU timings, and its name says so."""

    name = "host_clock"

    def __init__(self) -> None:
        import time

        self._clock = time.perf_counter

    def time_iterations(self, call: Step, count: int, prepare: Step, after: Step) -> list[float]:
        samples = []
        for i in range(count):
            prepare(i)
            start = self._clock()
            call(i)
            samples.append((self._clock() - start) * 1e3)
            after(i)
        return samples
