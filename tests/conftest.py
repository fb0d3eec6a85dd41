"""Shared test helpers. Triton kernels in tests run under the interpreter on CPU tensors."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"

if not torch.cuda.is_available():
    # Must be set before any Triton kernel is defined (i.e. before solution modules import).
    os.environ.setdefault("TRITON_INTERPRET", "1")

HAS_CUDA = torch.cuda.is_available()


def load_script(name: str, folder: str = "benchmarks/kernels") -> types.ModuleType:
    """A script of ``folder`` (benchmarks/kernels/, tools/) imported from its file (the folder is no
    package and stays off sys.path), registered in sys.modules so its dataclasses resolve their module."""
    spec = importlib.util.spec_from_file_location(f"script_{folder.replace('/', '_')}_{name}", ROOT / folder / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords and not HAS_CUDA:
            item.add_marker(skip_gpu)


def run_cli(*args: str, cwd: Path = ROOT, timeout: float = 900) -> subprocess.CompletedProcess:
    """Run ``python -m dsa_bench ARGS`` as a user would, capturing its output."""
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)  # the harness decides this for its workers
    return subprocess.run(
        [sys.executable, "-m", "dsa_bench", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def exported_symbols(library: Path) -> set[str] | None:
    """The dynamic symbols a shared library defines (``nm -D --defined-only``), None without nm."""
    import shutil

    nm = shutil.which("nm")
    if nm is None:
        return None
    proc = subprocess.run([nm, "-D", "--defined-only", str(library)], capture_output=True, text=True, check=True)
    return {line.split()[-1] for line in proc.stdout.splitlines() if line.strip()}


@pytest.fixture
def cpu() -> torch.device:
    return torch.device("cpu")


def cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """``dsa-bench ARGS`` in this process (typer's CliRunner), for commands that start no worker;
    the same exit code, output and error output a user sees."""
    from typer.testing import CliRunner

    from dsa_bench.cli import app

    previous = Path.cwd()
    os.chdir(cwd)
    try:
        result = CliRunner().invoke(app, list(args))
    finally:
        os.chdir(previous)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return subprocess.CompletedProcess(list(args), result.exit_code, result.stdout, result.stderr)


def relative_copy(folder: Path) -> Path:
    """tests/fixtures/pack/multi_file with its absolute sibling imports made relative, as flashinfer-bench needs them."""
    shutil.copytree(FIXTURES / "pack" / "multi_file", folder)
    for rel, old, new in (
        ("indexer_kernel.py", "from common import constants", "from .common import constants"),
        ("attn/entry.py", "from common.constants import PAGE_SIZE", "from ..common.constants import PAGE_SIZE"),
    ):
        text = (folder / rel).read_text()
        assert old in text
        (folder / rel).write_text(text.replace(old, new))
    return folder
