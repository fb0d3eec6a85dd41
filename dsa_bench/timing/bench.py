"""``bench()``: the harness's timing protocol for tools and kernel benchmarks, in one call.

Kernel-development scripts time candidate kernels outside a run; with ``bench`` they use the same
timer choice (CUPTI, else CUDA events, said loudly), the same L2 flush before every call, the
same warm-up / iterations / trials, and report the same statistic (each trial's median, averaged
over trials) as ``dsa-bench run`` does, so their numbers compare with the recorded ones.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass

import torch

from dsa_bench.timing import choose_timer, make_timer
from dsa_bench.timing.base import harness_latency_ms, trial_medians_ms
from dsa_bench.timing.flush import L2Flusher


@dataclass(frozen=True)
class BenchResult:
    timer: str
    samples_ms: list[list[float]]

    @property
    def mean_ms(self) -> float:
        """The harness's statistic: per-trial medians, averaged."""
        return harness_latency_ms(self.samples_ms)

    @property
    def trial_medians_ms(self) -> list[float]:
        return trial_medians_ms(self.samples_ms)


def bench(
    call: Callable[[int], object],
    *,
    device: torch.device | None = None,
    warmup: int = 10,
    iterations: int = 50,
    trials: int = 3,
    prepare: Callable[[int], None] | None = None,
    timer: str = "auto",
    l2_flush: str | None = "clean",
) -> BenchResult:
    """Time ``call(i)`` (i counts calls within a trial) as a run times a solution.

    Before every warm-up and timed call, ``prepare(i)`` runs (untimed: redraw inputs, re-poison
    outputs), then the L2 is flushed (``l2_flush`` None: warm, for measuring the flush itself).
    Needs a CUDA device.
    """
    device = device or torch.device("cuda", torch.cuda.current_device())
    name, warning = choose_timer(timer, device)
    if name is None:
        raise ValueError(f"bench needs a CUDA device, got {device}")
    if warning:
        print(f"warning: {warning}", file=sys.stderr)
    timing = make_timer(name)
    flush = L2Flusher(device, l2_flush).flush if l2_flush is not None else (lambda: None)

    def before(i: int) -> None:
        if prepare is not None:
            prepare(i)
        flush()

    samples = []
    for _ in range(trials):
        for i in range(warmup):
            before(i)
            call(i)
        torch.cuda.synchronize(device)
        samples.append(timing.time_iterations(call, iterations, before, lambda i: None))
    return BenchResult(timing.name, samples)
