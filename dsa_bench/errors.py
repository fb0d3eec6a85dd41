"""User-facing errors.

Anything the user can fix (a bad file, an unknown name, an inconsistent trace) raises
:class:`DsaBenchError` with a message naming the file, line, field or case. The CLI prints the
message without a traceback and exits non-zero.
"""

from __future__ import annotations

import difflib
import textwrap
from collections.abc import Iterable


class DsaBenchError(Exception):
    """An error caused by the user's input or environment, reported without a traceback."""

    def __init__(self, message: str, where: str | None = None) -> None:
        self.where = where
        super().__init__(f"{where}: {message}" if where else message)


def name_list(names: Iterable[str], width: int = 100) -> str:
    """Names as indented lines of at most ``width`` characters, for the end of a message."""
    return textwrap.fill(", ".join(names) or "(none)", width=width, initial_indent="  ", subsequent_indent="  ", break_on_hyphens=False)


def did_you_mean(name: str, choices: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest of ``choices`` to a mistyped ``name``, else ``""``."""
    close = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""
