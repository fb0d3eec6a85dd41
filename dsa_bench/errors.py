"""User-facing errors.

Anything the user can fix (a bad file, an unknown name, an inconsistent trace) raises
:class:`DsaBenchError` with a message naming the file, line, field or case. The CLI prints the
message without a traceback and exits non-zero.
"""

from __future__ import annotations


class DsaBenchError(Exception):
    """An error caused by the user's input or environment, reported without a traceback."""

    def __init__(self, message: str, where: str | None = None) -> None:
        self.where = where
        super().__init__(f"{where}: {message}" if where else message)
