"""Importing or building a solution's entry point inside its worker.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import re
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dsa_bench.solution import Solution, SolutionEntry


def _package_name(solution: Solution) -> str:
    slug = re.sub(r"\W", "_", solution.name)
    return f"dsa_solution_{slug}_{hashlib.sha1(str(solution.path).encode()).hexdigest()[:8]}"


def solution_package(solution: Solution) -> str:
    """The name of a package rooted at the solution folder (registered once per process), so that
    the solution's modules import each other relatively as ``<package>.<dotted path>``."""
    package = _package_name(solution)
    if package not in sys.modules:
        module = types.ModuleType(package)
        module.__path__ = [str(solution.path)]
        sys.modules[package] = module
    return package


def import_entry(solution: Solution, definition: str) -> tuple[Callable[..., Any], types.ModuleType | None]:
    """The entry function (and its module, for Python entries), imported or built.

    Python and Triton entries are imported as a module of a package rooted at the solution
    folder, so relative imports between the solution's files work; the folder is also put on
    ``sys.path`` for absolute sibling imports. A packed solution (``solution.packed_from``) is
    imported as flashinfer-bench imports it instead: its folder is the package of that name, only
    the folder's parent goes on ``sys.path`` (see :mod:`dsa_bench.flashinfer_bench.packed`), so an absolute
    sibling import fails here as it would there. CUDA entries are compiled with
    ``torch.utils.cpp_extension.load`` into torch's extension cache (``TORCH_EXTENSIONS_DIR``).
    Any exception propagates: the caller reports it as a compile error.
    """
    entry = solution.entry_for(definition)
    if entry.language == "cuda":
        return _build_cuda_entry(solution, entry), None
    if solution.packed_from is not None:
        package = solution.path.name
        if str(solution.path.parent) not in sys.path:
            sys.path.insert(0, str(solution.path.parent))
    else:
        package = solution_package(solution)
        if str(solution.path) not in sys.path:
            sys.path.insert(0, str(solution.path))
    dotted = ".".join(Path(entry.file).with_suffix("").parts)
    module = importlib.import_module(f"{package}.{dotted}")
    function = getattr(module, entry.function, None)
    if not callable(function):
        raise AttributeError(f"{entry.file} defines no function {entry.function!r}")
    return function, module


def _build_cuda_entry(solution: Solution, entry: SolutionEntry) -> Callable[..., Any]:
    from torch.utils.cpp_extension import load

    sources = [str(solution.path / entry.file)] + [
        str(solution.path / s) for s in entry.sources if s.endswith((".cu", ".cpp"))
    ]
    definition_slug = re.sub(r"\W", "_", entry.definition)
    name = f"{_package_name(solution)}_{definition_slug}"[:100]
    module = load(name=name, sources=sources, extra_cuda_cflags=["-O3"], verbose=bool(os.environ.get("DSA_BENCH_VERBOSE_BUILD")))
    function = getattr(module, entry.function, None)
    if not callable(function):
        raise AttributeError(f"{entry.file} exports no function {entry.function!r}")
    return function
