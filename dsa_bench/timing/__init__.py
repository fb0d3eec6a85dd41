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

import torch

from dsa_bench.errors import DsaBenchError
from dsa_bench.timing.base import Timer
from dsa_bench.timing.events import EventTimer

#: "cupti_api" also records runtime/driver API activity and attributes kernels by correlation id
TIMERS = ("cupti", "cupti_api", "events")


def make_timer(kind: str) -> Timer:
    """The timer ``choose_timer`` picked (one of ``TIMERS``)."""
    if kind == "events":
        return EventTimer()
    from dsa_bench.timing.cupti import CuptiTimer

    return CuptiTimer(correlate_api=kind == "cupti_api")


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
    from dsa_bench.timing.cupti import cupti_problem

    problem = cupti_problem()
    if requested in ("cupti", "cupti_api") and problem is not None:
        raise DsaBenchError(f"CUPTI timing was requested but is unavailable: {problem}")
    if requested == "auto" and problem is not None:
        return "events", (
            f"CUPTI is unavailable ({problem}); timing with CUDA events instead. Event timings include "
            "launch gaps and see only the current stream; every result is labelled 'cuda_events'."
        )
    return ("cupti" if requested == "auto" else requested), None
