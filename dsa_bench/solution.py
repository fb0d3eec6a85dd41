"""Solution folders: their manifest (its model, loading it), their files and content hash.

A solution is a folder with ``solution.yaml`` (:class:`ManifestModel`)::

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
        unsupported: "..."                    # optional: why it cannot run this definition (cases SKIPPED)
    requires:                                 # optional: what a peer needs to run at all
      modules: {flash_mla: "sgl-flash-mla==1.0.0"}   # import name: the pip requirement that provides it
      cuda_capabilities: [sm_90, sm_100]      # GPUs it runs on; absent: any device, CPU included

Loading validates the manifest with its model, then checks that every file an entry names lies
in the folder. A Python entry module may define ``solution_notes() -> str``; the run records
what it returns (for example which top-k path a machine without CUDA used).

A solution whose ``requires`` are not met on the machine (a module that does not import, a
package version outside the requirement, a device it does not run on) is not a failure: every
case gets status SKIPPED with the reason (:func:`dsa_bench.run.requirements.unmet`).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, ValidationInfo, field_validator

from dsa_bench.errors import DsaBenchError
from dsa_bench.files import SOLUTION_MANIFEST, check_document, field_sentence, read_yaml
from dsa_bench.models import ClosedModel, Name

MANIFEST = SOLUTION_MANIFEST


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
    #: why the solution cannot run this definition although it lists it (e.g. a peer kernel that
    #: takes only another top-k size): every case is SKIPPED with this reason, never run
    unsupported: str | None = None

    @property
    def entry_point(self) -> str:
        return f"{self.file}::{self.function}"


@dataclass(frozen=True)
class Requirements:
    """What a solution needs beyond dsa-bench's own dependencies (peers wrap third-party kernels)."""

    modules: dict[str, str] = field(default_factory=dict)  # import name -> pip requirement
    cuda_capabilities: tuple[str, ...] = ()  # e.g. ("sm_90",); empty: any device

    @property
    def any(self) -> bool:
        return bool(self.modules or self.cuda_capabilities)


@dataclass(frozen=True)
class Solution:
    name: str
    path: Path  # the folder
    author: str = ""
    description: str = ""
    target_hardware: tuple[str, ...] = ()
    dependencies: tuple[str, ...] = ()
    entries: dict[str, SolutionEntry] = field(default_factory=dict)
    requires: Requirements = field(default_factory=Requirements)
    #: the packed Solution JSON this folder was laid out from (flashinfer_bench.packed.materialize): its
    #: entries are imported as flashinfer-bench imports them, not with the folder on ``sys.path``
    packed_from: Path | None = None

    def entry_for(self, definition: str) -> SolutionEntry:
        if definition not in self.entries:
            raise DsaBenchError(f"solution {self.name!r} has no entry for definition {definition!r}", str(self.path / MANIFEST))
        return self.entries[definition]


def _entry_point_shape(value: Any) -> Any:
    if not isinstance(value, str) or value.count("::") != 1:
        raise field_sentence(f"must look like 'file.py::function', got {value!r}")
    function = value.split("::")[1]
    if not function.isidentifier():
        raise ValueError(f"{function!r} is not a function name")
    return value


def _printable_name(value: Any) -> Any:
    if value is not None and not (isinstance(value, str) and value.strip() and value.isprintable()):
        raise field_sentence(f"must be a non-empty string of printable characters, got {value!r}")
    return value


class EntryModel(ClosedModel):
    """``entries.<definition>`` of a manifest: how the solution implements that definition."""

    language: Literal["python", "triton", "cuda"]  # before entry_point, whose check reads it
    # file.py::function or file.cu::function, relative to the folder (a missing one gets the same message)
    entry_point: Annotated[str, BeforeValidator(_entry_point_shape)] = Field(default=None, validate_default=True)
    destination_passing_style: bool = True  # kernel(*inputs, *outputs); false: it returns the outputs
    sources: list[Name] = []  # files the entry needs beyond what its imports and #includes show
    # why the solution cannot run this definition: its cases are SKIPPED with this reason
    unsupported: Annotated[str | None, BeforeValidator(_printable_name)] = None

    @field_validator("entry_point")
    @classmethod
    def _file_suits_language(cls, entry_point: str, info: ValidationInfo) -> str:
        language, file = info.data.get("language"), entry_point.split("::")[0]
        wanted = (".cu", ".cpp") if language == "cuda" else (".py",)
        if language is not None and not file.endswith(wanted):
            raise ValueError(f"a {language} entry must be a {' or '.join(wanted)} file, got {file!r}")
        return entry_point


def _requirement(value: Any) -> Any:
    from packaging.requirements import InvalidRequirement, Requirement

    if not isinstance(value, str):
        raise field_sentence(f"must be a pip requirement such as 'sgl-flash-mla==1.0.0', got {value!r}")
    try:
        Requirement(value)
    except InvalidRequirement as exc:
        reason = str(exc).splitlines()[0]
        raise field_sentence(f"is not a pip requirement such as 'sgl-flash-mla==1.0.0' ({reason})") from None
    return value


def _module_name(value: Any) -> Any:
    if not isinstance(value, str) or not all(part.isidentifier() for part in value.split(".")):
        raise field_sentence(f"must be an importable module name such as 'flash_mla', got {value!r}")
    return value


def _capability(value: Any) -> Any:
    if not (isinstance(value, str) and re.fullmatch(r"sm_[0-9]{2,3}a?", value)):
        raise field_sentence(f"must name a CUDA compute capability such as 'sm_90', got {value!r}")
    return value


class RequiresModel(ClosedModel):
    """``requires`` of a manifest: what the solution needs to run at all."""

    modules: dict[Annotated[str, BeforeValidator(_module_name)], Annotated[str, BeforeValidator(_requirement)]] = {}
    cuda_capabilities: list[Annotated[str, BeforeValidator(_capability)]] = []


class ManifestModel(ClosedModel):
    """A solution folder's ``solution.yaml``."""

    name: Annotated[str | None, BeforeValidator(_printable_name)] = None  # default: the folder's name
    author: str = ""
    description: str = ""
    target_hardware: list[str] = []
    dependencies: list[str] = []
    entries: Annotated[dict[str, EntryModel], Field(min_length=1)]  # by definition name
    requires: RequiresModel = RequiresModel()


def load_solution(folder: Path) -> Solution:
    """Read and validate a solution folder's manifest; every file an entry names must lie in the folder."""
    manifest = folder / MANIFEST
    where = str(manifest)
    if not folder.is_dir():
        raise DsaBenchError("solution folder does not exist", str(folder))
    if not manifest.is_file():
        raise DsaBenchError(f"no {MANIFEST} in this solution folder", str(folder))
    data = check_document(ManifestModel, read_yaml(manifest, "solution manifest"), where)
    return Solution(
        name=folder.resolve().name if data.name is None else data.name,
        path=folder.resolve(),
        author=data.author,
        description=data.description,
        target_hardware=tuple(data.target_hardware),
        dependencies=tuple(data.dependencies),
        entries={definition: _entry(definition, entry, folder, where) for definition, entry in data.entries.items()},
        requires=Requirements(dict(data.requires.modules), tuple(data.requires.cuda_capabilities)),
    )


def _entry(definition: str, entry: EntryModel, folder: Path, where: str) -> SolutionEntry:
    label = f"entries.{definition}"
    file, function = entry.entry_point.split("::")
    for rel in [file, *entry.sources]:
        target = (folder / rel).resolve()  # symbolic links are followed: a link out of the folder is outside
        if not target.is_relative_to(folder.resolve()):
            raise DsaBenchError(f"{label}: {rel!r} lies outside the solution folder (it resolves to {target})", where)
        if not target.is_file():
            raise DsaBenchError(f"{label}: file {rel!r} does not exist in {folder}", where)
    return SolutionEntry(
        definition, file, function, entry.language, entry.destination_passing_style, tuple(entry.sources), entry.unsupported
    )


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
