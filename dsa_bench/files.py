"""Reading the user's JSON, JSONL and YAML files with errors that name the file and line; names
turned into file names, and paths kept inside their folders."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

import yaml

from dsa_bench.errors import DsaBenchError


def _text(path: Path, kind: str) -> str:
    try:
        return path.read_text()
    except OSError as exc:
        raise DsaBenchError(f"cannot read {kind} file: {exc.strerror}", str(path)) from None


def read_json(path: Path, kind: str) -> Any:
    """The JSON document in ``path`` (a ``kind`` file, for messages)."""
    try:
        return json.loads(_text(path, kind))
    except json.JSONDecodeError as exc:
        raise DsaBenchError(f"invalid JSON: {exc.msg} at line {exc.lineno}", str(path)) from None


def read_jsonl(path: Path, kind: str) -> list[tuple[str, Any]]:
    """The JSON value of every non-blank line with its "file:line"; errors name the line."""
    records = []
    for number, line in enumerate(_text(path, kind).splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            records.append((where, json.loads(line)))
        except json.JSONDecodeError as exc:
            raise DsaBenchError(f"invalid JSON: {exc.msg} at column {exc.colno}", where) from None
    return records


def read_yaml(path: Path, kind: str) -> Any:
    """The YAML document in ``path``; a syntax error names the line."""
    try:
        return yaml.safe_load(_text(path, kind))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        raise DsaBenchError(f"malformed YAML: {getattr(exc, 'problem', exc)}", f"{path}{line}") from None


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
