"""Just-in-time builds of this solution's CUDA extensions (``torch.utils.cpp_extension.load``).

A build lands in torch's extension cache (``TORCH_EXTENSIONS_DIR``, which the dsa-bench harness
points at ``.cache/dsa-bench/torch_extensions``), so only the first import on a machine
compiles. The module name carries a digest of the sources and headers, so an edited kernel
never reuses a stale build.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path
from types import ModuleType

import torch


class CudaBuildError(RuntimeError):
    """A CUDA extension of this solution cannot be built or loaded here."""


def nvcc_path() -> str | None:
    """The nvcc torch would use (``$CUDA_HOME/bin/nvcc``, else the one on PATH), or None."""
    from torch.utils.cpp_extension import CUDA_HOME

    if CUDA_HOME:
        candidate = Path(CUDA_HOME) / "bin" / "nvcc"
        if candidate.is_file():
            return str(candidate)
    return shutil.which("nvcc")


def source_digest(folder: Path, files: tuple[str, ...]) -> str:
    """Digest of ``files`` (paths relative to ``folder``): their names and their bytes."""
    digest = hashlib.sha256()
    for name in files:
        digest.update(name.encode() + b"\0" + (folder / name).read_bytes() + b"\0")
    return digest.hexdigest()[:12]


def build_extension(
    stem: str, what: str, folder: Path, sources: tuple[str, ...], headers: tuple[str, ...], verbose: bool | None = None
) -> ModuleType:
    """Builds (or loads from the cache) ``sources``; ``what`` names the extension in errors.

    ``sources`` and ``headers`` are paths relative to ``folder`` (the Python module that builds
    them passes its own folder, whose ``csrc/`` holds them).

    ``headers`` are only hashed: ninja does not see edits to headers it was not told about.
    Raises CudaBuildError when there is no GPU, no nvcc, or the compiler fails.
    """
    if not torch.cuda.is_available():
        raise CudaBuildError(
            f"{what} needs a CUDA GPU, but torch.cuda.is_available() is False "
            f"(torch {torch.__version__}, CUDA build {torch.version.cuda})"
        )
    nvcc = nvcc_path()
    if nvcc is None:
        raise CudaBuildError(
            f"{what} is compiled just in time, but nvcc was not found: install the CUDA toolkit matching "
            f"torch's CUDA {torch.version.cuda}, or point CUDA_HOME at it"
        )
    from torch.utils.cpp_extension import load

    if verbose is None:
        verbose = bool(os.environ.get("DSA_BENCH_VERBOSE_BUILD"))
    try:
        return load(
            name=f"{stem}_{source_digest(folder, sources + headers)}",
            sources=[str(folder / s) for s in sources],
            extra_cflags=["-O3"],
            extra_cuda_cflags=["-O3", "-lineinfo"],  # line info: profilers map stalls to source lines
            verbose=verbose,
        )
    except Exception as exc:  # compiler errors arrive as RuntimeError/CalledProcessError with the log
        raise CudaBuildError(f"building {what} with {nvcc} failed: {exc}") from exc
