"""Finding the project tree (``workloads/``, ``solutions/``) and resolving names to files."""

from __future__ import annotations

import os
from pathlib import Path

from dsa_bench.errors import DsaBenchError
from dsa_bench.solutions import MANIFEST, Solution, discover, load_solution
from dsa_bench.workloads import Workload, load_workload


def find_root(start: Path | None = None) -> Path:
    """The project root: ``$DSA_BENCH_ROOT``, else the nearest folder at or above the working
    directory holding ``workloads/``, else the checkout this package was installed from."""
    if os.environ.get("DSA_BENCH_ROOT"):
        return Path(os.environ["DSA_BENCH_ROOT"]).resolve()
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if (folder / "workloads").is_dir():
            return folder
    return Path(__file__).resolve().parent.parent


def workload_names(root: Path) -> list[str]:
    return sorted(p.stem for p in (root / "workloads").glob("*.yaml"))


def resolve_workload(name_or_path: str, root: Path) -> Workload:
    """A workload by name (``workloads/<name>.yaml``) or by path."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or path.exists():
        if not path.is_file():
            raise DsaBenchError(f"workload file {path} does not exist")
        return load_workload(path)
    candidate = root / "workloads" / f"{name_or_path}.yaml"
    if not candidate.is_file():
        known = ", ".join(workload_names(root)) or "(none)"
        raise DsaBenchError(f"unknown workload {name_or_path!r}; workloads in {root / 'workloads'}: {known}")
    return load_workload(candidate)


def resolve_solution(name_or_path: str, root: Path) -> Solution:
    """A solution by name (a folder under ``solutions/``) or by folder path."""
    path = Path(name_or_path)
    if (path / MANIFEST).is_file() or os.sep in name_or_path or path.is_dir():
        return load_solution(path)
    candidate = root / "solutions" / name_or_path
    if not (candidate / MANIFEST).is_file():
        known = ", ".join(s.name for s in discover(root / "solutions")) or "(none)"
        raise DsaBenchError(f"unknown solution {name_or_path!r}; solutions in {root / 'solutions'}: {known}")
    return load_solution(candidate)
