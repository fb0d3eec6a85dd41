"""Emptying the L2 before a timed call, and the device copy bandwidth that bounds every timing.
"""

from __future__ import annotations

import math

import torch

from dsa_bench.errors import DsaBenchError

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
