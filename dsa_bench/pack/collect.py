"""Which files an entry point needs, found by following it inside its solution folder (see pack.pack).
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path, PurePosixPath

from dsa_bench.errors import DsaBenchError
from dsa_bench.files import read_text
from dsa_bench.solution import MANIFEST, Solution, SolutionEntry, solution_files

NATIVE_SUFFIXES = (".cu", ".cuh", ".cpp", ".cc", ".cxx", ".c", ".h", ".hpp", ".hh", ".inl")


COMPILED_SUFFIXES = (".cu", ".cpp", ".cc", ".cxx", ".c")


INCLUDE_LINE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.MULTILINE)


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
        for match in INCLUDE_LINE.finditer(text):
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
