"""The shape of solutions/triton: role-named files in every family, one interpreter check, no import
cycle, no import of dsa_bench, and the vendored record descriptors equal to dsa-bench's."""

from __future__ import annotations

import ast
import dataclasses
import importlib
from pathlib import Path

import pytest
from conftest import ROOT

from dsa_bench.definitions import kv_insert as kvi
from dsa_bench.definitions import kv_records as kvr
from dsa_bench.run.loader import import_entry
from dsa_bench.solution import load_solution

SOLUTION_DIR = ROOT / "solutions" / "triton"
FAMILIES = ("attention", "decode", "indexer", "kv_insert", "step")
#: the role names of a family's modules (docs/architecture.md, "The shipped solution's families")
ROLES = {"__init__.py", "entry.py", "shapes.py", "policy.py", "triton_kernels.py", "cuda.py"}

_, _indexer_entry = import_entry(load_solution(SOLUTION_DIR), "dsa_topk_indexer_fp8_h64_d128_topk2048_ps64")
_PACKAGE = _indexer_entry.__package__.rsplit(".", 1)[0]
vendored = importlib.import_module(f"{_PACKAGE}.common.kv_records")
interpreter = importlib.import_module(f"{_PACKAGE}.common.interpreter")


def _modules() -> dict[str, Path]:
    """Dotted name (relative to solutions/triton) -> file, for every Python module of the solution."""
    return {".".join(p.relative_to(SOLUTION_DIR).with_suffix("").parts): p for p in sorted(SOLUTION_DIR.rglob("*.py"))}


def _imports(name: str, path: Path) -> list[str]:
    """The absolute module names ``name`` imports (relative imports resolved; TYPE_CHECKING blocks included)."""
    package = name.rsplit(".", 1)[0] if not path.name == "__init__.py" else name
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                root = ".".join(base + ([node.module] if node.module else []))
                found.append(root)
                found += [f"{root}.{alias.name}" for alias in node.names]  # `from . import cuda`
            else:
                found.append(node.module or "")
    return found


def test_every_family_names_its_files_by_role():
    for family in FAMILIES:
        folder = SOLUTION_DIR / family
        files = {p.name for p in folder.glob("*.py")}
        assert "entry.py" in files, family
        # a family with several CUDA libraries binds each in cuda_<library>.py
        odd = sorted(f for f in files if f not in ROLES and not (f.startswith("cuda_") and f.endswith(".py")))
        assert not odd, f"{family}: files without a role name: {odd}"
    indexer = {p.name for p in (SOLUTION_DIR / "indexer").glob("*.py")}
    assert {"cuda_topk.py", "cuda_topk_long.py", "triton_kernels.py", "policy.py", "shapes.py"} <= indexer


def test_no_import_cycle_inside_the_solution():
    modules = _modules()
    graph = {name: {m for m in _imports(name, path) if m in modules and m != name} for name, path in modules.items()}
    done: set[str] = set()

    def visit(name: str, stack: list[str]) -> None:
        if name in stack:
            raise AssertionError("import cycle: " + " -> ".join([*stack[stack.index(name):], name]))
        if name in done:
            return
        for dep in sorted(graph[name]):
            visit(dep, [*stack, name])
        done.add(name)

    for name in graph:
        visit(name, [])


def test_the_solution_imports_nothing_from_dsa_bench():
    """So that its packed Solution JSON runs where dsa-bench is not installed."""
    offenders = [f"{name}: {m}" for name, path in _modules().items() for m in _imports(name, path) if m.split(".")[0] == "dsa_bench"]
    assert not offenders


def test_no_module_level_name_hides_an_imported_module():
    """A function named like a module its file imports replaces that module for the rest of the file (the indexer
    entry's ``cuda_topk`` did, and its GPU path called ``.filtered_topk`` on the function)."""
    clashes = []
    for name, path in _modules().items():
        tree = ast.parse(path.read_text(), str(path))
        imported = {alias.asname or alias.name.split(".")[0] for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))
                    for alias in node.names}  # fmt: skip
        defined = {node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
        defined |= {t.id for node in tree.body if isinstance(node, ast.Assign) for t in node.targets if isinstance(t, ast.Name)}
        clashes += [f"{name}.{clash}" for clash in sorted(imported & defined)]
    assert not clashes, clashes


def test_one_interpreter_check():
    """Only common/interpreter.py decides whether the kernels run under Triton's interpreter."""
    for name, path in _modules().items():
        if name == "common.interpreter":
            continue
        text = path.read_text()
        assert "InterpretedFunction" not in text and not any(
            isinstance(node, ast.Constant) and node.value == "TRITON_INTERPRET" for node in ast.walk(ast.parse(text))
        ), f"{name} decides for itself whether the interpreter runs"
    assert interpreter.INTERPRETED, "conftest sets TRITON_INTERPRET=1 before the solution is imported"


def test_interpreter_check_refuses_cpu_tensors_when_compiled(monkeypatch):
    import torch

    monkeypatch.setattr(interpreter, "INTERPRETED", False)
    with pytest.raises(RuntimeError, match="CPU tensors need the Triton interpreter"):
        interpreter.interpreted(torch.device("cpu"))
    assert interpreter.device_problem(torch.device("cuda", 0)) is None


@pytest.mark.parametrize("name", sorted(vendored.FORMATS))
def test_vendored_descriptors_equal_dsa_benchs(name):
    mine, theirs = vendored.FORMATS[name], kvr.FORMATS[name]
    for field in dataclasses.fields(mine):
        assert getattr(mine, field.name) == getattr(theirs, field.name), f"{name}.{field.name}"
    for prop in ("rope_bytes", "data_row_bytes", "bytes_per_token", "num_scales", "scale_element_bytes", "input_dims"):
        assert getattr(mine, prop) == getattr(theirs, prop), f"{name}.{prop}"
    for bs in ([mine.block_size] if mine.block_size else [1, 2, 61, 64, 1000]):
        assert mine.packed_page_bytes(bs) == theirs.packed_page_bytes(bs), (name, bs)
        for slot in sorted({0, 1 % bs, bs // 2, bs - 1}):
            assert mine.offsets(slot, bs) == theirs.offsets(slot, bs), (name, bs, slot)
    with pytest.raises(ValueError, match="outside a page"):
        mine.offsets(mine.block_size or 64, mine.block_size or 64)


def test_vendored_constants_equal_dsa_benchs():
    assert (vendored.FP8_E4M3_MAX, vendored.MIN_FP8_SCALE, vendored.UE8M0_BIAS) == (kvr.FP8_E4M3_MAX, kvr.MIN_FP8_SCALE, kvr.UE8M0_BIAS)
    # every MLA format a kernel entry takes, and the indexer key page the decode step writes
    assert {f.kv_format for f in kvi.FORMAT_OF.values()} | {kvr.INDEXER_KEY_PAGE.kv_format} <= set(vendored.FORMATS)
    kv_shapes = importlib.import_module(f"{_PACKAGE}.kv_insert.shapes")
    assert (kv_shapes.LATENT_DIMS, kv_shapes.ROPE_DIMS) == (kvi.LATENT_DIMS, kvi.ROPE_DIMS)
