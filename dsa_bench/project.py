"""Finding the project tree (``workloads/``, ``solutions/``) and resolving names to files."""

from __future__ import annotations

import os
from pathlib import Path

from dsa_bench.errors import DsaBenchError, did_you_mean, name_list
from dsa_bench.solution import MANIFEST, REFERENCE_SOLUTION, Solution, discover, load_solution
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
        if path.is_dir():
            raise DsaBenchError(f"workload {path} is a folder; give a workload YAML file or a workload name (`dsa-bench list workloads`)")
        if not path.is_file():
            raise DsaBenchError(f"workload file {path} does not exist")
        return load_workload(path)
    candidate = root / "workloads" / f"{name_or_path}.yaml"
    if not candidate.is_file():
        known = workload_names(root)
        hint = did_you_mean(name_or_path, known)
        raise DsaBenchError(f"unknown workload {name_or_path!r}{hint}; the workloads in {root / 'workloads'}:\n{name_list(known)}")
    return load_workload(candidate)


def resolve_solution(name_or_path: str, root: Path) -> Solution:
    """A solution by name (a folder under ``solutions/``) or by folder path."""
    path = Path(name_or_path)
    if (path / MANIFEST).is_file() or os.sep in name_or_path or path.is_dir():
        return load_solution(path)
    candidate = root / "solutions" / name_or_path
    if not (candidate / MANIFEST).is_file():
        known = [s.name for s in discover(root / "solutions")]
        hint = did_you_mean(name_or_path, known)
        raise DsaBenchError(f"unknown solution {name_or_path!r}{hint}; the solutions in {root / 'solutions'}:\n{name_list(known)}")
    return load_solution(candidate)


def reference_solution(root: Path) -> Solution | None:
    """The project's reference solution, ``solutions/reference``, if the project has one."""
    folder = root / "solutions" / REFERENCE_SOLUTION
    if not (folder / MANIFEST).is_file():
        return None
    solution = load_solution(folder)
    if solution.name != REFERENCE_SOLUTION:
        raise DsaBenchError(
            f"the project's reference solution must be named {REFERENCE_SOLUTION!r}, not {solution.name!r}", str(folder / MANIFEST)
        )
    return solution


def check_run_solutions(solutions: list[Solution], reference_folders: list[Path]) -> None:
    """Refuse solutions a run cannot tell apart: two with one name (their results, logs and
    workers would mix), or one named ``reference`` from a folder that is not a reference's
    (its results would stand for the reference's). ``reference_folders``: the folders whose
    solution may be named ``reference`` (the project's, and a dataset run's generated one)."""
    allowed = {folder.resolve() for folder in reference_folders}
    seen: dict[str, Solution] = {}
    for solution in solutions:
        if solution.name == REFERENCE_SOLUTION and solution.path.resolve() not in allowed:
            folders = " or ".join(str(f) for f in sorted(allowed))
            raise DsaBenchError(
                f"the solution name {REFERENCE_SOLUTION!r} is reserved for the project's reference solution ({folders}); "
                f"give this solution another name in its manifest",
                str(solution.path / MANIFEST),
            )
        earlier = seen.get(solution.name)
        if earlier is not None:
            if earlier.path == solution.path:
                raise DsaBenchError(f"solution {solution.name!r} ({solution.path}) is given twice")
            raise DsaBenchError(
                f"two solutions are named {solution.name!r}: {earlier.path} and {solution.path}; names must be unique within a run"
            )
        seen[solution.name] = solution


def relative_to_root(path: Path | None, root: Path) -> str | None:
    """``path`` as results record it: relative to the project root (with ``/``) when it lies in
    the project, so stored results name no folder of the machine that made them; else absolute."""
    if path is None:
        return None
    resolved = Path(path).resolve()
    return resolved.relative_to(root.resolve()).as_posix() if resolved.is_relative_to(root.resolve()) else str(resolved)
