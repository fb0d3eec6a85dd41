"""The packed Solution document (flashinfer-bench's schema): its checks and reading it from a file.
"""

from __future__ import annotations

import ast
from pathlib import Path, PurePosixPath
from typing import Any

from dsa_bench.errors import DsaBenchError
from dsa_bench.files import read_json

#: Languages of the flashinfer-bench schema (dsa-bench itself runs python, triton and cuda).
SCHEMA_LANGUAGES = ("python", "triton", "cpp", "cuda", "tilelang")


SCHEMA_BINDINGS = ("tvm-ffi", "torch")


def check_solution_document(data: Any, where: str) -> None:
    """Raise unless ``data`` satisfies the flashinfer-bench Solution schema (and dsa-bench can run it).

    The rules are those of flashinfer-bench's ``Solution`` model: non-empty name, definition and
    author; spec with a known language, at least one target, ``file::function`` entry point,
    string dependencies and a boolean destination_passing_style; at least one source, each with
    a relative path (no ``..``) and non-empty content; unique paths; the entry file among them.
    dsa-bench adds: a python/triton entry is a ``.py`` file and every ``.py`` source parses.
    """

    def fail(message: str) -> None:
        raise DsaBenchError(message, where)

    if not isinstance(data, dict):
        fail("a Solution must be a JSON object")
    for key in ("name", "definition", "author"):
        if not isinstance(data.get(key), str) or not data[key]:
            fail(f"field {key!r} must be a non-empty string")
    if data.get("description") is not None and not isinstance(data["description"], str):
        fail("field 'description' must be a string or null")
    spec = data.get("spec")
    if not isinstance(spec, dict):
        fail("field 'spec' must be an object")
    if spec.get("language") not in SCHEMA_LANGUAGES:
        fail(f"spec.language must be one of {', '.join(SCHEMA_LANGUAGES)}, got {spec.get('language')!r}")
    hardware = spec.get("target_hardware")
    if not isinstance(hardware, list) or not hardware or not all(isinstance(h, str) for h in hardware):
        fail("spec.target_hardware must be a non-empty list of strings")
    entry_point = spec.get("entry_point")
    if not isinstance(entry_point, str) or entry_point.count("::") != 1 or not all(entry_point.split("::")):
        fail(f"spec.entry_point must look like 'file::function', got {entry_point!r}")
    deps = spec.get("dependencies", [])
    if not isinstance(deps, list) or not all(isinstance(d, str) and d for d in deps):
        fail("spec.dependencies must be a list of non-empty strings")
    if not isinstance(spec.get("destination_passing_style", True), bool):
        fail("spec.destination_passing_style must be true or false")
    if spec.get("binding") is not None and spec["binding"] not in SCHEMA_BINDINGS:
        fail(f"spec.binding must be one of {', '.join(SCHEMA_BINDINGS)} or null")
    sources = data.get("sources")
    if not isinstance(sources, list) or not sources:
        fail("field 'sources' must be a non-empty list")
    seen: set[str] = set()
    for i, source in enumerate(sources):
        if not isinstance(source, dict) or not isinstance(source.get("path"), str) or not source["path"]:
            fail(f"sources[{i}] must be an object with a non-empty string 'path'")
        path = source["path"]
        if not isinstance(source.get("content"), str) or not source["content"]:
            fail(f"sources[{i}] ({path!r}): 'content' must be a non-empty string")
        problem = source_path_problem(path)
        if problem:
            fail(f"sources[{i}].path {path[:60]!r}{'...' if len(path) > 60 else ''}: {problem}")
        if not _encodable(source["content"]):
            fail(f"sources[{i}] ({path}): 'content' is not valid Unicode text (it holds a lone surrogate such as \\udc80)")
        if path in seen:
            fail(f"sources[{i}]: duplicate path {path!r}")
        seen.add(path)
        if path.endswith(".py"):
            try:
                ast.parse(source["content"], filename=path)
            except SyntaxError as exc:
                fail(f"sources[{i}] ({path}) is not valid Python: {exc.msg} at line {exc.lineno}")
            except (RecursionError, MemoryError):
                fail(f"sources[{i}] ({path}) is Python nested too deeply to parse")
    folders = {parent.as_posix() for path in seen for parent in PurePosixPath(path).parents if parent.parts}
    for i, source in enumerate(sources):
        if source["path"] in folders:
            fail(f"sources[{i}].path {source['path']!r}: is a file, but other sources lie inside it as a folder")
    entry_file = entry_point.split("::")[0]
    if entry_file not in seen:
        fail(f"entry file {entry_file!r} of spec.entry_point is not among the sources")
    if spec["language"] in ("python", "triton") and not entry_file.endswith(".py"):
        fail(f"a {spec['language']} entry point must be a .py file, got {entry_file!r}")


#: Longest file name component (bytes) and source path a packed Solution may use (Linux limits).
_NAME_MAX = 255


_PATH_MAX = 1024


def source_path_problem(path: str) -> str | None:
    """Why ``path`` cannot be a source's path inside a solution folder, or None.

    Refused before anything is written: what the file system would reject (NUL and control
    bytes, over-long names) and what would leave the folder or alias another path.
    """
    if not _encodable(path):
        return "expected valid Unicode text (it holds a lone surrogate)"
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in path):
        return "expected no control characters (NUL, newline, ...)"
    pure = PurePosixPath(path)
    if pure.is_absolute() or ".." in pure.parts or "\\" in path:
        return "must be relative, with '/' separators and no '..'"
    if "/".join(pure.parts) != path:
        return "expected a normalised path (no '.', empty or trailing components)"
    if len(path.encode()) > _PATH_MAX or any(len(part.encode()) > _NAME_MAX for part in pure.parts):
        return f"expected at most {_PATH_MAX} bytes, and at most {_NAME_MAX} bytes per name"
    return None


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def read_solution_document(path: Path) -> dict[str, Any]:
    data = read_json(path, "packed solution")
    check_solution_document(data, str(path))
    return data
