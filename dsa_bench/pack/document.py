"""The packed Solution document (flashinfer-bench's schema): its model, the checks across its sources, and reading it from a file.

:class:`SolutionDocumentModel` validates each part (fields the ecosystem may add are allowed, as
its own models ignore them); :func:`check_solution_document` adds what spans several sources.
"""

from __future__ import annotations

import ast
from pathlib import Path, PurePosixPath
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BeforeValidator, Field, ValidationInfo, field_validator, model_validator

from dsa_bench.errors import DsaBenchError
from dsa_bench.files import check_document, field_sentence, read_json
from dsa_bench.models import Name, OpenModel


def _non_empty_string(value: Any) -> Any:
    if not isinstance(value, str) or not value:
        raise field_sentence(f"must be a non-empty string, got {value!r}")
    return value


NonEmptyString = Annotated[str, BeforeValidator(_non_empty_string)]


def _file_function(value: str) -> str:
    if value.count("::") != 1 or not all(value.split("::")):
        raise field_sentence(f"must look like 'file::function', got {value!r}")
    return value


class SpecModel(OpenModel):
    """``spec`` of a packed Solution: how to build and call it."""

    # the schema's languages (dsa-bench itself runs python, triton and cuda); before entry_point, whose check reads it
    language: Literal["python", "triton", "cpp", "cuda", "tilelang"]
    target_hardware: Annotated[list[str], Field(min_length=1)]
    entry_point: Annotated[str, AfterValidator(_file_function)]
    dependencies: list[Name] = []
    destination_passing_style: bool = True
    binding: Literal["tvm-ffi", "torch"] | None = None

    @field_validator("entry_point")
    @classmethod
    def _python_entry_is_a_py_file(cls, entry_point: str, info: ValidationInfo) -> str:
        language, file = info.data.get("language"), entry_point.split("::")[0]
        if language in ("python", "triton") and not file.endswith(".py"):
            raise ValueError(f"a {language} entry must be a .py file, got {file!r}")
        return entry_point


# Both run before the string checks, which cannot read a lone surrogate.


def _source_path(path: Any) -> Any:
    problem = source_path_problem(path) if isinstance(path, str) and path else None
    if problem:
        raise field_sentence(f"{path[:60]!r}{'...' if len(path) > 60 else ''}: {problem}")
    return path


def _unicode_text(content: Any) -> Any:
    if isinstance(content, str) and not _encodable(content):
        raise ValueError("not valid Unicode text (it holds a lone surrogate such as \\udc80)")
    return content


class SourceModel(OpenModel):
    """One of a packed Solution's ``sources``: a file of the solution folder; a .py file must parse."""

    path: Annotated[Name, BeforeValidator(_source_path)]  # relative, inside the folder it is unpacked into
    content: Annotated[Name, BeforeValidator(_unicode_text)]

    @model_validator(mode="after")
    def _python_parses(self) -> SourceModel:
        if self.path.endswith(".py"):
            try:
                ast.parse(self.content, filename=self.path)
            except SyntaxError as exc:
                raise field_sentence(f"({self.path}) is not valid Python: {exc.msg} at line {exc.lineno}") from None
            except (RecursionError, MemoryError):
                raise field_sentence(f"({self.path}) is Python nested too deeply to parse") from None
        return self


class SolutionDocumentModel(OpenModel):
    """A packed Solution (flashinfer-bench's schema; fields dsa-bench does not read may be present)."""

    name: NonEmptyString
    definition: NonEmptyString
    author: NonEmptyString
    description: str | None = None
    spec: SpecModel
    sources: Annotated[list[SourceModel], Field(min_length=1)]


def check_solution_document(data: Any, where: str) -> None:
    """Raise unless ``data`` satisfies the flashinfer-bench Solution schema (and dsa-bench can run it).

    The rules are those of flashinfer-bench's ``Solution`` model: non-empty name, definition and
    author; spec with a known language, at least one target, ``file::function`` entry point,
    string dependencies and a boolean destination_passing_style; at least one source, each with
    a relative path (no ``..``) and non-empty content; unique paths; the entry file among them.
    dsa-bench adds: a python/triton entry is a ``.py`` file and every ``.py`` source parses.
    :class:`SolutionDocumentModel` checks each part; the rules across sources are code here.
    """
    document = check_document(SolutionDocumentModel, data, where)
    seen: set[str] = set()
    for i, source in enumerate(document.sources):
        if source.path in seen:
            raise DsaBenchError(f"sources[{i}]: duplicate path {source.path!r}", where)
        seen.add(source.path)
    folders = {parent.as_posix() for path in seen for parent in PurePosixPath(path).parents if parent.parts}
    for i, source in enumerate(document.sources):
        if source.path in folders:
            raise DsaBenchError(f"sources[{i}].path {source.path!r}: is a file, but other sources lie inside it as a folder", where)
    entry_file = document.spec.entry_point.split("::")[0]
    if entry_file not in seen:
        raise DsaBenchError(f"entry file {entry_file!r} of spec.entry_point is not among the sources", where)


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
