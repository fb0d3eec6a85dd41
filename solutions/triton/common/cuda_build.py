"""Just-in-time builds of this solution's CUDA code: one shared library per extension, called through ctypes.

Each extension is CUDA sources plus a small C ABI (``extern "C"`` functions taking device
pointers, strides, the stream and the device; no torch or pybind11 headers, which were most of a
fresh machine's build time). ``compile_library`` builds it with ONE nvcc invocation
(``nvcc_command``) into a cache folder named by the extension's stem and a digest of its sources,
headers, flags and nvcc's version: ``$TORCH_EXTENSIONS_DIR/<stem>_<digest>/`` when that is set
(the dsa-bench harness points it at ``.cache/dsa-bench/torch_extensions``), else a per-user cache
folder. So only the first import on a machine compiles, and an edited kernel never reuses a
stale build. It needs no GPU (CI compiles exactly what a device would, for an explicit arch);
``load_library`` adds the checks a GPU run needs and opens the library (``CudaLibrary``).

Concurrent builds need no lock: each compiles to a temporary file of its own in the cache
folder and renames it into place (``os.replace`` is atomic), so two workers building at once
both end with a complete library.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import secrets
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: the flags of every build, before the target and the sources (part of the digest). Static
#: cudart (nvcc's default) makes the library self-contained; hidden visibility and
#: ``--exclude-libs`` export only the C ABI, so the library's runtime calls never bind to the
#: libcudart torch loaded globally.
COMMON_FLAGS = (
    "-O3", "-lineinfo", "-std=c++17", "-shared", "-Xcompiler", "-fPIC", "-Xcompiler", "-fvisibility=hidden",
    "-Xlinker", "--exclude-libs,ALL",
)  # fmt: skip
#: the shared headers of the SM90 warp-specialised kernels (the C ABI's helpers, the mbarrier and
#: named-barrier wrappers, the fast exp), relative to a sibling solution folder such as decode/
SM90_KERNEL_HEADERS = ("../common/csrc/capi.h", "../common/csrc/sm90_sync.cuh", "../common/csrc/fast_math.cuh")
#: lines of nvcc's output a build error quotes
ERROR_TAIL_LINES = 40


class CudaBuildError(RuntimeError):
    """A CUDA extension of this solution cannot be built or loaded here."""


def nvcc_path() -> str | None:
    """``$CUDA_HOME/bin/nvcc`` (or ``$CUDA_PATH/bin/nvcc``) when there is one, else the nvcc on
    PATH, else ``/usr/local/cuda/bin/nvcc`` when present, else None (torch's own search order)."""
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home and (Path(home) / "bin" / "nvcc").is_file():
        return str(Path(home) / "bin" / "nvcc")
    fallback = Path("/usr/local/cuda/bin/nvcc")
    return shutil.which("nvcc") or (str(fallback) if fallback.is_file() else None)


@functools.cache
def nvcc_version(nvcc: str) -> str:
    """``nvcc --version``'s output (part of the digest: another toolkit is another build)."""
    try:
        proc = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise CudaBuildError(f"{nvcc} --version failed: {exc}") from exc
    if proc.returncode != 0:
        raise CudaBuildError(f"{nvcc} --version exited with {proc.returncode}: {proc.stderr.strip()}")
    return proc.stdout.strip()


def arch_for_capability(major: int, minor: int) -> str:
    """The SASS target of a compute capability: ``sm_90a`` for 9.x (the arch-specific features
    wgmma, TMA and clusters need it), plain ``sm_XY`` otherwise."""
    return f"sm_{major}{minor}a" if major == 9 else f"sm_{major}{minor}"


def gencode(arch: str) -> str:
    """nvcc's ``-gencode`` value for ``arch`` (``sm_90a`` -> ``arch=compute_90a,code=sm_90a``): SASS only, no PTX."""
    if not arch.startswith("sm_") or not arch[3:].rstrip("a").isdigit():
        raise CudaBuildError(f"arch must look like sm_90a or sm_80, got {arch!r}")
    return f"arch=compute_{arch[3:]},code={arch}"


def nvcc_command(
    nvcc: str, folder: Path, sources: tuple[str, ...], arch: str, output: Path, extra_flags: tuple[str, ...] = ()
) -> list[str]:
    """The one nvcc invocation that compiles and links ``sources`` (relative to ``folder``) into ``output``."""
    return [nvcc, *COMMON_FLAGS, "-gencode", gencode(arch), *extra_flags, *(str(folder / s) for s in sources), "-o", str(output)]


def build_digest(folder: Path, files: tuple[str, ...], flags: tuple[str, ...], nvcc: str) -> str:
    """Digest of ``files`` (relative to ``folder``: their names and bytes), the build's flags and nvcc's version."""
    digest = hashlib.sha256()
    for name in files:
        digest.update(name.encode() + b"\0" + (folder / name).read_bytes() + b"\0")
    digest.update("\0".join(flags).encode() + b"\0" + nvcc_version(nvcc).encode())
    return digest.hexdigest()[:16]


def cache_root() -> Path:
    """Where builds go: ``$TORCH_EXTENSIONS_DIR``, else ``$XDG_CACHE_HOME`` (or ``~/.cache``) ``/dsa-bench/cuda_extensions``."""
    if os.environ.get("TORCH_EXTENSIONS_DIR"):
        return Path(os.environ["TORCH_EXTENSIONS_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "dsa-bench" / "cuda_extensions"


@dataclass(frozen=True)
class CompiledLibrary:
    """A built shared library: ``name`` is ``<stem>_<digest>``, its cache folder's name."""

    name: str
    path: Path
    command: tuple[str, ...]  # the nvcc invocation that builds it (with its final path as the target)
    log: str  # nvcc's output when this call built it; "" when it came from the cache
    seconds_built: float  # 0.0 when it came from the cache


def _verbose(verbose: bool | None) -> bool:
    return bool(os.environ.get("DSA_BENCH_VERBOSE_BUILD")) if verbose is None else verbose


def compile_library(
    stem: str, what: str, folder: Path, sources: tuple[str, ...], headers: tuple[str, ...], arch: str,
    root: Path | None = None, extra_flags: tuple[str, ...] = (), verbose: bool | None = None,
) -> CompiledLibrary:  # fmt: skip
    """Builds ``sources`` (paths relative to ``folder``, which also hold ``headers``) for ``arch``
    into ``root`` (default ``cache_root()``), or finds the build already there; needs no GPU.

    ``headers`` are only hashed (nvcc finds them through the sources' includes). ``extra_flags``
    (e.g. ``("-Xptxas", "-v")`` in tests) join the command and the digest. ``what`` names the
    extension in errors. Raises CudaBuildError when there is no nvcc or the compiler fails.
    """
    nvcc = nvcc_path()
    if nvcc is None:
        import torch

        raise CudaBuildError(
            f"{what} is compiled just in time, but nvcc was not found: install the CUDA toolkit matching "
            f"torch's CUDA {torch.version.cuda}, or point CUDA_HOME at it (CUDA_HOME is {os.environ.get('CUDA_HOME')!r})"
        )
    flags = (*COMMON_FLAGS, "-gencode", gencode(arch), *extra_flags)
    try:
        name = f"{stem}_{build_digest(folder, sources + headers, flags, nvcc)}"
    except OSError as exc:
        raise CudaBuildError(f"cannot read the sources of {what}: {exc}") from exc
    target = (root or cache_root()) / name / f"{stem}.so"
    command = tuple(nvcc_command(nvcc, folder, sources, arch, target, extra_flags))
    if target.is_file():
        return CompiledLibrary(name, target, command, "", 0.0)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CudaBuildError(f"cannot create the build folder of {what} ({target.parent}): {exc}") from exc
    partial = target.parent / f".{stem}.{os.getpid()}.{secrets.token_hex(4)}.so"  # this build's own file
    building = [*command[:-1], str(partial)]
    if _verbose(verbose):
        print(f"building {what}: {' '.join(building)}", file=sys.stderr, flush=True)
    started = time.perf_counter()
    try:
        proc = subprocess.run(building, capture_output=True, text=True, check=False)
    except OSError as exc:
        partial.unlink(missing_ok=True)
        raise CudaBuildError(f"building {what} failed to start {nvcc}: {exc}") from exc
    seconds = time.perf_counter() - started
    log = (proc.stdout + proc.stderr).strip()
    if proc.returncode != 0 or not partial.is_file():
        partial.unlink(missing_ok=True)
        tail = "\n".join(log.splitlines()[-ERROR_TAIL_LINES:])
        raise CudaBuildError(f"building {what} failed (nvcc exited with {proc.returncode}): {' '.join(building)}\n{tail}")
    os.replace(partial, target)  # atomic: a concurrent build's rename leaves an equally complete file
    if _verbose(verbose):
        print(f"built {what} in {seconds:.1f} s: {target}", file=sys.stderr, flush=True)
    return CompiledLibrary(name, target, command, log, seconds)


#: a C function's (restype, argtypes) for ctypes
Signature = tuple[Any, tuple[Any, ...]]


class CudaLibrary:
    """An opened shared library with a C ABI whose exports share ``prefix``: functions declared
    with their C signatures, ``int64_t`` constants, and ``<prefix>error_string(int)``, which
    names the codes the functions return (0 fine, a cudaError_t value, or a negative argument error).

    Opening needs no GPU (the CUDA runtime is linked in statically and loads the driver lazily).
    """

    def __init__(self, compiled: CompiledLibrary, what: str, prefix: str, signatures: dict[str, Signature]) -> None:
        self.compiled = compiled
        self.name = compiled.name
        self.what = what
        self.prefix = prefix
        try:
            self.handle = ctypes.CDLL(str(compiled.path))
        except OSError as exc:
            raise CudaBuildError(f"cannot load {what} from {compiled.path}: {exc}") from exc
        self.functions: dict[str, Any] = {}
        for name, (restype, argtypes) in {**signatures, "error_string": (ctypes.c_char_p, (ctypes.c_int,))}.items():
            try:
                function = getattr(self.handle, prefix + name)
            except AttributeError as exc:
                raise CudaBuildError(f"{compiled.path} ({what}) exports no {prefix + name}") from exc
            function.restype, function.argtypes = restype, list(argtypes)
            self.functions[name] = function

    def constant(self, name: str) -> int:
        """The exported ``const int64_t <prefix><name>``."""
        try:
            return int(ctypes.c_int64.in_dll(self.handle, self.prefix + name).value)
        except ValueError as exc:
            raise CudaBuildError(f"{self.compiled.path} ({self.what}) exports no constant {self.prefix + name}") from exc

    def mismatched(self, expected: dict[str, int]) -> list[str]:
        """The names of ``expected`` whose exported constant differs."""
        return [name for name, value in expected.items() if self.constant(name) != value]

    def error_message(self, code: int) -> str:
        return (self.functions["error_string"](code) or b"unknown error").decode(errors="replace")

    def call(self, name: str, *args: Any) -> None:
        """Calls ``<prefix><name>``; a nonzero return raises RuntimeError with its message."""
        code = self.functions[name](*args)
        if code != 0:
            raise RuntimeError(f"{self.what}: {self.prefix + name} failed: {self.error_message(code)} (code {code})")


def load_library(
    stem: str, what: str, folder: Path, sources: tuple[str, ...], headers: tuple[str, ...], prefix: str,
    signatures: dict[str, Signature], arch: str | None = None, verbose: bool | None = None,
) -> CudaLibrary:  # fmt: skip
    """Builds (or finds in the cache) and opens the library for this machine's GPU.

    ``arch`` defaults to the current device's (``arch_for_capability``). Raises CudaBuildError
    when there is no CUDA GPU, no nvcc, or the build or the load fails; see ``compile_library``.
    """
    import torch

    if not torch.cuda.is_available():
        raise CudaBuildError(
            f"{what} needs a CUDA GPU, but torch.cuda.is_available() is False "
            f"(torch {torch.__version__}, CUDA build {torch.version.cuda})"
        )
    if arch is None:
        arch = arch_for_capability(*torch.cuda.get_device_capability())
    compiled = compile_library(stem, what, folder, sources, headers, arch, verbose=verbose)
    return CudaLibrary(compiled, what, prefix, signatures)


_LOADED: dict[str, CudaLibrary] = {}


def load_checked_library(
    stem: str, what: str, folder: Path, sources: tuple[str, ...], headers: tuple[str, ...], prefix: str,
    signatures: dict[str, Signature], expected: dict[str, int], disagree: str, verbose: bool | None = None,
) -> CudaLibrary:  # fmt: skip
    """``load_library`` once per process and stem, then the library's exported constants compared
    with ``expected`` (what its Python side assumes); a mismatch raises CudaBuildError
    ``"<disagree> on [names]"``."""
    if stem not in _LOADED:
        library = load_library(stem, what, folder, sources, headers, prefix, signatures, verbose=verbose)
        mismatched = library.mismatched(expected)
        if mismatched:
            raise CudaBuildError(f"{disagree} on {mismatched}")
        _LOADED[stem] = library
    return _LOADED[stem]
