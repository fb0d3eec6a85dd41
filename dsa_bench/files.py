"""Reading the user's JSON, JSONL and YAML files with errors that name the file and line."""

from __future__ import annotations

import json
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


def safe_file_name(name: str) -> str:
    """``name`` as one safe path component (placeholder until the names work lands)."""
    import hashlib
    import re

    clean = re.sub(r"[^A-Za-z0-9._-]", "_", name)[:80].strip(".") or "_"
    return clean if clean == name else f"{clean}-{hashlib.sha1(name.encode()).hexdigest()[:8]}"
