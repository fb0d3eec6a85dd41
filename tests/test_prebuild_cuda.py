"""tools/prebuild_cuda.py: the solution's CUDA libraries built without a GPU into the folder a GPU
run reads, found there by the solution's own loader, and its refusals."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

import pytest

from dsa_bench.run.loader import solution_package
from dsa_bench.solution import load_solution

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "solutions" / "triton"


def load_tool():
    spec = importlib.util.spec_from_file_location("prebuild_cuda_tool", ROOT / "tools" / "prebuild_cuda.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


tool = load_tool()


def test_it_finds_every_library_of_the_shipped_solution():
    # the four libraries the solution compiles just in time; a new one is found by its load_checked_library call
    assert tool.library_modules(SHIPPED) == ["attention.cuda", "decode.cuda", "indexer.cuda_topk", "indexer.cuda_topk_long"]


def test_a_folder_that_is_not_a_solution_exits_2_with_one_line(tmp_path, capsys):
    assert tool.main(["--into", str(tmp_path / "ext"), "--solution", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "solution folder does not exist" in err[0] and "missing" in err[0]
    assert not (tmp_path / "ext").exists(), "nothing written"


def test_a_solution_without_cuda_libraries_exits_2(tmp_path, capsys):
    code = tool.main(["--into", str(tmp_path / "ext"), "--solution", str(ROOT / "solutions" / "reference")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "reference has no module that builds a CUDA library" in err[0], err


@pytest.mark.slow
def test_the_decode_library_is_built_once_then_found_where_the_solution_looks(tmp_path, monkeypatch):
    """Prebuilt into DIR/<name>, the solution's own loader (with TORCH_EXTENSIONS_DIR=DIR/<name>, as
    a run's worker has it) finds the same library instead of building it; a second prebuild too."""
    if shutil.which("nvcc") is None and not Path("/usr/local/cuda/bin/nvcc").is_file():
        pytest.skip("nvcc is not installed")
    # only the decode, to keep the test short: a copy of the solution without the other libraries' modules
    copy = tmp_path / "triton"
    shutil.copytree(SHIPPED, copy, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("attention/cuda.py", "indexer/cuda_topk.py", "indexer/cuda_topk_long.py"):
        text = (copy / name).read_text()
        (copy / name).write_text(text.replace(tool.LIBRARY_CALL, "load_checked_library(STEM, WHAT, HERE, SOURCES, HEADERS".lower()))
    into = tmp_path / "ext"
    first = tool.prebuild(copy, into, "sm_90a")
    assert [stem for stem, _, _ in first] == ["dsa_mla_decode_sm90"]
    (_, path, seconds), = first
    assert seconds > 0 and path.is_file() and path.parent.parent == into / "triton"
    again = tool.prebuild(copy, into, "sm_90a")
    assert again == [("dsa_mla_decode_sm90", path, 0.0)], "found, not rebuilt"
    # the solution's loader with the worker's TORCH_EXTENSIONS_DIR names the same file
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(into / "triton"))
    package = solution_package(load_solution(copy))
    decode = sys.modules[f"{package}.decode.cuda"]
    cuda_build = sys.modules[f"{package}.common.cuda_build"]
    found = cuda_build.compile_library(decode.STEM, decode.WHAT, decode.HERE, decode.SOURCES, decode.HEADERS, "sm_90a")
    assert found.path == path and found.seconds_built == 0.0
