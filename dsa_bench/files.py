"""Reading the user's JSON, JSONL and YAML files, writing dsa-bench's own files, turning names into
file names and keeping paths inside their folders.

Reading is strict and bounded, so a hostile or broken file gets one message naming the file
and line, never a traceback or a minutes-long grind:

- a file is read as UTF-8 only; a decoding error names the line and byte offset;
- a file larger than :data:`MAX_TEXT_BYTES`, or not a regular file, is refused before reading;
- JSON and YAML nested deeper than :data:`MAX_NESTING` levels are refused (Python's parsers
  would hit the recursion limit), as is a YAML document whose aliases expand to more than
  :data:`MAX_YAML_NODES` nodes (an "alias bomb": a few lines that expand to billions of
  values for whoever walks them) or refer to themselves;
- a key given twice in one JSON object or YAML mapping is refused (a parser silently keeps
  the last one).

Writing is atomic: the new content goes to a temporary file in the same folder, which then
replaces the target (:func:`write_atomic`), so a reader never sees half a file and a failed
write leaves the old file and no temporary file. :func:`check_output_path` refuses, before
any work is done, an output path that would overwrite an input or a file of another kind.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import stat
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import yaml

from dsa_bench.errors import DsaBenchError, did_you_mean

if TYPE_CHECKING:  # pydantic is imported only when a document is checked
    from pydantic import BaseModel
    from pydantic_core import ErrorDetails

#: Largest JSON, JSONL or YAML file dsa-bench reads (results files of full runs are a few MB).
MAX_TEXT_BYTES = 64 * 1024 * 1024


#: Deepest nesting of lists and objects accepted in JSON and YAML (dsa-bench's own files use < 10).
MAX_NESTING = 100


#: Most nodes a YAML document may expand to, counting every use of an alias in full.
MAX_YAML_NODES = 100_000


def read_text(path: Path, kind: str) -> str:
    """The text of ``path`` (a ``kind`` file, for messages), decoded strictly as UTF-8."""
    try:
        info = path.stat()
        if not stat.S_ISREG(info.st_mode):
            what = "a folder" if stat.S_ISDIR(info.st_mode) else "not a regular file"
            raise DsaBenchError(f"cannot read {kind} file: it is {what}", str(path))
        if info.st_size > MAX_TEXT_BYTES:
            raise DsaBenchError(f"{kind} file is {info.st_size} bytes; dsa-bench reads at most {MAX_TEXT_BYTES}", str(path))
        with path.open("rb") as f:
            data = f.read(MAX_TEXT_BYTES + 1)
    except OSError as exc:
        raise DsaBenchError(f"cannot read {kind} file: {exc.strerror or exc}", str(path)) from None
    except ValueError as exc:  # e.g. an embedded NUL byte in the path
        raise DsaBenchError(f"cannot read {kind} file: {exc}", repr(str(path))) from None
    if len(data) > MAX_TEXT_BYTES:
        raise DsaBenchError(f"{kind} file grew past {MAX_TEXT_BYTES} bytes while being read", str(path))
    if data.startswith(LFS_POINTER_PREFIX):
        raise DsaBenchError(lfs_pointer_message(path, kind), str(path))
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise DsaBenchError(
            f"not UTF-8 text: byte 0x{data[exc.start]:02x} at byte offset {exc.start} ({exc.reason}); {kind} files must be UTF-8",
            f"{path}:{line}",
        ) from None


#: How a Git LFS pointer file begins: the small text file a clone without LFS objects holds in
#: place of the real one (``version https://git-lfs.github.com/spec/v1``, ``oid sha256:...``, ``size N``).
LFS_POINTER_PREFIX = b"version https://git-lfs."


def is_lfs_pointer(path: Path) -> bool:
    try:
        with path.open("rb") as f:
            return f.read(len(LFS_POINTER_PREFIX)) == LFS_POINTER_PREFIX
    except (OSError, ValueError):
        return False


def lfs_pointer_message(path: Path, kind: str) -> str:
    """What to say about a ``kind`` file that is a Git LFS pointer: what it is and the command that fetches the real file."""
    resolved = path.resolve()
    repository = next((p for p in resolved.parents if (p / ".git").exists()), None)
    if repository is None:
        fetch = "in the git repository it was cloned from, run: git lfs pull --include <its path in that repository>"
    else:
        inside = shlex.quote(resolved.relative_to(repository).as_posix())
        fetch = f"fetch it with: git -C {shlex.quote(str(repository))} lfs pull --include {inside}"
    return (
        f"this {kind} file is a Git LFS pointer (a small text file standing for the real one), not the file itself: "
        f"the repository was cloned without its LFS objects; {fetch}"
    )


_JSON_NESTING_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]')


def _check_json_nesting(text: str, where: Callable[[int | None], str]) -> None:
    """Refuse JSON nested deeper than MAX_NESTING; ``where(offset)`` names the place."""
    if text.count("[") + text.count("{") <= MAX_NESTING:
        return
    depth = 0
    for match in _JSON_NESTING_TOKENS.finditer(text):
        token = match.group()
        if token in "[{":
            depth += 1
            if depth > MAX_NESTING:
                raise DsaBenchError(f"JSON nested deeper than {MAX_NESTING} levels", where(match.start()))
        elif token in "]}":
            depth -= 1


def _object_without_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    document = dict(pairs)
    if len(document) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _DuplicateKey(key)
            seen.add(key)
    return document


class _DuplicateKey(Exception):
    pass


def _parse_json(text: str, where: Callable[[int | None], str]) -> Any:
    _check_json_nesting(text, where)
    try:
        return json.loads(text, object_pairs_hook=_object_without_duplicates)
    except json.JSONDecodeError as exc:
        raise DsaBenchError(f"invalid JSON: {exc.msg} at column {exc.colno}", where(exc.pos)) from None
    except _DuplicateKey as exc:
        raise DsaBenchError(f"invalid JSON: key {exc.args[0]!r} appears twice in one object", where(None)) from None
    except (ValueError, RecursionError) as exc:  # e.g. an integer of more than 4300 digits
        raise DsaBenchError(f"invalid JSON: {str(exc).split(';')[0]}", where(None)) from None


def read_json(path: Path, kind: str) -> Any:
    """The JSON document in ``path`` (a ``kind`` file, for messages)."""
    text = read_text(path, kind)

    def where(offset: int | None) -> str:
        return str(path) if offset is None else f"{path}:{text.count(chr(10), 0, offset) + 1}"

    return _parse_json(text, where)


def read_jsonl(path: Path, kind: str) -> list[tuple[str, Any]]:
    """The JSON value of every non-blank line with its "file:line"; errors name the line."""
    records = []
    # only "\n" ends a line: str.splitlines() would also split inside strings at U+2028 and others
    for number, line in enumerate(read_text(path, kind).split("\n"), start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        records.append((where, _parse_json(line, _always(where))))
    return records


def _always(where: str) -> Callable[[int | None], str]:
    """A place for :func:`_parse_json` that is the same whatever the offset (one JSONL line)."""
    return lambda offset: where


class _YamlLimit(yaml.MarkedYAMLError):
    """A document beyond dsa-bench's bounds (reported like a syntax error, with its line)."""

    def __init__(self, problem: str, mark: Any) -> None:
        super().__init__(problem=problem, problem_mark=mark)


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader with bounded nesting and alias expansion, and no duplicate keys.

    Composing counts each node's expanded size (an alias counts the whole node it refers to)
    and height (levels of lists and mappings) as the node is finished, so an alias bomb is refused after composing a few
    hundred nodes instead of being handed to code that walks billions.
    """

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._measures: dict[int, tuple[int, int]] = {}  # id(node) -> (expanded size, height)

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            node = super().compose_node(parent, index)
            if id(node) not in self._measures:
                raise _YamlLimit(f"alias *{event.anchor} refers to a node that contains it", event.start_mark)
            return node
        if self._depth > MAX_NESTING:  # every enclosing node is a list or mapping
            raise _YamlLimit(f"YAML nested deeper than {MAX_NESTING} levels", event.start_mark)
        self._depth += 1
        try:
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
        assert node is not None, "PyYAML composes a node for every event it accepts (its stubs allow None)"
        if isinstance(node, yaml.SequenceNode):
            children = node.value
        elif isinstance(node, yaml.MappingNode):
            children = [child for pair in node.value for child in pair]
        else:
            children = []
        measures = [self._measures[id(child)] for child in children]
        size = 1 + sum(m[0] for m in measures)
        height = 0 if isinstance(node, yaml.ScalarNode) else 1 + max((m[1] for m in measures), default=0)
        if size > MAX_YAML_NODES:
            raise _YamlLimit(f"YAML aliases expand this node to more than {MAX_YAML_NODES} values", node.start_mark)
        if height > MAX_NESTING:
            raise _YamlLimit(f"YAML nested deeper than {MAX_NESTING} levels (counting what its aliases expand to)", node.start_mark)
        self._measures[id(node)] = (size, height)
        return node

    def construct_object(self, node: Any, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep)
        except (ValueError, OverflowError) as exc:  # e.g. the date 2024-13-01, or a 5000-digit integer
            raise _YamlLimit(f"cannot read value {node.value!r:.60}: {exc}", node.start_mark) from None

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        if isinstance(node, yaml.MappingNode):
            seen: set[tuple[str, str]] = set()
            for key, _ in node.value:
                if isinstance(key, yaml.ScalarNode) and key.tag != "tag:yaml.org,2002:merge":
                    if (key.tag, key.value) in seen:
                        raise _YamlLimit(f"key {key.value!r} appears twice in one mapping", key.start_mark)
                    seen.add((key.tag, key.value))
        return super().construct_mapping(node, deep)


def read_yaml(path: Path, kind: str) -> Any:
    """The YAML document in ``path``; a syntax error names the line."""
    text = read_text(path, kind)
    loader = None
    try:
        loader = _BoundedLoader(text)
        return loader.get_single_data()
    except yaml.reader.ReaderError as exc:  # a character YAML does not allow, e.g. a NUL byte
        line = text.count("\n", 0, exc.position) + 1
        raise DsaBenchError(f"malformed YAML: character #x{exc.character:04x} is not allowed in YAML", f"{path}:{line}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at_line = f":{mark.line + 1}" if mark is not None else ""
        raise DsaBenchError(f"malformed YAML: {getattr(exc, 'problem', None) or exc}", f"{path}{at_line}") from None
    finally:
        if loader is not None:
            loader.dispose()


Model = TypeVar("Model", bound="BaseModel")


def _location(loc: Iterable[Any]) -> str:
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "(the document)"


def _shown(value: Any) -> str:
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return f"a list of {len(value)}"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


_EXPECTED = {
    "string_type": "a string",
    "string_too_short": "a non-empty string",
    "string_unicode": "valid Unicode text (no lone surrogates)",
    "int_type": "an integer",
    "int_from_float": "an integer",
    "float_type": "a number",
    "finite_number": "a finite number",
    "bool_type": "true or false",
    "list_type": "a list",
    "dict_type": "an object",
    "model_type": "an object",
    "model_attributes_type": "an object",
    "none_required": "null",
}


#: Error type of :func:`field_sentence`.
_FIELD_SENTENCE = "field_sentence"


def field_sentence(text: str) -> Exception:
    """The error a model's validator raises for a message in its own words that reads on from the
    field's name: ``inputs.x.value`` + ``must be a finite number, got nan`` (a top-level field is
    named ``field 'x'``). A plain ValueError's text follows the name and a colon instead."""
    from pydantic_core import PydanticCustomError

    return PydanticCustomError(_FIELD_SENTENCE, "{sentence}", {"sentence": text})


def _problem(error: ErrorDetails) -> str:
    kind, ctx = error["type"], error.get("ctx") or {}
    where = _location(error["loc"])
    if kind == _FIELD_SENTENCE:
        loc = tuple(error["loc"])
        subject = f"field {loc[0]!r}" if len(loc) == 1 and isinstance(loc[0], str) else where
        return f"{subject} {ctx['sentence']}"
    if kind == "missing":
        return f"{where}: missing (a required field)"
    if kind == "extra_forbidden":
        return f"{where}: unknown field"
    if kind in ("literal_error", "enum"):  # an enum field reads its values as a literal does
        expected = f"one of {ctx.get('expected')}"
    elif kind == "too_short":
        expected = f"at least {ctx.get('min_length')} item(s)"
    elif kind in ("greater_than_equal", "greater_than", "less_than_equal", "less_than"):
        sign = {"greater_than_equal": ">=", "greater_than": ">", "less_than_equal": "<=", "less_than": "<"}[kind]
        expected = f"a number {sign} {next(iter(ctx.values()), '?')}"
    elif kind == "value_error":
        return f"{where}: {ctx.get('error', error['msg'])}"
    else:
        expected = _EXPECTED.get(kind) or error["msg"][0].lower() + error["msg"][1:]
    return f"{where}: expected {expected}, got {_shown(error.get('input'))}"


def check_document(model: type[Model], data: Any, where: str) -> Model:
    """``data`` validated by the pydantic ``model``; the first problem becomes a DsaBenchError
    ``where: field.path[i]: expected ..., got ...``."""
    from pydantic import ValidationError

    try:
        return model.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        # an unknown field first: a misspelt key is also reported as the field it meant being missing
        errors.sort(key=lambda e: e["type"] != "extra_forbidden")
        more = f" (and {len(errors) - 1} more problem(s))" if len(errors) > 1 else ""
        hint = ""
        if errors[0]["type"] == "extra_forbidden":
            parent, key = tuple(errors[0]["loc"][:-1]), str(errors[0]["loc"][-1])
            missing = [str(e["loc"][-1]) for e in errors if e["type"] == "missing" and tuple(e["loc"][:-1]) == parent]
            hint = did_you_mean(key, missing or (model.model_fields if not parent else ()))
        raise DsaBenchError(_problem(errors[0]) + hint + more, where) from None


def _current_umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


#: Permissions of the files and folders dsa-bench writes (mkstemp and mkdtemp alone give 0600, 0700).
FILE_MODE = 0o666 & ~_current_umask()


DIR_MODE = 0o777 & ~_current_umask()


def write_atomic(path: Path, data: str | bytes, kind: str) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same folder and ``os.replace``.

    Readers see the old file or the new one, never a mix; a failure (or an interrupt) leaves
    the old file as it was and removes the temporary file.
    """
    payload = data.encode("utf-8") if isinstance(data, str) else data
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name[:180]}.", suffix=".tmp")
    except OSError as exc:
        raise DsaBenchError(f"cannot write {kind} file: {exc.strerror or exc}", str(path)) from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, FILE_MODE)
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise DsaBenchError(f"cannot write {kind} file: {exc.strerror or exc}", str(path)) from None
        raise


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve() or (a.exists() and b.exists() and os.path.samefile(a, b))
    except (OSError, ValueError):
        return False


#: a solution folder's manifest (dsa_bench.solution reads it)
SOLUTION_MANIFEST = "solution.yaml"

#: the project's input folders (beside each other at its root), which no command writes into
INPUT_FOLDERS = ("workloads", "traces")


def protected_folder(path: Path) -> str | None:
    """Why no output may be written at ``path``, or None: it lies inside a solution folder (a file
    there changes the solution's content hash, so --resume and compare would see new code) or
    under the project's workloads/ or traces/ (the files runs read)."""
    for folder in path.parents:
        try:
            if (folder / SOLUTION_MANIFEST).is_file():
                return f"{folder}, a solution folder (a file written there changes the solution's content hash)"
            if folder.name in INPUT_FOLDERS and (folder.parent / "workloads").is_dir():
                return f"{folder}, the project's {folder.name}/ folder"
        except OSError:
            continue
    return None


def check_output_path(
    path: Path,
    option: str,
    kind: str,
    replaceable: Callable[[Path], bool],
    inputs: Iterable[Path] = (),
    input_folders: Iterable[Path] = (),
) -> None:
    """Refuse an output path that would destroy something: an input file, a path inside an
    input folder, a folder, a path under a file, or an existing file ``replaceable`` does not
    recognise as a ``kind`` file.

    ``option`` names where the path came from (``--save``), for the message.
    """
    where = str(path)
    if "\0" in where:
        raise DsaBenchError(f"{option}: expected a path without NUL bytes", repr(where))
    for source in inputs:
        if _same_file(path, source):
            raise DsaBenchError(f"{option}: this is an input of the command; refusing to overwrite it (choose another path)", where)
    resolved = path.resolve()
    for folder in input_folders:
        if resolved.is_relative_to(folder.resolve()):
            raise DsaBenchError(f"{option}: lies inside {folder}, an input folder of the command (choose a path outside it)", where)
    protected = protected_folder(resolved)
    if protected is not None:
        raise DsaBenchError(f"{option}: lies inside {protected} (choose a path outside it)", where)
    try:
        if path.is_dir():
            raise DsaBenchError(f"{option}: expected a {kind} file path, got a folder", where)
        for parent in path.parents:
            if parent.exists():
                if not parent.is_dir():
                    raise DsaBenchError(f"{option}: {parent} is a file, so nothing can be written under it", where)
                break
        if (path.exists() or path.is_symlink()) and not (path.is_file() and replaceable(path)):
            raise DsaBenchError(f"{option}: exists and is not a {kind} file; refusing to overwrite it (choose another path)", where)
    except OSError as exc:
        raise DsaBenchError(f"{option}: cannot use this path: {exc.strerror or exc}", where) from None


def has_json_format(path: Path, format_name: str) -> bool:
    """Whether ``path`` holds a JSON object whose "format" is ``format_name`` (a dsa-bench file)."""
    try:
        document = read_json(path, "existing")
    except DsaBenchError:
        return False
    return isinstance(document, dict) and document.get("format") == format_name


def starts_with(path: Path, prefixes: tuple[bytes, ...], skip_space: bool = False) -> bool:
    """Whether the file's first bytes are one of ``prefixes`` (compared case-insensitively)."""
    try:
        with path.open("rb") as f:
            head = f.read(512)
    except OSError:
        return False
    head = (head.lstrip() if skip_space else head).lower()
    return any(head.startswith(p.lower()) for p in prefixes)
