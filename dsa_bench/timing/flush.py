"""Emptying the L2 before a timed call, and the device copy bandwidth that bounds every timing.
"""

from __future__ import annotations

import ctypes
import math
from typing import Any

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

    Both modes first reset the persisting-L2 carve-out (:class:`PersistingL2Reset`), then write
    a buffer of twice the L2's size. Writes always allocate in L2, so this
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

    def __init__(self, device: torch.device, mode: str = L2_FLUSH_MODES[0], persisting: PersistingL2Reset | None = None) -> None:
        self.mode = check_l2_flush(mode)
        # Bound now: a later patch of torch's functions cannot turn the flush into a no-op.
        self._zero, self._sum_rows = torch.Tensor.zero_, torch.sum
        l2_bytes = int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0)) or 64 * 2**20
        # Persisting lines survive the buffers below; they are reset first (PersistingL2Reset), through
        # the CUDA runtime the line above has loaded and initialized.
        self.persisting = persisting if persisting is not None else PersistingL2Reset(device)
        self._reset_persisting = self.persisting.reset
        self.bytes = 2 * l2_bytes
        self._written = torch.empty(self.bytes // 4, dtype=torch.int32, device=device)
        # Read as rows of 4 KB summed side by side: a bandwidth-bound pass (one whole-buffer sum
        # is a long latency-bound reduction).
        rows = self.bytes // 4 // _READ_ROW_WORDS
        self._read = torch.ones((rows, _READ_ROW_WORDS), dtype=torch.float32, device=device) if mode == "clean" else None
        self._row_sums = torch.empty(rows, dtype=torch.float32, device=device)

    def flush(self) -> None:
        self._reset_persisting()
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


# --------------------------------------------------------------------------- the persisting-L2 carve-out

#: CUDA enum values, the same in the runtime and the driver API (driver_types.h, cuda.h)
_LIMIT_PERSISTING_L2_CACHE_SIZE = 0x06  # cudaLimitPersistingL2CacheSize, CU_LIMIT_PERSISTING_L2_CACHE_SIZE
_ATTR_MAX_PERSISTING_L2_CACHE_SIZE = 108  # cudaDevAttrMaxPersistingL2CacheSize, CU_DEVICE_ATTRIBUTE_...
_STREAM_ATTRIBUTE_ACCESS_POLICY_WINDOW = 1  # cudaStreamAttributeAccessPolicyWindow, CU_STREAM_ATTRIBUTE_...
#: cudaStreamAttrValue / CUstreamAttrValue is a union padded to 64 bytes (CUDA 12+; 32 in CUDA 11);
#: all zero is an access-policy window of 0 bytes, hit and miss properties "normal"
_STREAM_ATTR_VALUE_BYTES = 64

#: the function names of each API (the driver keeps no "last error" to clear)
#: CUDA errors a faulting kernel leaves in its context (the same numbers in the runtime and the driver API):
#: every later call returns them, so the harness's next call reports the solution's fault
STICKY_CUDA_ERRORS = {700: "illegal address", 702: "launch timeout", 710: "device-side assert", 714: "hardware stack error",
                      715: "illegal instruction", 716: "misaligned address", 717: "invalid address space", 718: "invalid pc",
                      719: "launch failure"}  # fmt: skip
#: CUDA errors of a stream capture (the same numbers in both APIs): calls such as setting a limit are refused while
#: a capture the solution began is open, or after it was invalidated
STREAM_CAPTURE_ERRORS = {900: "operation not permitted when stream is capturing", 901: "capture invalidated", 904: "capture unjoined",
                         905: "capture isolation", 906: "implicit capture", 908: "capture on another thread"}  # fmt: skip
_RUNTIME_API = {"attribute": "cudaDeviceGetAttribute", "reset": "cudaCtxResetPersistingL2Cache", "set_limit": "cudaDeviceSetLimit",
                "get_stream_attribute": "cudaStreamGetAttribute", "stream_attribute": "cudaStreamSetAttribute",
                "last_error": "cudaGetLastError"}  # fmt: skip
_DRIVER_API = {"attribute": "cuDeviceGetAttribute", "reset": "cuCtxResetPersistingL2Cache", "set_limit": "cuCtxSetLimit",
               "get_stream_attribute": "cuStreamGetAttribute", "stream_attribute": "cuStreamSetAttribute"}  # fmt: skip


def _loaded_cudart() -> str | None:
    """The path of the CUDA runtime library this process has mapped (torch's), if any: calling the
    very runtime torch uses keeps one primary context and one error state."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.split()[-1] if line.strip() else ""
                if "/libcudart.so" in path:
                    return path
    except OSError:
        return None
    return None


def _open_cuda_api() -> tuple[Any, dict[str, str], str]:
    """(library, function names, description): torch's CUDA runtime, else the driver API."""
    path = _loaded_cudart()
    if path is not None:
        return ctypes.CDLL(path), _RUNTIME_API, f"CUDA runtime {path}"
    try:
        return ctypes.CDLL("libcuda.so.1"), _DRIVER_API, "CUDA driver libcuda.so.1"
    except OSError as error:
        raise DsaBenchError(
            f"cannot reset the persisting L2: no CUDA runtime is loaded and the driver cannot be opened ({error})"
        ) from None


class PersistingL2Reset:
    """Undoes, before every flush, what a solution can do to keep its inputs in the L2 across it.

    Since Ampere, part of the L2 can be set aside for *persisting* accesses: a solution that sets
    the carve-out (``cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, n)``), puts an access-policy
    window with a persisting hit property on its stream and reads its inputs once, keeps them
    through a streaming flush, because the flush's own accesses are normal ones and never evict
    persisting lines. The reset clears the access-policy window of the stream the harness times on
    (when it holds one; a stream that takes no window, as the legacy default stream may not, has
    none to clear), turns every persisting line back into a normal one
    (``cudaCtxResetPersistingL2Cache``) and sets the carve-out back to 0, so that no access can
    persist until the solution's next call sets it again. The flush that follows then evicts
    everything; a window left on another stream only steers that solution's accesses during its
    own call, which find their data evicted.

    Every call is checked: a failure raises (the case ends as RUNTIME_ERROR), never a silent
    flush that may leave pinned lines. A device without a carve-out (max persisting size 0, as
    before Ampere or under MIG) has nothing to reset, and ``active`` says so.
    """

    def __init__(self, device: torch.device, api: tuple[Any, dict[str, str], str] | None = None) -> None:
        self._library, names, self.source = api if api is not None else _open_cuda_api()
        self._names = names
        # Bound now, like the flush: a later patch of ctypes or torch cannot undo the reset.
        self._calls = {role: getattr(self._library, name) for role, name in names.items()}
        index = device.index if device.index is not None else torch.cuda.current_device()
        value = ctypes.c_int(0)
        self._check("attribute", self._calls["attribute"](ctypes.byref(value), _ATTR_MAX_PERSISTING_L2_CACHE_SIZE, index))
        self.max_persisting_bytes = value.value
        self.active = self.max_persisting_bytes > 0
        self._stream_of = torch.cuda.current_stream
        self._device = device
        self._window = ctypes.create_string_buffer(_STREAM_ATTR_VALUE_BYTES)  # all zero: no window

    def _check(self, role: str, code: int) -> None:
        if code in STICKY_CUDA_ERRORS:
            raise RuntimeError(f"{self._names[role]} failed with CUDA error {code} ({STICKY_CUDA_ERRORS[code]}, {self.source}): "
                               "a kernel fault, which every later CUDA call reports; the solution's previous call most likely "
                               "caused it (this reset is the harness's first CUDA call after it)")  # fmt: skip
        if code in STREAM_CAPTURE_ERRORS:
            raise RuntimeError(f"{self._names[role]} failed with CUDA error {code} ({STREAM_CAPTURE_ERRORS[code]}, {self.source}): "
                               "a CUDA graph capture is open or broken in this process; the solution's previous call most likely "
                               "left it so (this reset is the harness's first CUDA call after it)")  # fmt: skip
        if code != 0:
            raise RuntimeError(f"{self._names[role]} failed with CUDA error {code} ({self.source}): "
                               "the L2 cannot be emptied of persisting lines, so no honest timing is possible")  # fmt: skip

    def reset(self) -> None:
        if not self.active:
            return
        stream = ctypes.c_void_p(self._stream_of(self._device).cuda_stream)
        if self._calls["get_stream_attribute"](stream, _STREAM_ATTRIBUTE_ACCESS_POLICY_WINDOW, self._window) != 0:
            # This stream takes no window, so none was set on it; the runtime's "last error" is cleared
            # so that torch's next launch check does not report it.
            if "last_error" in self._calls:
                self._calls["last_error"]()
        elif int.from_bytes(self._window.raw[8:16], "little"):  # the window's num_bytes (after its base_ptr)
            ctypes.memset(self._window, 0, _STREAM_ATTR_VALUE_BYTES)  # a window of 0 bytes: none
            self._check("stream_attribute", self._calls["stream_attribute"](stream, _STREAM_ATTRIBUTE_ACCESS_POLICY_WINDOW, self._window))
        self._check("reset", self._calls["reset"]())
        self._check("set_limit", self._calls["set_limit"](_LIMIT_PERSISTING_L2_CACHE_SIZE, ctypes.c_size_t(0)))
