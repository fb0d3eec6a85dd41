"""CUPTI activity timing (cupti-python), the timer dsa-bench results are meant to quote.

Each iteration runs between two CUPTI timestamps taken with the device idle. Kernel, memcpy and
memset activity is recorded on every stream; a GPU activity belongs to the iteration whose window
holds its start (or, with ``correlate_api``, the runtime/driver API call that launched it, matched
by correlation id), and the iteration's latency is its first activity start to its last activity
end. So host work before the first launch, and the launch latency of the first kernel, do not
count, and work a solution hides on a side stream does.
"""

from __future__ import annotations

import bisect
from typing import Any

import torch

from dsa_bench.errors import DsaBenchError
from dsa_bench.timing.base import Step, Timer

_registered: CuptiTimer | None = None


def cupti_problem() -> str | None:
    """Why CUPTI timing cannot be used here, or None when it can."""
    if not torch.cuda.is_available():
        return "no CUDA device"
    try:
        from cupti import cupti  # noqa: F401
    except Exception as exc:  # ImportError, or a library load failure inside the module
        return f"the cupti-python module does not load ({type(exc).__name__}: {exc}); install dsa-bench[gpu]"
    return None


class CuptiTimer(Timer):
    """CUPTI activity timer.

    With ``correlate_api`` it also records runtime and driver API activity and assigns each GPU
    activity to the call whose window holds the API call that launched it; without it (the
    default) a GPU activity belongs to the window its own start falls in. Both attribute the
    same work, because the device is idle at every window's start and synchronised at its end;
    API tracing, however, slows every launch on the host, which widens the gaps between the
    kernels of a multi-kernel solution (measured: benchmarks/README.md, "The harness, comparing and the checks").
    """

    name = "cupti"

    def __init__(self, correlate_api: bool = False) -> None:
        global _registered
        from cupti import cupti

        # Bound now (see Timer): later patches of the cupti module or of torch do not reach these.
        self._get_timestamp, self._flush_all = cupti.get_timestamp, cupti.activity_flush_all
        self._enable, self._disable = cupti.activity_enable, cupti.activity_disable
        self._sync = torch.cuda.synchronize
        self._gpu_kinds = (cupti.ActivityKind.CONCURRENT_KERNEL, cupti.ActivityKind.MEMCPY, cupti.ActivityKind.MEMSET)
        self._api_kinds = (cupti.ActivityKind.RUNTIME, cupti.ActivityKind.DRIVER) if correlate_api else ()
        if correlate_api:
            self.name = "cupti_api"
        self._gpu: list[tuple[int, int, int, str]] = []  # (start ns, end ns, correlation id, kernel name)
        self._kernel_kind, self._memset_kind = cupti.ActivityKind.CONCURRENT_KERNEL, cupti.ActivityKind.MEMSET
        self._last_kernels: dict[str, list[float]] = {}
        self._api_start: dict[int, int] = {}  # correlation id -> API call start ns
        self._latencies = self._latencies_of  # bound: a patch of the class method changes nothing here
        if _registered is None:  # CUPTI accepts one pair of buffer callbacks per process
            cupti.activity_register_callbacks(self._buffer_requested, _dispatch_completed)
        _registered = self

    @staticmethod
    def _buffer_requested() -> tuple[int, int]:
        return 8 * 1024 * 1024, 0

    def _completed(self, activities: list[Any]) -> None:
        for activity in activities:
            if activity.kind in self._gpu_kinds:
                self._gpu.append((activity.start, activity.end, activity.correlation_id, self._label(activity)))
            elif activity.kind in self._api_kinds:
                self._api_start[activity.correlation_id] = activity.start

    def time_iterations(self, call: Step, count: int, prepare: Step, after: Step) -> list[float]:
        sync, timestamp = self._sync, self._get_timestamp
        sync()
        self._flush_all(1)
        self._gpu.clear()
        self._api_start.clear()
        for kind in (*self._gpu_kinds, *self._api_kinds):
            self._enable(kind)
        windows: list[tuple[int, int]] = []
        try:
            for i in range(count):
                prepare(i)
                sync()
                begin = timestamp()
                call(i)
                sync()
                windows.append((begin, timestamp()))
                after(i)
        finally:
            sync()
            self._flush_all(1)
            for kind in (*self._gpu_kinds, *self._api_kinds):
                self._disable(kind)
        return self._latencies(windows)

    def _label(self, activity: Any) -> str:
        if activity.kind == self._kernel_kind:
            return str(getattr(activity, "name", None) or "kernel")
        return "[memset]" if activity.kind == self._memset_kind else "[memcpy]"

    def _latencies_of(self, windows: list[tuple[int, int]]) -> list[float]:
        latencies, self._last_kernels = attribute_activity(self._gpu, self._api_start, windows)
        return latencies

    def kernel_times(self) -> dict[str, list[float]]:
        """Per GPU activity name (a kernel's name, ``[memcpy]``, ``[memset]``), the ms it ran in each
        call of the last :meth:`time_iterations` (summed over its launches in that call; 0 where a
        call did not launch it). A diagnostic: the latency is still first start to last end."""
        return {name: list(ms) for name, ms in self._last_kernels.items()}


def attribute_activity(
    gpu: list[tuple[int, int, int, str]], api_start: dict[int, int], windows: list[tuple[int, int]]
) -> tuple[list[float], dict[str, list[float]]]:
    """Each timed call's latency (ms, its first activity's start to its last one's end) and, per
    activity name, the ms that name ran in each call. ``gpu`` holds (start ns, end ns, correlation
    id, name); an activity belongs to the window holding its launching API call (``api_start``,
    by correlation id) or, without one, its own start; activity outside every window (flush,
    poison, sampling copies) counts nowhere."""
    begins = [w[0] for w in windows]
    spans: dict[int, tuple[int, int]] = {}  # timed call -> (its first kernel's start, its last one's end) in ns
    busy: dict[str, list[float]] = {}
    for start, end, correlation, name in gpu:
        at = api_start.get(correlation, start)
        i = bisect.bisect_right(begins, at) - 1
        if i < 0 or at > windows[i][1]:
            continue
        first, last = spans.get(i, (start, end))
        spans[i] = (min(first, start), max(last, end))
        busy.setdefault(name, [0.0] * len(windows))[i] += (end - start) / 1e6
    empty = [i for i in range(len(windows)) if i not in spans]
    if empty:
        raise DsaBenchError(f"CUPTI saw no GPU activity in timed call {empty[0]}: the solution launched no GPU work")
    return [(spans[i][1] - spans[i][0]) / 1e6 for i in range(len(windows))], busy


def _dispatch_completed(activities: list[Any]) -> None:
    if _registered is not None:
        _registered._completed(activities)
