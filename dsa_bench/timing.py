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
import math
from typing import Callable

import torch

from dsa_bench.errors import DsaBenchError

Step = Callable[[int], None]
#: "cupti_api" also records runtime/driver API activity and attributes kernels by correlation id
TIMERS = ("cupti", "cupti_api", "events")


#: how the L2 is emptied before a timed call (see L2Flusher); the first is the default
L2_FLUSH_MODES = ("clean", "dirty")


def check_l2_flush(mode: str) -> str:
    if mode not in L2_FLUSH_MODES:
        raise DsaBenchError(f"unknown L2 flush mode {mode!r}; expected one of {', '.join(L2_FLUSH_MODES)}")
    return mode


_READ_ROW_WORDS = 1024


class L2Flusher:
    """Empties the L2 before a timed call, outside the timed span.

    Both modes first write a buffer of twice the L2's size. Writes always allocate in L2, so this
    evicts every line the previous call left, and the previous call's dirty lines are written
    back here rather than inside the next call.

    - ``clean`` (the default) then reads a second buffer of the same size, so the L2 is left
      holding clean lines only: the timed call's misses evict them for free and it pays for its
      own memory traffic alone.
    - ``dirty`` stops after the write, as harnesses that flush with one memset do (Triton's
      ``do_bench`` zeroes a buffer). The L2 is then full of the flush's own dirty lines, and
      every line the timed call brings in first writes one of them back: a call that reads
      N bytes from DRAM also writes up to N. On an H200 an 18.9 MB gather took 8.6 µs after a
      dirty flush and 6.6 µs after a clean one (``tools/measure_harness.py l2-flush``).
    """

    def __init__(self, device: torch.device, mode: str = L2_FLUSH_MODES[0]) -> None:
        self.mode = check_l2_flush(mode)
        # Bound now: a later patch of torch's functions cannot turn the flush into a no-op.
        self._zero, self._sum_rows = torch.Tensor.zero_, torch.sum
        l2_bytes = int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0)) or 64 * 2**20
        self.bytes = 2 * l2_bytes
        self._written = torch.empty(self.bytes // 4, dtype=torch.int32, device=device)
        # Read as rows of 4 KB summed side by side: a bandwidth-bound pass (one whole-buffer sum
        # is a long latency-bound reduction).
        rows = self.bytes // 4 // _READ_ROW_WORDS
        self._read = torch.ones((rows, _READ_ROW_WORDS), dtype=torch.float32, device=device) if mode == "clean" else None
        self._row_sums = torch.empty(rows, dtype=torch.float32, device=device)

    def flush(self) -> None:
        self._zero(self._written)
        if self._read is not None:
            self._sum_rows(self._read, 1, out=self._row_sums)  # a read-only pass: the lines it leaves are clean


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
        return [self._elapsed(s, e) for s, e in zip(starts, ends)]


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


def make_timer(kind: str) -> Timer:
    """The timer ``choose_timer`` picked (one of ``TIMERS``)."""
    if kind == "events":
        return EventTimer()
    from dsa_bench.cupti_timer import CuptiTimer

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
    from dsa_bench.cupti_timer import cupti_problem

    problem = cupti_problem()
    if requested in ("cupti", "cupti_api") and problem is not None:
        raise DsaBenchError(f"CUPTI timing was requested but is unavailable: {problem}")
    if requested == "auto" and problem is not None:
        return "events", (
            f"CUPTI is unavailable ({problem}); timing with CUDA events instead. Event timings include "
            "launch gaps and see only the current stream; every result is labelled 'cuda_events'."
        )
    return ("cupti" if requested == "auto" else requested), None


class ClockReader:
    """SM and memory clocks of one GPU, read through NVML (nvidia-ml-py) or nvidia-smi.

    Clocks are read around every timed trial so a run whose SM clock sagged (thermal or power
    throttling) is flagged instead of silently reported.
    """

    def __init__(self, device_index: int) -> None:
        self.device_index = device_index
        self._nvml: object | None = None
        self._handle: object | None = None
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(device_index)
            # bound now, like the timers' functions
            self._clock_info, self._sm, self._mem = pynvml.nvmlDeviceGetClockInfo, pynvml.NVML_CLOCK_SM, pynvml.NVML_CLOCK_MEM
        except Exception:  # no NVML bindings: fall back to nvidia-smi
            self._nvml = None
        self._smi = _nvidia_smi

    def read(self) -> dict[str, int] | None:
        """Current clocks in MHz, or None when neither NVML nor nvidia-smi answers."""
        if self._nvml is not None:
            return {"sm_mhz": int(self._clock_info(self._handle, self._sm)), "mem_mhz": int(self._clock_info(self._handle, self._mem))}
        values = self._smi(self.device_index, "clocks.sm,clocks.mem")
        return None if values is None else {"sm_mhz": int(values[0]), "mem_mhz": int(values[1])}


def _nvidia_smi(device_index: int, fields: str) -> list[str] | None:
    import subprocess

    try:
        out = subprocess.run(
            ["nvidia-smi", f"--id={device_index}", f"--query-gpu={fields}", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout
        return [v.strip() for v in out.strip().split(",")]
    except (OSError, subprocess.SubprocessError, ValueError):
        return None


def driver_info(device_index: int) -> dict[str, object]:
    """Driver version and maximum clocks of a GPU, for the environment record."""
    values = _nvidia_smi(device_index, "driver_version,clocks.max.sm,clocks.max.mem,power.limit")
    if values is None:
        return {}
    keys = ("driver", "max_sm_mhz", "max_mem_mhz", "power_limit_w")
    return dict(zip(keys, values))


def measure_copy_bandwidth(device: torch.device, megabytes: int = 512, repeats: int = 20) -> float:
    """The device's copy bandwidth in bytes per second (bytes read plus bytes written), the best
    of ``repeats`` device-to-device copies of a buffer well past the L2. The harness bounds
    every reported time from below with it (runner.implausible_timing)."""
    count = megabytes * 2**20 // 4
    source = torch.ones(count, dtype=torch.float32, device=device)
    target = torch.empty_like(source)
    best = math.inf
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        target.copy_(source)
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / 1e3)
    del source, target
    torch.cuda.empty_cache()
    return 2 * count * 4 / best
