"""The pipe between the harness and a solution's worker: length-prefixed frames, nothing unpickled
on the judging side.

A frame is a 12-byte prefix (``u32`` header length, ``u64`` blob length, little endian), a JSON
header, and an optional blob. Either side names the largest header and blob it will accept
before reading, so a solution that writes garbage into its process's end of the pipe can only
make the harness refuse the message.

- harness -> worker: the header names the request; the blob is a pickle of the job. The worker
  trusts the harness, so unpickling there is safe.
- worker -> harness: the header is plain JSON that the harness validates field by field
  (:mod:`dsa_bench.run.protocol`); tensors travel as one safetensors blob (raw bytes behind a
  JSON header, parsed without executing anything) whose names, dtypes and shapes the harness
  checks against the definition before use.
"""

from __future__ import annotations

import json
import os
import select
import struct
import time
from typing import Any

_PREFIX = struct.Struct("<IQ")
#: the largest JSON header either side accepts (timings of 100 trials x 100000 calls fit)
MAX_HEADER_BYTES = 64 * 2**20


class ChannelError(Exception):
    """The other side sent something that is not a valid frame, or went away."""


class ChannelTimeout(ChannelError):
    """No complete frame arrived (or could be sent) before the deadline."""


class ChannelClosed(ChannelError):
    """The other side closed its end (a worker that died)."""


def write_frame(fd: int, header: dict[str, Any], blob: bytes = b"", timeout: float | None = None) -> None:
    """Send one frame. With ``timeout`` (for a non-blocking ``fd``), give up with
    :class:`ChannelTimeout` when the other side has not taken every byte by then."""
    head = json.dumps(header, allow_nan=False).encode()
    data = memoryview(_PREFIX.pack(len(head), len(blob)) + head + blob)
    deadline = None if timeout is None else time.monotonic() + timeout
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    while data:
        if deadline is not None and not poller.poll(max(0, int((deadline - time.monotonic()) * 1000))):
            raise ChannelTimeout(f"the other side took {len(data)} bytes too few before the deadline")
        try:
            written = os.write(fd, data)
        except BlockingIOError:
            continue
        except BrokenPipeError:
            raise ChannelClosed("the other side closed the pipe") from None
        data = data[written:]


def _read_exactly(fd: int, count: int, deadline: float | None) -> bytes:
    chunks: list[bytes] = []
    left = count
    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
    while left:
        if deadline is not None:
            wait_ms = max(0, int((deadline - time.monotonic()) * 1000))
            if not poller.poll(wait_ms):
                raise ChannelTimeout(f"no complete message within the deadline ({count - left} of {count} bytes arrived)")
        chunk = os.read(fd, min(left, 1 << 24))
        if not chunk:
            raise ChannelClosed("the other side closed the pipe")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def read_frame(fd: int, max_blob_bytes: int, timeout: float | None = None) -> tuple[Any, bytes]:
    """The next frame's (decoded JSON header, blob). Raises :class:`ChannelTimeout` when nothing
    complete arrives within ``timeout`` seconds, :class:`ChannelError` on a malformed or oversized
    frame or a closed pipe."""
    deadline = None if timeout is None else time.monotonic() + timeout
    head_len, blob_len = _PREFIX.unpack(_read_exactly(fd, _PREFIX.size, deadline))
    if head_len > MAX_HEADER_BYTES:
        raise ChannelError(f"message header of {head_len} bytes exceeds the limit of {MAX_HEADER_BYTES}")
    if blob_len > max_blob_bytes:
        raise ChannelError(f"message carries {blob_len} bytes of tensors, more than the {max_blob_bytes} its definition allows")
    head = _read_exactly(fd, head_len, deadline)
    blob = _read_exactly(fd, blob_len, deadline) if blob_len else b""
    try:
        header = json.loads(head.decode(), parse_constant=_refuse_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ChannelError(f"message header is not valid JSON ({type(exc).__name__}: {exc})") from None
    return header, blob


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not allowed in a message")
