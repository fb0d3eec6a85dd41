"""The Makefile's install paths (`make -n`: what would run, nothing installed): `make run` gets the
runtime only, `make test` the test tools and Ray too, and a machine without an NVIDIA driver gets
a one-line hint about the CPU wheel index instead of a silent multi-GB CUDA build."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from conftest import ROOT

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def _dry_run(target: str, tmp_path, **variables: str) -> str:
    args = ["make", "-n", target, f"VENV={tmp_path / 'venv'}", "PYTHON=python3", *(f"{k}={v}" for k, v in variables.items())]
    proc = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=60, check=True)
    return proc.stdout


def test_make_run_installs_the_runtime_only(tmp_path):
    commands = _dry_run("run", tmp_path)
    assert "pip install -e ." in commands
    assert "[dev" not in commands and "ray" not in commands and "flashinfer-bench" not in commands, commands
    assert "TORCH_INDEX=https://download.pytorch.org/whl/cpu" in commands, "the hint for a machine without a driver"
    assert "--index-url" not in commands, "no index is reached for unless TORCH_INDEX is given"
    with_index = _dry_run("install", tmp_path, TORCH_INDEX="https://download.pytorch.org/whl/cpu")
    assert "--index-url https://download.pytorch.org/whl/cpu" in with_index and "no NVIDIA driver" not in with_index


def test_make_test_adds_the_dev_tools_and_ray(tmp_path):
    commands = _dry_run("test", tmp_path)
    assert "pip install -e \".[dev,ray]\"" in commands and "flashinfer-bench==" in commands
    assert "pytest -q -n 2 -m \"not slow\"" in commands  # two workers (pytest-xdist, a dev tool)
