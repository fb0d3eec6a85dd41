"""Names turned into file names that stay in their folder, and paths from files kept inside theirs.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from dsa_bench.errors import DsaBenchError

#: Longest file name :func:`safe_file_name` returns (well below the usual 255-byte limit, so a
#: suffix such as ``.json`` or ``.log`` still fits).
MAX_FILE_NAME = 96


_SAFE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*")


_HASHED_TAIL = re.compile(r"-[0-9a-f]{16}$")


def safe_file_name(name: str) -> str:
    """``name`` as one file name that stays in its folder: only ``[A-Za-z0-9._-]``, never empty,
    ``.`` or ``..``, no leading ``.`` or ``-``, at most :data:`MAX_FILE_NAME` characters.

    A name that already is such a file name is kept. Any other name has its other characters
    replaced by ``_`` and a hash of the original appended (``-`` and 16 hex digits), so distinct
    names stay distinct (a kept name never ends the way a hashed one does: such names are hashed too).
    """
    if _SAFE_NAME.fullmatch(name) and len(name) <= MAX_FILE_NAME and not _HASHED_TAIL.search(name):
        return name
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    cleaned = re.sub(r"[^A-Za-z0-9._-]", "_", name)[: MAX_FILE_NAME - 17]
    if not cleaned or cleaned[0] in ".-":
        cleaned = "_" + cleaned[1:]
    return f"{cleaned}-{digest}"


def path_inside(folder: Path, relative: str, field: str, where: str) -> Path:
    """``folder / relative`` resolved (symbolic links followed); a path that leaves ``folder``
    (``..``, an absolute path, a link pointing out) raises, naming ``where`` and ``field``."""
    base = folder.resolve()
    target = (base / relative).resolve()
    if not target.is_relative_to(base):
        raise DsaBenchError(f"{field}: path {relative!r} resolves to {target}, outside {base}", where)
    return target
