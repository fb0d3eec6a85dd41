"""A packed Solution as flashinfer-bench sees it: the package it is imported as, the imports that break
there, and the folder dsa-bench runs it from (``run -s FILE.json``, a dataset's ``solutions/``).

flashinfer-bench (0.1.2, ``compile/builders/python_builder.py``) writes a Python or Triton
solution's sources into ``CACHE/<kind>/<package>/<package>/``, puts ``CACHE/<kind>/<package>`` (and
nothing else of the solution) on ``sys.path`` and imports ``<package>.<entry file's dotted path>``.
``<package>`` is ``fib_<language>_`` + the solution's name with every character outside
``[0-9A-Za-z_]`` made ``_`` (``_`` first when that is empty or starts with a digit) + ``_`` + the first
six hex digits of the solution's content hash (:func:`flashinfer_hash`). So relative imports between
the sources work, and an absolute import of a sibling module (``import common.x``,
``from indexer import y``), which works under dsa-bench's folder loader (the folder is on
``sys.path``), fails there. :func:`import_problems` finds those; :func:`materialize` lays a packed
JSON out exactly that way, and the loader imports it the same way.
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import os
import re
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Any

from dsa_bench.files import DIR_MODE
from dsa_bench.pack.document import read_solution_document
from dsa_bench.pack.pack import unpack_solutions
from dsa_bench.solution import Solution, content_hash, load_solution


def flashinfer_hash(document: Mapping[str, Any]) -> str:
    """flashinfer-bench's content hash of a Solution (``Solution.hash()``): sha1 over its name,
    definition, language, entry point, binding (empty when absent), dependencies, then every
    source's path and content, in order, concatenated."""
    spec = document["spec"]
    digest = hashlib.sha1()
    parts = [document["name"], document["definition"], spec["language"], spec["entry_point"], spec.get("binding") or ""]
    parts += list(spec.get("dependencies") or [])
    parts += [part for source in document["sources"] for part in (source["path"], source["content"])]
    for part in parts:
        digest.update(part.encode())
    return digest.hexdigest()


def package_name(document: Mapping[str, Any]) -> str:
    """The Python package flashinfer-bench imports a packed Python or Triton solution as."""
    slug = re.sub(r"[^0-9a-zA-Z_]", "_", document["name"])
    if not slug or slug[0].isdigit():
        slug = "_" + slug
    return f"fib_{document['spec']['language']}_{slug}_{flashinfer_hash(document)[:6]}"


# --------------------------------------------------------------------------- imports that break there


def _top_level_modules(paths: list[str]) -> set[str]:
    """Names an absolute import could reach in the sources: root ``x.py`` files and root folders."""
    names = set()
    for path in paths:
        parts = PurePosixPath(path).parts
        if len(parts) > 1:
            names.add(parts[0])  # a package, or a namespace package (no __init__.py needed)
        elif path.endswith(".py"):
            names.add(path[:-3])
    return names


def _absolute_imports(tree: ast.Module, dots: str) -> list[tuple[int, str, str, str]]:
    """(line, absolute module name, the statement, its relative form) of every absolute import in
    ``tree``, including ``importlib.import_module("name")`` and ``__import__("name")`` with a
    literal name; ``dots`` is the relative prefix that names the package root from this file."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                parent, _, last = alias.name.rpartition(".")
                found.append((node.lineno, alias.name, f"import {alias.name}", f"from {dots}{parent} import {last}"))
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = ", ".join(alias.name if alias.asname is None else f"{alias.name} as {alias.asname}" for alias in node.names)
            found.append((node.lineno, node.module, f"from {node.module} import {names}", f"from {dots}{node.module} import {names}"))
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
            function = node.func
            called = function.attr if isinstance(function, ast.Attribute) else function.id if isinstance(function, ast.Name) else ""
            name = node.args[0].value
            given_package = len(node.args) > 1 or any(k.arg == "package" for k in node.keywords)
            if called == "import_module" and not name.startswith(".") and not given_package or called == "__import__":
                found.append((node.lineno, name, f"{called}({name!r})", f"importlib.import_module({dots + name!r}, __package__)"))
    return found


def import_problems(document: Mapping[str, Any], where: str) -> list[str]:
    """Imports in a packed Python/Triton solution's sources that fail when flashinfer-bench imports
    it: absolute imports of a module among the sources (``where: path:line: ...``). Empty for CUDA."""
    if document["spec"]["language"] not in ("python", "triton"):
        return []
    sources = document["sources"]
    packed = _top_level_modules([s["path"] for s in sources])
    package = package_name(document)
    problems = []
    for source in sources:
        path = source["path"]
        if not path.endswith(".py"):
            continue
        dots = "." * len(PurePosixPath(path).parts)  # one for the file's own package, one per folder above it
        for line, module, statement, relative in _absolute_imports(ast.parse(source["content"], filename=path), dots):
            top = module.split(".")[0]
            if top in packed:
                problems.append(
                    f"{where}: {path}:{line}: `{statement}` imports the packed module {top!r} by its absolute name. flashinfer-bench "
                    f"imports these sources as the package {package}, without the solution folder on sys.path, so this import "
                    f"fails there; make it relative: `{relative}`"
                )
    return problems


# --------------------------------------------------------------------------- running a packed JSON


def materialize(json_path: Path, cache_dir: Path) -> Solution:
    """The packed Solution JSON ``json_path`` as a solution folder laid out as flashinfer-bench lays it
    out: ``cache_dir/packed/<package>/<package>/`` (sources, and the ``solution.yaml`` ``unpack``
    writes), named by the document's own name. The returned solution's ``packed_from`` makes the
    loader import it as flashinfer-bench does (only ``cache_dir/packed/<package>`` on ``sys.path``).

    A folder already there with the same files is reused (the package name holds the content hash);
    anything else there is replaced.
    """
    document = read_solution_document(json_path)
    package = package_name(document)
    home = cache_dir / "packed"
    home.mkdir(parents=True, exist_ok=True)
    final = home / package / package
    staging = Path(tempfile.mkdtemp(prefix=".materialize-", dir=home))
    try:
        os.chmod(staging, DIR_MODE)  # readable by an unprivileged worker, as the package's parent must be
        fresh = unpack_solutions([json_path], staging / package, name=document["name"])
        if not (final.is_dir() and content_hash(final) == content_hash(fresh)):
            if final.parent.exists():
                shutil.rmtree(final.parent)
            os.rename(staging, final.parent)
            staging = Path()
    finally:
        if staging != Path():
            shutil.rmtree(staging, ignore_errors=True)
    return dataclasses.replace(load_solution(final), packed_from=json_path.resolve())

