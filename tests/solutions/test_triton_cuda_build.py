"""The solution's CUDA build (solutions/triton/common/cuda_build.py): shared libraries called through ctypes.

Builds need nvcc but no GPU (a library with the CUDA runtime linked in statically opens on a
CPU-only machine), so these run in CI wherever nvcc is installed; the GPU-only checks of
``load_library`` are covered by the kernels' GPU tests.
"""

from __future__ import annotations

import ctypes
import importlib
import threading

import pytest
from conftest import HAS_CUDA, ROOT

from dsa_bench.definitions import indexer
from dsa_bench.run.loader import import_entry
from dsa_bench.solution import load_solution

_, _entry = import_entry(load_solution(ROOT / "solutions" / "triton"), indexer.NAME)
cuda_build = importlib.import_module(f"{_entry.__package__.rsplit('.', 1)[0]}.common.cuda_build")

needs_nvcc = pytest.mark.skipif(cuda_build.nvcc_path() is None, reason="nvcc is not installed")

TINY_HEADER = "#pragma once\nconstexpr int kAnswer = 42;\n"
TINY_SOURCE = """
#include <cstdint>
#include <cuda_runtime_api.h>
#include "tiny.h"
#define EXPORT extern "C" __attribute__((visibility("default")))
__global__ void touch(int* x) { *x = kAnswer; }
EXPORT const int64_t tiny_ANSWER = kAnswer;
EXPORT const char* tiny_error_string(int code) { return code >= 0 ? cudaGetErrorString(static_cast<cudaError_t>(code)) : "negative"; }
EXPORT int tiny_fail(int code) { return code; }
"""
TINY_SIGNATURES = {"fail": (ctypes.c_int, (ctypes.c_int,))}


def tiny_folder(path, source=TINY_SOURCE):
    (path / "tiny.cu").write_text(source)
    (path / "tiny.h").write_text(TINY_HEADER)
    return path


def build_tiny(folder, root, **kwargs):
    return cuda_build.compile_library("tiny", "the tiny library", folder, ("tiny.cu",), ("tiny.h",), "sm_90a", root=root, **kwargs)


def test_arch_and_gencode():
    assert cuda_build.arch_for_capability(9, 0) == "sm_90a"
    assert cuda_build.arch_for_capability(8, 9) == "sm_89"
    assert cuda_build.gencode("sm_90a") == "arch=compute_90a,code=sm_90a"
    assert cuda_build.gencode("sm_80") == "arch=compute_80,code=sm_80"
    with pytest.raises(cuda_build.CudaBuildError, match="arch must look like sm_90a"):
        cuda_build.gencode("compute_90")


def test_digest_follows_sources_headers_flags_and_nvcc(tmp_path, monkeypatch):
    folder = tiny_folder(tmp_path)
    monkeypatch.setattr(cuda_build, "nvcc_version", lambda nvcc: "release 13.0")
    files, flags = ("tiny.cu", "tiny.h"), ("-O3",)
    first = cuda_build.build_digest(folder, files, flags, "nvcc")
    assert cuda_build.build_digest(folder, files, flags, "nvcc") == first
    (folder / "tiny.h").write_text(TINY_HEADER.replace("42", "43"))
    edited = cuda_build.build_digest(folder, files, flags, "nvcc")
    assert edited != first, "an edited header is another build"
    assert cuda_build.build_digest(folder, files, ("-O2",), "nvcc") != edited
    monkeypatch.setattr(cuda_build, "nvcc_version", lambda nvcc: "release 13.1")
    assert cuda_build.build_digest(folder, files, flags, "nvcc") != edited


def test_cache_root_is_torch_extensions_dir_when_set(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    assert cuda_build.cache_root() == tmp_path / "ext"
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert cuda_build.cache_root() == tmp_path / "cache" / "dsa-bench" / "cuda_extensions"


def test_no_nvcc_is_a_build_error_naming_cuda_home(tmp_path, monkeypatch):
    monkeypatch.setattr(cuda_build, "nvcc_path", lambda: None)
    with pytest.raises(cuda_build.CudaBuildError, match="the tiny library is compiled just in time, but nvcc was not found.*CUDA_HOME"):
        build_tiny(tiny_folder(tmp_path), tmp_path / "root")


@pytest.mark.skipif(HAS_CUDA, reason="checks the refusal on a machine without CUDA")
def test_load_without_a_gpu_is_a_build_error(tmp_path):
    with pytest.raises(cuda_build.CudaBuildError, match=r"the tiny library needs a CUDA GPU, but torch.cuda.is_available\(\) is False"):
        cuda_build.load_library("tiny", "the tiny library", tiny_folder(tmp_path), ("tiny.cu",), ("tiny.h",), "tiny_", TINY_SIGNATURES)


@needs_nvcc
def test_compile_error_surfaces_with_the_compiler_message(tmp_path):
    folder = tiny_folder(tmp_path, TINY_SOURCE + "int broken = undeclared_name;\n")
    with pytest.raises(cuda_build.CudaBuildError) as info:
        build_tiny(folder, tmp_path / "root")
    message = str(info.value)
    assert "building the tiny library failed (nvcc exited with" in message
    assert "undeclared_name" in message and "tiny.cu" in message, "nvcc's own error is quoted"
    assert "-gencode arch=compute_90a,code=sm_90a" in message, "and the command"
    (build,) = (tmp_path / "root").iterdir()
    assert list(build.iterdir()) == [], "no partial library is left behind"


@needs_nvcc
def test_build_load_call_and_cache(tmp_path, monkeypatch, capsys):
    folder = tiny_folder(tmp_path)
    monkeypatch.setenv("DSA_BENCH_VERBOSE_BUILD", "1")
    compiled = build_tiny(folder, tmp_path / "root")
    assert "building the tiny library: " in capsys.readouterr().err, "the verbose build prints its command"
    assert compiled.path == tmp_path / "root" / compiled.name / "tiny.so" and compiled.name.startswith("tiny_")
    assert compiled.seconds_built > 0
    assert [p.name for p in compiled.path.parent.iterdir()] == ["tiny.so"], "the temporary file was renamed into place"

    library = cuda_build.CudaLibrary(compiled, "the tiny library", "tiny_", TINY_SIGNATURES)
    assert library.constant("ANSWER") == 42 and library.mismatched({"ANSWER": 41}) == ["ANSWER"]
    library.call("fail", 0)
    with pytest.raises(RuntimeError, match=r"the tiny library: tiny_fail failed: invalid argument \(code 1\)"):
        library.call("fail", 1)  # cudaErrorInvalidValue, named by the statically linked CUDA runtime
    with pytest.raises(cuda_build.CudaBuildError, match="exports no constant tiny_QUESTION"):
        library.constant("QUESTION")
    with pytest.raises(cuda_build.CudaBuildError, match="exports no tiny_missing"):
        cuda_build.CudaLibrary(compiled, "the tiny library", "tiny_", {"missing": (ctypes.c_int, ())})

    again = build_tiny(folder, tmp_path / "root")
    assert (again.path, again.seconds_built) == (compiled.path, 0.0), "the second build comes from the cache"
    (folder / "tiny.h").write_text(TINY_HEADER.replace("42", "43"))
    edited = build_tiny(folder, tmp_path / "root")
    assert edited.name != compiled.name
    assert cuda_build.CudaLibrary(edited, "the tiny library", "tiny_", TINY_SIGNATURES).constant("ANSWER") == 43


@needs_nvcc
def test_concurrent_builds_both_end_with_the_library(tmp_path):
    folder, root = tiny_folder(tmp_path), tmp_path / "root"
    results: list = []
    threads = [threading.Thread(target=lambda: results.append(build_tiny(folder, root))) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 2 and results[0].path == results[1].path
    assert [p.name for p in results[0].path.parent.iterdir()] == ["tiny.so"]
    assert cuda_build.CudaLibrary(results[0], "the tiny library", "tiny_", TINY_SIGNATURES).constant("ANSWER") == 42


@needs_nvcc
def test_checked_load_compares_the_constants_once_per_stem(tmp_path, monkeypatch):
    """load_checked_library opens a stem's library once per process, and a library whose exported
    constants disagree with what its Python side assumes is refused with the names."""
    folder = tiny_folder(tmp_path)
    compiled = build_tiny(folder, tmp_path / "cache")
    opened = []

    def fake_load(stem, what, *args, **kwargs):
        opened.append(stem)
        return cuda_build.CudaLibrary(compiled, what, "tiny_", TINY_SIGNATURES)

    monkeypatch.setattr(cuda_build, "load_library", fake_load)
    monkeypatch.setattr(cuda_build, "_LOADED", {})
    args = ("tiny", "the tiny library", folder, ("tiny.cu",), ("tiny.h",), "tiny_", TINY_SIGNATURES)
    with pytest.raises(cuda_build.CudaBuildError, match=r"tiny.py disagrees with tiny.h on \['ANSWER'\]"):
        cuda_build.load_checked_library(*args, {"ANSWER": 41}, "tiny.py disagrees with tiny.h")
    first = cuda_build.load_checked_library(*args, {"ANSWER": 42}, "tiny.py disagrees with tiny.h")
    assert cuda_build.load_checked_library(*args, {"ANSWER": 42}, "tiny.py disagrees with tiny.h") is first
    assert opened == ["tiny", "tiny"]  # the refused load is not cached; the accepted one is
