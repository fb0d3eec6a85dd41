"""Solution folders: their manifest, their content hash, and importing or building an entry point.

A solution is a folder with ``solution.yaml``::

    name: triton
    author: dsa-bench
    description: Fast Triton/CUDA kernels.
    target_hardware: [NVIDIA_H200]
    dependencies: [torch, triton]
    entries:
      dsa_topk_indexer_fp8_h64_d128_topk2048_ps64:
        entry_point: indexer.py::kernel       # file.py::function, or file.cu::function
        language: triton                      # python | triton | cuda
        destination_passing_style: true       # kernel(*inputs, *outputs); false: returns outputs
        sources: [topk.cu]                    # extra files the entry needs beyond its imports

A Python entry module may define ``solution_notes() -> str``; the run records what it returns
(for example which top-k path a machine without CUDA used).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dsa_bench.errors import DsaBenchError
from dsa_bench.files import read_yaml

MANIFEST = "solution.yaml"


LANGUAGES = ("python", "triton", "cuda")


#: The name reserved for the project's reference solution (see project.check_run_solutions).
REFERENCE_SOLUTION = "reference"


@dataclass(frozen=True)
class SolutionEntry:
    """How one solution implements one definition."""

    definition: str
    file: str  # path relative to the solution folder
    function: str
    language: str
    destination_passing_style: bool = True
    sources: tuple[str, ...] = ()

    @property
    def entry_point(self) -> str:
        return f"{self.file}::{self.function}"


@dataclass(frozen=True)
class Solution:
    name: str
    path: Path  # the folder
    author: str = ""
    description: str = ""
    target_hardware: tuple[str, ...] = ()
    dependencies: tuple[str, ...] = ()
    entries: dict[str, SolutionEntry] = field(default_factory=dict)

    def entry_for(self, definition: str) -> SolutionEntry:
        if definition not in self.entries:
            raise DsaBenchError(f"solution {self.name!r} has no entry for definition {definition!r}", str(self.path / MANIFEST))
        return self.entries[definition]


def load_solution(folder: Path) -> Solution:
    """Read and validate a solution folder's manifest."""
    manifest = folder / MANIFEST
    where = str(manifest)
    if not folder.is_dir():
        raise DsaBenchError("solution folder does not exist", str(folder))
    if not manifest.is_file():
        raise DsaBenchError(f"no {MANIFEST} in this solution folder", str(folder))
    data = read_yaml(manifest, "solution manifest")
    if not isinstance(data, dict):
        raise DsaBenchError("expected a mapping with name, author, description and entries", where)
    entries_raw = data.get("entries")
    if not isinstance(entries_raw, dict) or not entries_raw:
        raise DsaBenchError("field 'entries' must map at least one definition name to its entry", where)
    entries = {name: _parse_entry(name, raw, folder, where) for name, raw in entries_raw.items()}
    name = data.get("name")
    if name is None:
        name = folder.resolve().name
    elif not isinstance(name, str) or not name.strip() or not name.isprintable():
        raise DsaBenchError(f"field 'name' must be a non-empty string of printable characters, got {name!r}", where)
    return Solution(
        name=name,
        path=folder.resolve(),
        author=str(data.get("author", "")),
        description=str(data.get("description", "")),
        target_hardware=tuple(str(x) for x in data.get("target_hardware", []) or []),
        dependencies=tuple(str(x) for x in data.get("dependencies", []) or []),
        entries=entries,
    )


def _parse_entry(definition: str, raw: Any, folder: Path, where: str) -> SolutionEntry:
    label = f"entries.{definition}"
    if not isinstance(raw, dict):
        raise DsaBenchError(f"{label} must be a mapping with entry_point and language", where)
    entry_point = raw.get("entry_point")
    if not isinstance(entry_point, str) or entry_point.count("::") != 1:
        raise DsaBenchError(f"{label}.entry_point must look like 'file.py::function', got {entry_point!r}", where)
    file, function = entry_point.split("::")
    if not function.isidentifier():
        raise DsaBenchError(f"{label}.entry_point: {function!r} is not a function name", where)
    language = raw.get("language")
    if language not in LANGUAGES:
        raise DsaBenchError(f"{label}.language must be one of {', '.join(LANGUAGES)}, got {language!r}", where)
    wanted_suffix = (".cu", ".cpp") if language == "cuda" else (".py",)
    if not file.endswith(wanted_suffix):
        raise DsaBenchError(f"{label}.entry_point: a {language} entry must be a {' or '.join(wanted_suffix)} file, got {file!r}", where)
    dps = raw.get("destination_passing_style", True)
    if not isinstance(dps, bool):
        raise DsaBenchError(f"{label}.destination_passing_style must be true or false", where)
    sources = raw.get("sources", []) or []
    if not isinstance(sources, list) or not all(isinstance(s, str) for s in sources):
        raise DsaBenchError(f"{label}.sources must be a list of file paths", where)
    for rel in [file, *sources]:
        target = (folder / rel).resolve()  # symbolic links are followed: a link out of the folder is outside
        if not target.is_relative_to(folder.resolve()):
            raise DsaBenchError(f"{label}: {rel!r} lies outside the solution folder (it resolves to {target})", where)
        if not target.is_file():
            raise DsaBenchError(f"{label}: file {rel!r} does not exist in {folder}", where)
    return SolutionEntry(definition, file, function, language, dps, tuple(sources))


def solution_files(folder: Path) -> list[Path]:
    """Every file of a solution folder that matters for its behaviour, sorted."""
    skip_dirs = {"__pycache__", ".git", "build"}
    files = []
    for path in sorted(folder.rglob("*")):
        if path.is_file() and not skip_dirs.intersection(path.relative_to(folder).parts[:-1]) and path.suffix != ".pyc":
            files.append(path)
    return files


def content_hash(folder: Path) -> str:
    """sha256 over the folder's files (paths and bytes): identifies exactly what was run."""
    digest = hashlib.sha256()
    for path in solution_files(folder):
        digest.update(str(path.relative_to(folder)).encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def discover(solutions_dir: Path) -> list[Solution]:
    """All solution folders directly under ``solutions_dir``; a broken manifest raises."""
    if not solutions_dir.is_dir():
        return []
    return [load_solution(p) for p in sorted(solutions_dir.iterdir()) if (p / MANIFEST).is_file()]
