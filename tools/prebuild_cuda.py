"""Build a solution's CUDA libraries for a GPU architecture on a machine without that GPU (or any),
into the folder a GPU run then finds them in.

The shipped solution compiles its CUDA libraries just in time (the decode, the sparse attention and
the indexer's two top-k kernels), each into a cache folder named by a digest of its sources, its
flags and nvcc's version (``solutions/triton/common/cuda_build.py``). On a fresh GPU machine the
first run spends 15–20 s per library building them. Built here with the same nvcc, they are found
instead: a machine lent for minutes spends them measuring. A GPU machine whose nvcc differs just
builds its own (another digest), so a stale prebuild costs nothing but its bytes.

A run points a worker at ``$TORCH_EXTENSIONS_DIR/<solution name>`` (``dsa_bench/run/runner.py``), and
the kernel scripts of ``benchmarks/kernels/`` build in their own process into
``$TORCH_EXTENSIONS_DIR``. So this tool writes into ``--into DIR/<solution name>``:

    python tools/prebuild_cuda.py --into .gpu/ext                 # here (nvcc, no GPU needed)
    TORCH_EXTENSIONS_DIR=.gpu/ext dsa-bench run -w mla_decode_v32_tp4        # on the GPU machine
    TORCH_EXTENSIONS_DIR=.gpu/ext/triton python benchmarks/kernels/mla_decode.py ...

``--solution DIR`` (repeatable) takes another copy of the solution, e.g. a ``--variant`` folder of
``benchmarks/kernels/mla_decode.py``. A library is every module of the solution that calls
``load_checked_library`` with its module-level ``STEM``, ``WHAT``, ``HERE``, ``SOURCES`` and ``HEADERS``.
Exit 2, with one line naming the problem, for a folder that is not a solution or a missing nvcc; 1 if
a build fails (nvcc's last lines printed).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from dsa_bench.errors import DsaBenchError  # noqa: E402
from dsa_bench.paths import safe_file_name  # noqa: E402
from dsa_bench.run.loader import solution_package  # noqa: E402
from dsa_bench.solution import load_solution  # noqa: E402

#: what marks a module that builds a library (the solution's common/cuda_build.py entry point)
LIBRARY_CALL = "load_checked_library(STEM, WHAT, HERE, SOURCES, HEADERS"


def library_modules(folder: Path) -> list[str]:
    """Dotted names (relative to ``folder``) of the modules that build a CUDA library, sorted."""
    found = []
    for path in sorted(folder.rglob("*.py")):
        if "__pycache__" not in path.parts and LIBRARY_CALL in path.read_text(encoding="utf-8", errors="replace"):
            found.append(".".join(path.relative_to(folder).with_suffix("").parts))
    return found


def prebuild(folder: Path, into: Path, arch: str) -> list[tuple[str, Path, float]]:
    """Builds (or finds) every CUDA library of the solution in ``folder`` for ``arch`` under
    ``into/<solution name>``; returns (library, path, seconds built: 0 when it was there)."""
    solution = load_solution(folder)
    root = into / safe_file_name(solution.name)
    package = solution_package(solution)
    built = []
    for name in library_modules(folder):
        module = importlib.import_module(f"{package}.{name}")
        # the solution's own build code (the one its loader runs), so the digest and the folder are its own
        cuda_build = importlib.import_module(module.load_checked_library.__module__)
        compiled = cuda_build.compile_library(module.STEM, module.WHAT, module.HERE, module.SOURCES, module.HEADERS, arch, root=root)
        built.append((module.STEM, compiled.path, compiled.seconds_built))
    return built


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--into", type=Path, required=True, help="the folder a GPU run's TORCH_EXTENSIONS_DIR will name")
    parser.add_argument("--arch", default="sm_90a", help="the GPU architecture (default sm_90a: Hopper, as the kernels need)")
    parser.add_argument("--solution", type=Path, action="append", help="a solution folder (repeatable; default solutions/triton)")
    args = parser.parse_args(argv)
    folders = args.solution or [ROOT / "solutions" / "triton"]
    for folder in folders:
        try:
            built = prebuild(folder.resolve(), args.into.resolve(), args.arch)
        except DsaBenchError as exc:
            print(f"prebuild_cuda: {exc}", file=sys.stderr)
            return 2
        except Exception as exc:  # the solution's own CudaBuildError (its module, not ours), or its import failing
            kind = type(exc).__name__
            print(f"prebuild_cuda: {folder}: {kind}: {exc}", file=sys.stderr)
            return 2 if "nvcc was not found" in str(exc) else 1
        if not built:
            print(f"prebuild_cuda: {folder} has no module that builds a CUDA library ({LIBRARY_CALL}...)", file=sys.stderr)
            return 2
        for stem, path, seconds in built:
            state = f"built in {seconds:.1f} s" if seconds else "already there"
            print(f"{folder.name}: {stem}: {state}: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
