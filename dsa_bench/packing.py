"""Packing solution folders into flashinfer-bench Solution JSON, unpacking them, and verifying.

One JSON document per definition a solution implements::

    {"name": ..., "definition": ..., "author": ..., "description": ...,
     "spec": {"language": ..., "target_hardware": [...], "entry_point": "file.py::func",
              "dependencies": [...], "destination_passing_style": true},
     "sources": [{"path": "relative/path.py", "content": "..."}]}

``sources`` holds exactly the files the entry point needs, found by following the entry file:

- Python imports (parsed with :mod:`ast`): relative imports, and absolute imports that resolve to
  a module inside the solution folder (the folder is on ``sys.path`` when dsa-bench imports a
  solution); the ``__init__.py`` of every package a packed module lives in;
- string literals in Python sources that name an existing C/C++/CUDA file of the folder (how a
  Python loader hands ``foo.cu`` to ``torch.utils.cpp_extension.load``);
- ``#include "..."`` lines in C/C++/CUDA sources;
- the manifest's ``sources`` (the escape hatch for anything loaded in ways not seen above).

Anything the entry needs that lies outside the folder is an error. ``verify_packed`` unpacks each
JSON into a fresh folder and runs it through dsa-bench on its definition's smoke workload(s).
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import yaml

from dsa_bench.errors import DsaBenchError
from dsa_bench.files import DIR_MODE, check_output_path, read_json, read_text, read_yaml, safe_file_name, write_atomic
from dsa_bench.solutions import MANIFEST, Solution, SolutionEntry, load_solution, solution_files

#: Languages of the flashinfer-bench schema (dsa-bench itself runs python, triton and cuda).
SCHEMA_LANGUAGES = ("python", "triton", "cpp", "cuda", "tilelang")
SCHEMA_BINDINGS = ("tvm-ffi", "torch")
NATIVE_SUFFIXES = (".cu", ".cuh", ".cpp", ".cc", ".cxx", ".c", ".h", ".hpp", ".hh", ".inl")
COMPILED_SUFFIXES = (".cu", ".cpp", ".cc", ".cxx", ".c")
_INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.MULTILINE)


@dataclass
class PackedEntry:
    """One packed definition: the JSON document and why each file went in."""

    definition: str
    document: dict[str, Any]
    reasons: dict[str, str]  # relative path -> why it was packed
    external_modules: list[str]  # non-stdlib imports resolving outside the folder (torch, triton, ...)
    left_out: list[str]  # files of the folder that were not needed
    empty_files: list[str] = field(default_factory=list)  # packed as a single newline (see pack_entry)
    path: Path | None = None  # where the JSON was written

    @property
    def name(self) -> str:
        return self.document["name"]


# --------------------------------------------------------------------------- dependency following


class _Collector:
    """Walks from an entry file through everything it needs, inside one solution folder."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder.resolve()
        self.reasons: dict[str, str] = {}
        self.external: set[str] = set()
        self._pending: list[Path] = []
        self._all_files = [p.resolve() for p in solution_files(self.folder)]

    def rel(self, path: Path) -> str:
        return path.resolve().relative_to(self.folder).as_posix()

    def add(self, path: Path, reason: str, referrer: str) -> None:
        resolved = path.resolve()
        if not resolved.is_relative_to(self.folder):
            raise DsaBenchError(f"{referrer} needs {path}, which lies outside the solution folder {self.folder}")
        if not _is_file(resolved):
            raise DsaBenchError(f"{referrer} needs {path}, which does not exist")
        rel = self.rel(resolved)
        if rel in self.reasons:
            return
        self.reasons[rel] = reason
        self._pending.append(resolved)
        if resolved.suffix == ".py":  # importing a module runs every enclosing package's __init__.py
            for parent in resolved.parents:
                if parent == self.folder:
                    break
                init = parent / "__init__.py"
                if _is_file(init):
                    self.add(init, f"package of {rel}", rel)

    def run(self) -> None:
        while self._pending:
            path = self._pending.pop()
            if path.suffix == ".py":
                self._follow_python(path)
            elif path.suffix in NATIVE_SUFFIXES:
                self._follow_includes(path)

    # ----------------------------------------------------------------- python

    def _follow_python(self, path: Path) -> None:
        rel = self.rel(path)
        tree = _parse_python(read_text(path, "Python source"), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    self._absolute_import(alias.name, rel)
            elif isinstance(node, ast.ImportFrom):
                if node.level == 0:
                    base = self._absolute_import(node.module or "", rel)
                else:
                    base = self._relative_base(path, node.level, node.module, rel, node.lineno)
                if base is not None:  # `from pkg import name`: name may be a submodule
                    for alias in node.names:
                        module = _module_file(base / alias.name)
                        if module is not None:
                            self.add(module, f"imported by {rel}", rel)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                self._native_literal(node.value, path, rel)

    def _absolute_import(self, dotted: str, rel: str) -> Path | None:
        """Add an absolute import resolving inside the folder; returns its package dir, if any."""
        if not dotted:
            return None
        parts = dotted.split(".")
        target = self.folder.joinpath(*parts)
        module = _module_file(target)
        if module is None:
            if _is_dir(target) and target.resolve().is_relative_to(self.folder):
                return target  # a namespace package (a folder without __init__.py)
            if parts[0] not in sys.stdlib_module_names:
                self.external.add(parts[0])
            return None
        self.add(module, f"imported by {rel}", rel)
        # `import a.b.c` also runs a/__init__.py and a/b/__init__.py (added by `add` via parents)
        return target if _is_dir(target) else None

    def _relative_base(self, path: Path, level: int, module: str | None, rel: str, line: int) -> Path | None:
        base = path.parent
        for _ in range(level - 1):
            base = base.parent
        if not base.resolve().is_relative_to(self.folder):
            raise DsaBenchError(f"relative import {'.' * level}{module or ''} reaches above the solution folder", f"{path}:{line}")
        if module:
            base = base.joinpath(*module.split("."))
            found = _module_file(base)
            if found is None and _is_dir(base):
                return base  # a namespace package
            if found is None:
                raise DsaBenchError(f"relative import {'.' * level}{module} names no module in the solution folder", f"{path}:{line}")
            self.add(found, f"imported by {rel}", rel)
        return base if _is_dir(base) else None

    def _native_literal(self, text: str, path: Path, rel: str) -> None:
        """A string naming a C/C++/CUDA file of the folder, as handed to a JIT build."""
        if "\n" in text or not text.endswith(NATIVE_SUFFIXES) or len(text) > 300:
            return
        if any(ch in text for ch in "*?["):  # a glob pattern, e.g. sources=glob("csrc/*.cu")
            for base in (path.parent, self.folder):
                try:
                    matches = sorted(base.glob(text))
                except (ValueError, NotImplementedError, OSError):  # an absolute or malformed pattern: no file of the folder
                    continue
                for match in matches:
                    if _is_file(match):
                        self.add(match, f"matches {text!r} in {rel}", rel)
            return
        for candidate in (path.parent / text, self.folder / text):
            if _is_file(candidate):
                self.add(candidate, f"named in {rel}", rel)
                return
        # Paths built in pieces, e.g. Path(__file__).parent / "csrc" / "topk.cu"
        for file in self._files_ending_with(text):
            self.add(file, f"named in {rel} (as {text!r})", rel)

    def _files_ending_with(self, text: str) -> list[Path]:
        """Files of the folder whose relative path ends with the path ``text``."""
        suffix = PurePosixPath(text.replace("\\", "/")).parts
        if not suffix or ".." in suffix:
            return []
        return [f for f in self._all_files if PurePosixPath(self.rel(f)).parts[-len(suffix) :] == suffix]

    # ----------------------------------------------------------------- C/C++/CUDA

    def _follow_includes(self, path: Path) -> None:
        rel = self.rel(path)
        text = read_text(path, "C/C++/CUDA source")
        for match in _INCLUDE.finditer(text):
            name = match.group(1)
            line = text.count("\n", 0, match.start()) + 1
            for candidate in (path.parent / name, self.folder / name):
                if _is_file(candidate):
                    self.add(candidate, f"#include in {rel}", f"{path}:{line}")
                    break
            else:
                # Reached through an include path (-I) of the build: match by path suffix. A
                # header found nowhere in the folder belongs to the toolkit or a library (torch,
                # CUDA), which the build machine provides.
                for file in self._files_ending_with(name):
                    self.add(file, f"#include in {rel}", f"{path}:{line}")


def _module_file(target: Path) -> Path | None:
    """``target.py`` or ``target/__init__.py``, whichever exists."""
    if target.name and _is_file(target.with_suffix(".py")):
        return target.with_suffix(".py")
    if _is_file(target / "__init__.py"):
        return target / "__init__.py"
    return None


def _is_file(path: Path) -> bool:
    """Whether ``path`` is a file; a name the OS cannot hold (too long, a NUL byte) is none."""
    try:
        return path.is_file()
    except (OSError, ValueError):
        return False


def _is_dir(path: Path) -> bool:
    try:
        return path.is_dir()
    except (OSError, ValueError):
        return False


def _parse_python(source: str, where: str) -> ast.Module:
    """``source`` parsed; invalid or pathologically nested code is a DsaBenchError naming ``where``."""
    try:
        return ast.parse(source, filename=where)
    except SyntaxError as exc:  # also a NUL byte in the source
        raise DsaBenchError(f"invalid Python: {exc.msg}", f"{where}:{exc.lineno}" if exc.lineno else where) from None
    except (RecursionError, MemoryError):
        raise DsaBenchError("Python source nested too deeply to parse", where) from None


def needed_files(solution: Solution, entry: SolutionEntry) -> tuple[dict[str, str], list[str]]:
    """Files (relative path -> reason) an entry needs, and the external modules it imports."""
    collector = _Collector(solution.path)
    manifest = f"{solution.path / MANIFEST}: entries.{entry.definition}"
    collector.add(solution.path / entry.file, "entry point", manifest)
    for source in entry.sources:
        collector.add(solution.path / source, "listed in solution.yaml", manifest)
    collector.run()
    return collector.reasons, sorted(collector.external)


# --------------------------------------------------------------------------- packing


def pack_entry(solution: Solution, definition: str) -> PackedEntry:
    """The flashinfer-bench Solution document for one entry of a solution folder."""
    entry = solution.entry_for(definition)
    where = str(solution.path / MANIFEST)
    if not solution.author:
        raise DsaBenchError("field 'author' is empty; a flashinfer-bench Solution needs an author", where)
    if not solution.target_hardware:
        raise DsaBenchError("field 'target_hardware' is empty; a flashinfer-bench Solution needs at least one target (e.g. [cuda])", where)
    reasons, external = needed_files(solution, entry)
    order = [entry.file] + sorted(p for p in reasons if p != entry.file)
    sources = []
    empty = []
    for rel in order:
        content = read_text(solution.path / rel, "source")
        if not content:
            # The schema requires non-empty content; an empty file (typically __init__.py)
            # becomes one newline, which Python and compilers treat identically.
            content = "\n"
            empty.append(rel)
        sources.append({"path": rel, "content": content})
    spec: dict[str, Any] = {
        "language": entry.language,
        "target_hardware": list(solution.target_hardware),
        "entry_point": entry.entry_point,
        "dependencies": list(solution.dependencies),
        "destination_passing_style": entry.destination_passing_style,
    }
    if entry.language == "cuda":
        spec["binding"] = "torch"  # dsa-bench builds CUDA entries with torch.utils.cpp_extension
    document = {
        "name": f"{solution.name}_{definition}",
        "definition": definition,
        "author": solution.author,
        "description": solution.description,
        "spec": spec,
        "sources": sources,
    }
    check_solution_document(document, f"packed {solution.name}/{definition}")
    packed_paths = set(reasons)
    left_out = [f.relative_to(solution.path).as_posix() for f in solution_files(solution.path)]
    left_out = [p for p in left_out if p not in packed_paths and p != MANIFEST]
    return PackedEntry(definition, document, reasons, external, left_out, empty)


def pack_solution(folder: Path, out_dir: Path | None = None, definitions: list[str] | None = None) -> list[PackedEntry]:
    """Pack every entry (or the named ones) of a solution folder into ``out_dir/<name>.json``
    (default ``out_dir``: ``packed/<solution name>/``). Names become file names through
    :func:`~dsa_bench.files.safe_file_name`, so no name can place a file outside ``out_dir``."""
    solution = load_solution(folder)
    chosen = definitions or list(solution.entries)
    for name in chosen:
        solution.entry_for(name)
    if out_dir is None:
        out_dir = Path("packed") / safe_file_name(solution.name)
    targets = {name: out_dir / f"{safe_file_name(f'{solution.name}_{name}')}.json" for name in chosen}
    for target in targets.values():  # before anything is written: the folder and foreign files stay as they are
        check_output_path(target, "--out", "packed Solution JSON", _looks_packed, input_folders=[solution.path])
    packed = [pack_entry(solution, name) for name in chosen]
    for item in packed:
        item.path = targets[item.definition]
        write_atomic(item.path, json.dumps(item.document, indent=2) + "\n", "packed solution")
    return packed


def _looks_packed(path: Path) -> bool:
    """Whether an existing file is a packed Solution JSON (which packing may replace)."""
    try:
        document = read_json(path, "packed solution")
    except DsaBenchError:
        return False
    return isinstance(document, dict) and {"name", "definition", "spec", "sources"} <= set(document)


# --------------------------------------------------------------------------- schema


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


# --------------------------------------------------------------------------- unpacking


def _included_by_others(sources: list[dict[str, Any]]) -> set[str]:
    """Paths some packed C/C++/CUDA file #includes (they must not be compiled on their own)."""
    included: set[str] = set()
    for source in sources:
        if source["path"].endswith(NATIVE_SUFFIXES):
            folder = PurePosixPath(source["path"]).parent
            for name in _INCLUDE.findall(source["content"]):
                included.add((folder / name).as_posix())
                included.add(PurePosixPath(name).as_posix())
    return included


def unpack_solutions(json_paths: list[Path], dest: Path, force: bool = False, name: str | None = None) -> Path:
    """Restore a solution folder (sources plus ``solution.yaml``) from packed Solution JSON files.

    Several files (one per definition) merge into one folder; a path two files both hold must
    have the same content. The manifest's name is the packed name without its ``_<definition>``
    suffix when all files agree on it, else the folder's name; ``name`` overrides it. Refuses to
    write into a non-empty folder unless ``force``.
    """
    if not json_paths:
        raise DsaBenchError("no packed solution file given")
    documents = [(p, read_solution_document(p)) for p in json_paths]
    _check_destination(dest, force)
    files: dict[str, tuple[str, Path]] = {}
    entries: dict[str, dict[str, Any]] = {}
    for path, doc in documents:
        definition = doc["definition"]
        if definition in entries:
            raise DsaBenchError(f"two packed files implement definition {definition!r}", str(path))
        spec = doc["spec"]
        if spec["language"] not in ("python", "triton", "cuda"):
            raise DsaBenchError(f"spec.language {spec['language']!r} is not one dsa-bench runs (python, triton, cuda)", str(path))
        if spec["language"] == "cuda" and spec.get("binding") not in (None, "torch"):
            raise DsaBenchError(f"spec.binding {spec['binding']!r}: dsa-bench builds CUDA entries as torch extensions", str(path))
        for source in doc["sources"]:
            earlier = files.get(source["path"])
            if earlier is not None and earlier[0] != source["content"]:
                raise DsaBenchError(f"{source['path']} differs from the copy in {earlier[1]}", str(path))
            files[source["path"]] = (source["content"], path)
        entry_file = spec["entry_point"].split("::")[0]
        others = [s["path"] for s in doc["sources"] if s["path"] != entry_file]
        if spec["language"] == "cuda":  # only separate translation units are compiled with the entry
            included = _included_by_others(doc["sources"])
            others = [p for p in others if p.endswith(COMPILED_SUFFIXES) and p not in included]
        entry: dict[str, Any] = {
            "entry_point": spec["entry_point"],
            "language": spec["language"],
            "destination_passing_style": spec.get("destination_passing_style", True),
        }
        if others:
            entry["sources"] = others
        entries[definition] = entry
    first = documents[0][1]
    # dsa-bench packs as "<solution>_<definition>"; strip that suffix to get the solution's name back
    names = {d["name"].removesuffix(f"_{d['definition']}") for _, d in documents}
    manifest = {
        "name": name or (names.pop() if len(names) == 1 else dest.resolve().name),
        "author": first["author"],
        "description": first.get("description") or "",
        "target_hardware": first["spec"]["target_hardware"],
        "dependencies": first["spec"].get("dependencies", []),
        "entries": entries,
    }
    folders = {parent.as_posix() for rel in files for parent in PurePosixPath(rel).parents if parent.parts}
    if MANIFEST in files or MANIFEST in folders:
        origin = files[MANIFEST][1] if MANIFEST in files else next(o for r, (_, o) in files.items() if r.startswith(f"{MANIFEST}/"))
        raise DsaBenchError(f"a packed source is named {MANIFEST}, which unpacking writes itself", str(origin))
    clashes = sorted(set(files) & folders)
    if clashes:
        raise DsaBenchError(f"source {clashes[0]!r} is a file here but a folder of another packed file's sources", str(files[clashes[0]][1]))
    outputs = {rel: content for rel, (content, _) in files.items()}
    outputs[MANIFEST] = yaml.safe_dump(manifest, sort_keys=False)
    return _write_folder(dest, outputs)


def _check_destination(dest: Path, force: bool) -> None:
    where = str(dest)
    try:
        if dest.exists() and not dest.is_dir():
            raise DsaBenchError("destination exists and is not a folder", where)
        if dest.is_dir() and any(dest.iterdir()) and not force:
            raise DsaBenchError("destination folder is not empty (use --force to write into it)", where)
        parent = next(p for p in dest.absolute().parents if p.exists())
        if not parent.is_dir():
            raise DsaBenchError(f"destination lies under {parent}, which is a file", where)
    except OSError as exc:
        raise DsaBenchError(f"cannot use this destination: {exc.strerror or exc}", where) from None


def _write_folder(dest: Path, outputs: dict[str, str]) -> Path:
    """Write ``outputs`` (relative path -> text) into the folder ``dest``: all of it, or nothing.

    Everything is first written into a temporary folder beside ``dest``. A new ``dest`` is then
    that folder, renamed; into an existing one each file is moved, after checking that no
    file there stands where a folder must go, or a folder where a file goes. A failure
    removes the temporary folder and any folder made for ``dest``.
    """
    dest = dest.absolute()
    anchor = next(p for p in dest.parents if p.exists())
    made: list[Path] = []  # missing parents of a new dest, made just before the rename
    staging: Path | None = None
    try:
        staging = Path(tempfile.mkdtemp(prefix=".dsa-bench-unpack-", dir=anchor))
        os.chmod(staging, DIR_MODE)
        for rel, text in outputs.items():
            target = staging / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8")
        if dest.exists():
            root = dest.resolve()
            for rel in outputs:
                _check_merge_target(root, rel)
            for rel in outputs:
                (root / rel).parent.mkdir(parents=True, exist_ok=True)
                os.replace(staging / rel, root / rel)
        else:
            for parent in reversed(dest.parents):
                if not parent.exists():
                    parent.mkdir()
                    made.append(parent)
            os.rename(staging, dest)
            staging = None
        return dest.resolve()
    except BaseException as exc:
        for folder in reversed(made):
            with contextlib.suppress(OSError):
                folder.rmdir()
        if isinstance(exc, OSError):
            raise DsaBenchError(f"cannot write the unpacked solution: {exc.strerror or exc}", str(exc.filename or dest)) from None
        raise
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)


def _check_merge_target(root: Path, rel: str) -> None:
    """Refuse to move ``rel`` into the existing folder ``root`` where the tree disagrees."""
    target = root / rel
    for parent in reversed(target.parents):
        if parent.is_relative_to(root) and parent != root and (parent.is_symlink() or (parent.exists() and not parent.is_dir())):
            raise DsaBenchError(f"{parent} is a file (or a link), but the unpacked source {rel} must go inside it as a folder", str(root))
    if target.is_symlink() or target.is_dir():
        raise DsaBenchError(f"{target} is a folder (or a link), but the unpacked source {rel} is a file", str(root))


# --------------------------------------------------------------------------- verification


@dataclass
class VerifyResult:
    packed: Path
    workload: str
    passed: bool
    output: str  # the run's output (tail), for the user


def smoke_workloads(definition: str, root: Path) -> list[str]:
    """Names of ``workloads/*_smoke.yaml`` whose definition is ``definition``."""
    found = []
    for path in sorted((root / "workloads").glob("*_smoke.yaml")):
        try:
            data = read_yaml(path, "workload")
        except DsaBenchError:
            continue  # a broken workload file is reported by `validate`, not by packing
        if isinstance(data, dict) and data.get("definition") == definition:
            found.append(path.stem)
    return found


def verify_packed(packed: list[Path], root: Path, device: str = "auto", timeout_s: float = 1800.0) -> list[VerifyResult]:
    """Unpack each JSON alone into a temporary folder and run it on its definition's smoke workloads.

    The run is a real ``dsa-bench run`` in a fresh process, so a file the packer missed makes
    the import (or build) fail exactly as it would for whoever receives the JSON. On a GPU the
    run also times, briefly (1 trial of 1 call): verification is about completeness, not speed.
    CUDA sources are compiled from scratch, as the recipient would.
    """
    results: list[VerifyResult] = []
    for path in packed:
        document = read_solution_document(path)
        definition = document["definition"]
        workloads = smoke_workloads(definition, root)
        if not workloads:
            raise DsaBenchError(f"no smoke workload (workloads/*_smoke.yaml) for definition {definition!r}; cannot verify", str(path))
        with tempfile.TemporaryDirectory(prefix="dsa-bench-verify-") as tmp:
            os.chmod(tmp, 0o755)  # readable by the unprivileged worker users of a run under root
            # a distinct name: `run` treats a solution named "reference" as the project's own
            folder = unpack_solutions([path], Path(tmp) / "solution", name=f"packed-{document['name'].removesuffix('_' + definition)}")
            for workload in workloads:
                command = [
                    sys.executable, "-m", "dsa_bench", "run", "--workload", workload, "--solution", str(folder),
                    "--device", device, "--warmup", "0", "--iterations", "1", "--trials", "1", "--no-save",
                ]  # fmt: skip
                # A fresh extension cache: a build cached from the original folder could hide a
                # header the packer missed (torch's JIT cache key covers only the listed sources).
                env = {**os.environ, "DSA_BENCH_ROOT": str(root), "TORCH_EXTENSIONS_DIR": str(Path(tmp) / "torch_extensions")}
                env.pop("TRITON_INTERPRET", None)  # the harness sets it in CPU workers itself
                try:
                    proc = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, timeout=timeout_s, check=False)
                except subprocess.TimeoutExpired:
                    results.append(VerifyResult(path, workload, False, f"no result within {timeout_s:g} s"))
                    continue
                output = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-40:])
                results.append(VerifyResult(path, workload, proc.returncode == 0, output))
    return results
