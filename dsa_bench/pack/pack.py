"""Packing solution folders into flashinfer-bench Solution JSON, unpacking them, and verifying.

One JSON document per definition a solution implements::

    {"name": ..., "definition": ..., "author": ..., "description": ...,
     "spec": {"language": ..., "target_hardware": [...], "entry_point": "file.py::func",
              "dependencies": [...], "destination_passing_style": true},
     "sources": [{"path": "relative/path.py", "content": "..."}]}

``sources`` holds exactly the files the entry point needs, found by following the entry file:

- Python imports (parsed with :mod:`ast`): relative imports, and absolute imports that resolve to
  a module inside the solution folder (the folder is on ``sys.path`` when dsa-bench imports a
  solution folder; flashinfer-bench's loader does not resolve them, see
  :func:`dsa_bench.flashinfer_bench.packed.import_problems`); the ``__init__.py`` of every package a packed
  module lives in;
- string literals in Python sources that name an existing C/C++/CUDA file of the folder (how a
  Python loader hands ``foo.cu`` to ``torch.utils.cpp_extension.load``);
- ``#include "..."`` lines in C/C++/CUDA sources;
- the manifest's ``sources`` (the escape hatch for anything loaded in ways not seen above).

Anything the entry needs that lies outside the folder is an error. ``verify_packed`` checks each
JSON's imports and runs it, as flashinfer-bench imports it, on its definition's smoke workload(s).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import yaml

from dsa_bench.errors import DsaBenchError
from dsa_bench.files import DIR_MODE, check_output_path, read_json, read_text, write_atomic
from dsa_bench.pack.collect import COMPILED_SUFFIXES, INCLUDE_LINE, NATIVE_SUFFIXES, needed_files
from dsa_bench.pack.document import check_solution_document, read_solution_document
from dsa_bench.paths import safe_file_name
from dsa_bench.solution import MANIFEST, Solution, load_solution, solution_files


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
        "dependencies": [*solution.dependencies, *(r for r in solution.requires.modules.values() if r not in solution.dependencies)],
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
    :func:`~dsa_bench.paths.safe_file_name`, so no name can place a file outside ``out_dir``."""
    solution = load_solution(folder)
    chosen = definitions or [d for d, entry in solution.entries.items() if entry.unsupported is None]
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


def _included_by_others(sources: list[dict[str, Any]]) -> set[str]:
    """Paths some packed C/C++/CUDA file #includes (they must not be compiled on their own)."""
    included: set[str] = set()
    for source in sources:
        if source["path"].endswith(NATIVE_SUFFIXES):
            folder = PurePosixPath(source["path"]).parent
            for name in INCLUDE_LINE.findall(source["content"]):
                included.add((folder / name).as_posix())
                included.add(PurePosixPath(name).as_posix())
    return included


def runnable_problem(document: dict[str, Any]) -> str | None:
    """Why dsa-bench cannot run a packed Solution (its language, or a CUDA binding other than torch), or None.

    flashinfer-bench builds a C++/CUDA solution without ``binding`` through TVM-FFI (its default),
    whose sources export functions with TVM-FFI's macros rather than a torch extension module's
    ``PYBIND11_MODULE``; built as a torch extension they would not load (or load the wrong symbols).
    """
    spec = document["spec"]
    if spec["language"] not in ("python", "triton", "cuda"):
        return f"spec.language {spec['language']!r} is not one dsa-bench runs (python, triton, cuda)"
    if spec["language"] == "cuda" and spec.get("binding") != "torch":
        given = "has no spec.binding, which flashinfer-bench reads as 'tvm-ffi' (its default)" if spec.get("binding") is None else (
            f"has spec.binding {spec['binding']!r}"
        )
        return (
            f"this CUDA solution {given}: flashinfer-bench builds it through TVM-FFI, which dsa-bench does not; dsa-bench builds "
            'CUDA entries as torch extensions, so only "binding": "torch" solutions can be unpacked or run'
        )
    return None


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
        problem = runnable_problem(doc)
        if problem is not None:
            raise DsaBenchError(problem, str(path))
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
        message = f"source {clashes[0]!r} is a file here but a folder of another packed file's sources"
        raise DsaBenchError(message, str(files[clashes[0]][1]))
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
