"""Reading a flashinfer-bench dataset folder's workloads and solutions (its definitions:
:mod:`dsa_bench.definitions.from_dataset`).

Layout (the ecosystem's, as in the contest dataset)::

    DATASET/definitions/[group/]<definition>.json
    DATASET/workloads/[group/]<definition>.jsonl   one {"definition", "solution": null, "workload"} per line
    DATASET/blob/...                                safetensors files that workloads name
    DATASET/solutions/**/<name>.json                packed Solutions (run with --dataset-solutions)

A workload line's ``workload`` holds ``uuid``, ``axes`` (the variable axes) and ``inputs`` of type
``random``, ``scalar`` (``value``) or ``safetensors`` (``path`` relative to the dataset root,
``tensor_key``); inputs not named are random (drawn as the definition says).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dsa_bench.definitions.base import Definition
from dsa_bench.definitions.from_dataset import check_dataset_root, dataset_definitions, register_dataset_definition
from dsa_bench.errors import DsaBenchError
from dsa_bench.files import read_jsonl
from dsa_bench.paths import safe_file_name
from dsa_bench.solution import REFERENCE_SOLUTION
from dsa_bench.workloads import Case, RunSettings, Workload, parse_case


def _workload_lines(path: Path) -> list[tuple[str, dict[str, Any]]]:
    """(``file:line``, record) of every line of a workloads ``.jsonl`` file."""
    records = []
    for where, record in read_jsonl(path, "workload"):
        if not isinstance(record, dict) or not isinstance(record.get("definition"), str):
            raise DsaBenchError("a workload line must be an object with a string 'definition' and a 'workload'", where)
        records.append((where, record))
    return records


def _case(record: dict[str, Any], definition: Definition, where: str, root: Path) -> Case:
    workload = record.get("workload")
    if not isinstance(workload, dict):
        raise DsaBenchError("field 'workload' must be an object with uuid, axes and inputs", where)
    uuid = workload.get("uuid")
    if not isinstance(uuid, str) or not uuid:
        raise DsaBenchError("workload.uuid must be a non-empty string", where)
    unknown = set(workload) - {"uuid", "axes", "inputs"}
    if unknown:
        raise DsaBenchError(f"workload has unknown field(s) {sorted(unknown)}; expected uuid, axes, inputs", where)
    # dsa-bench's trace case format shares the ecosystem's input sources; paths are relative to
    # the dataset root.
    case = {"id": uuid, "axes": workload.get("axes"), "inputs": workload.get("inputs", {})}
    return parse_case(case, definition, where, base_dir=root)


def _workload_files(root: Path) -> list[Path]:
    folder = root / "workloads"
    return sorted(folder.rglob("*.jsonl")) if folder.is_dir() else []


def load_dataset_workload(root: Path, selector: str, settings: RunSettings | None = None) -> Workload:
    """A workload from a dataset: every workload line of a definition (by name), or one .jsonl file.

    ``selector`` is a definition name, or a path to a workloads ``.jsonl`` (absolute, relative to
    the working directory, or relative to the dataset root).
    """
    root = root.resolve()
    check_dataset_root(root)
    definitions = dataset_definitions(root)
    file = next((p for p in (Path(selector), root / selector) if p.suffix == ".jsonl" and p.is_file()), None)
    if file is not None:
        lines = _workload_lines(file)
        names = sorted({r["definition"] for _, r in lines})
        if len(names) != 1:
            raise DsaBenchError(f"a workload file must hold one definition's workloads, found {names or 'none'}", str(file))
        name, workload_name = names[0], file.stem
    elif selector.endswith(".jsonl"):
        raise DsaBenchError(f"workload file {selector} does not exist (looked in the working directory and in {root})")
    else:
        name = workload_name = selector
        if name not in definitions:
            known = ", ".join(sorted(definitions)) or "(none)"
            raise DsaBenchError(f"dataset has no definition {name!r}; its definitions: {known}", str(root))
        lines = [(w, r) for f in _workload_files(root) for w, r in _workload_lines(f) if r["definition"] == name]
    definition = register_dataset_definition(root, name)
    cases: list[Case] = []
    seen: dict[str, str] = {}
    for where, record in lines:
        case = _case(record, definition, where, root)
        if case.id in seen:
            raise DsaBenchError(f"workload uuid {case.id!r} already used at {seen[case.id]}", where)
        seen[case.id] = where
        cases.append(case)
    if not cases:
        raise DsaBenchError(f"dataset holds no workloads for definition {name!r} under {root / 'workloads'}")
    return Workload(
        name=workload_name,
        path=file.resolve() if file is not None else root,
        definition=definition,
        cases=tuple(cases),
        settings=settings or RunSettings(tolerance=definition.tolerance or RunSettings().tolerance),
        description=f"flashinfer-bench dataset {root}",
        trace_path=file.resolve() if file is not None else None,
    )


def dataset_solution_files(root: Path) -> list[Path]:
    """The dataset's packed Solution JSONs, ``solutions/**/*.json`` (flashinfer-bench's layout)."""
    check_dataset_root(root)
    folder = root / "solutions"
    return sorted(folder.rglob("*.json")) if folder.is_dir() else []


# --------------------------------------------------------------------------- reference solution


def reference_solution_folder(definition: Definition, cache_dir: Path) -> Path:
    """A solution folder named ``reference`` that runs a dataset definition's own reference.

    Speedups need a reference timed in the same run; for a definition dsa-bench has no reference
    solution of, that is the definition JSON's ``run``. The folder is regenerated on every call.
    """
    folder = cache_dir / "dataset_references" / safe_file_name(definition.name)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "reference.py").write_text(
        '"""Generated by dsa-bench: runs the dataset definition\'s reference (its JSON `run`)."""\n\n'
        "from dsa_bench.definitions import get_definition\n\n"
        f"_DEFINITION = get_definition({definition.name!r})\n\n\n"
        "def run(*inputs):\n"
        "    return _DEFINITION.reference(*inputs)\n"
    )
    manifest = {
        "name": REFERENCE_SOLUTION,
        "author": "dsa-bench",
        "description": f"The reference of dataset definition {definition.name}, generated by dsa-bench.",
        "target_hardware": ["cpu", "cuda"],
        "dependencies": ["torch"],
        "entries": {definition.name: {"entry_point": "reference.py::run", "language": "python", "destination_passing_style": False}},
    }
    (folder / "solution.yaml").write_text(json.dumps(manifest, indent=2) + "\n")  # JSON is valid YAML
    return folder
