"""Download the indexer peers' wheels and prune them to fit a 64 MiB carry to a machine without network.

The peers (solutions/deepgemm_sglang, solutions/deepgemm_flashinfer) need five distributions.
On a machine with network, ``pip install -e '.[peers]'`` installs them with their dependencies.
The H200 machine has no network and takes at most 64 MiB of carried files, while two of the
wheels are far larger: this tool downloads them once (``pip download --no-deps
--only-binary=:all:`` for the device's Python and platform) and writes carry-ready wheels:

- ``sgl-deep-gemm``, ``apache-tvm-ffi``, ``nvidia-ml-py``: as downloaded.
- ``sglang-kernel`` (383 MB): its Python files plus ``sgl_kernel/sm90/common_ops.abi3.so`` (the
  Hopper build of its ops, the top-k among them) and the small ``spatial_ops.abi3.so``; the other
  extensions (FlashAttention, InfLLM, FlashMLA, the SM100 build) are left out.
- ``flashinfer-python`` (62 MB): what ``import flashinfer.topk`` and the JIT build of its top-k
  module read: the package's top-level modules, ``jit/``, ``trace/``, the headers under
  ``data/include``, ``data/spdlog``, the vendored CCCL and the four top-k sources. Its
  ``flashinfer/__init__.py`` and ``flashinfer/jit/__init__.py``, which import every kernel family
  (and need cutlass-dsl and more), are replaced by package markers, so only ``flashinfer.topk``
  works from this wheel. With ``--build-flashinfer-topk`` (needs nvcc >= 12.9 and ninja, no GPU)
  the top-k module is compiled here for sm_90a and put in the wheel as the prebuilt module
  FlashInfer loads before compiling (``flashinfer/data/aot/topk/topk.so``): the device then
  skips a build that took more than 8 minutes there. If the device cannot load it, FlashInfer
  falls back to its JIT build.

A pruned wheel keeps its name and dist-info (so the peers' version checks hold) with a new
RECORD and a ``DSA_BENCH_PRUNED`` file saying what was left out.

Usage:
    python tools/carry_peers.py [--out .whl/peers] [--downloads .whl/peers-download] [--build-flashinfer-topk]

Then carry ``--out`` (run's ``carry: [".whl/peers"]``) and on the device:
    python -m pip install --no-index --no-deps --target /tmp/peers .whl/peers/*.whl
    PYTHONPATH=/tmp/peers python -m dsa_bench run -w indexer_h64
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import typer

ROOT = Path(__file__).resolve().parents[1]
CARRY_LIMIT_BYTES = 64 * 2**20
PYTHON_VERSION = "3.12"  # the H200 machine's
PLATFORM = "manylinux2014_x86_64"


@dataclass(frozen=True)
class Peer:
    """One distribution the peers need: its pinned requirement and what of its wheel to keep."""

    requirement: str
    keep: Callable[[str], bool] | None = None  # None: the wheel as downloaded
    replace: tuple[tuple[str, str], ...] = ()  # (path in the wheel, new text)
    why: str = ""

    @property
    def project(self) -> str:
        return self.requirement.split("==")[0]


SGLANG_EXTENSIONS_KEPT = ("sgl_kernel/sm90/common_ops.abi3.so", "sgl_kernel/spatial_ops.abi3.so")


def keep_sglang(path: str) -> bool:
    return not path.endswith(".so") or path in SGLANG_EXTENSIONS_KEPT


#: folders of the flashinfer wheel kept whole, and single files kept (besides the top-level modules)
FLASHINFER_FOLDERS = (
    "flashinfer/jit/",
    "flashinfer/trace/",
    "flashinfer/data/include/",
    "flashinfer/data/spdlog/include/",
    "flashinfer/data/cccl/cub/",
    "flashinfer/data/cccl/libcudacxx/include/",
    "flashinfer/data/cccl/thrust/",
)
FLASHINFER_FILES = tuple(
    f"flashinfer/data/csrc/{name}"
    for name in ("topk.cu", "cub_topk.cu", "flashinfer_topk_binding.cu", "flashinfer_fast_topk_clusters_binding.cu",
                 "topk_transform_checks.h", "tvm_ffi_utils.h")
)  # fmt: skip


def keep_flashinfer(path: str) -> bool:
    top_level_module = path.startswith("flashinfer/") and path.count("/") == 1 and path.endswith(".py")
    return top_level_module or ".dist-info/" in path or path.startswith(FLASHINFER_FOLDERS) or path in FLASHINFER_FILES


PACKAGE_MARKER = '"""Package marker written by dsa-bench tools/carry_peers.py: this pruned wheel holds only {what}."""\n'

PEERS = (
    Peer("sgl-deep-gemm==0.1.4.post1"),
    Peer("apache-tvm-ffi==0.1.11"),
    Peer("nvidia-ml-py==13.615.71"),
    Peer("sglang-kernel==0.4.5", keep=keep_sglang, why="kept: Python files, sm90/common_ops.abi3.so, spatial_ops.abi3.so"),
    Peer(
        "flashinfer-python==0.7.2.post1",
        keep=keep_flashinfer,
        replace=(
            ("flashinfer/__init__.py", PACKAGE_MARKER.format(what="flashinfer.topk and what it imports")),
            ("flashinfer/jit/__init__.py", PACKAGE_MARKER.format(what="what flashinfer.topk's JIT build needs")),
        ),
        why="kept: flashinfer.topk, jit/, trace/ and what the top-k build includes; package __init__ files replaced by markers",
    ),
)


def download(requirements: list[str], folder: Path, platform: str = PLATFORM) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        "--python-version", PYTHON_VERSION, "--platform", platform, "-d", str(folder), *requirements,
    ]  # fmt: skip
    print("$ " + " ".join(command))
    subprocess.run(command, check=True)


def wheel_of(peer: Peer, folder: Path) -> Path:
    name, version = peer.project.replace("-", "_"), peer.requirement.split("==")[1]
    found = sorted(folder.glob(f"{name}-{version}-*.whl"))
    if not found:
        raise typer.BadParameter(f"no wheel of {peer.requirement} in {folder}")
    return found[0]


def _record_line(path: str, data: bytes) -> list[str]:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return [path, f"sha256={digest}", str(len(data))]


def prune_wheel(source: Path, target: Path, peer: Peer, extra: dict[str, bytes] | None = None) -> tuple[int, int]:
    """Write ``target``: ``source``'s files that ``peer.keep`` keeps, ``peer.replace``'s texts and
    ``extra`` files, a ``DSA_BENCH_PRUNED`` note and a new RECORD. Returns (files kept, left out)."""
    assert peer.keep is not None
    replaced = {path: text.encode() for path, text in peer.replace}
    extra = extra or {}
    with zipfile.ZipFile(source) as wheel:
        names = wheel.namelist()
        dist_info = next(n.split("/")[0] for n in names if n.split("/")[0].endswith(".dist-info"))
        record_path = f"{dist_info}/RECORD"
        kept = [n for n in names if not n.endswith("/") and n != record_path and peer.keep(n)]
        left_out = [n for n in names if not n.endswith("/") and n != record_path and not peer.keep(n)]
        records = []
        with zipfile.ZipFile(target, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=9) as out:
            for name in kept:
                data = replaced.get(name, wheel.read(name))
                out.writestr(name, data)
                records.append(_record_line(name, data))
            for name, data in extra.items():
                out.writestr(name, data)
                records.append(_record_line(name, data))
            note = f"Pruned by dsa-bench tools/carry_peers.py from {source.name}: {peer.why}.\nLeft out:\n" + "".join(
                f"{n}\n" for n in left_out
            )
            out.writestr(f"{dist_info}/DSA_BENCH_PRUNED", note)
            records.append(_record_line(f"{dist_info}/DSA_BENCH_PRUNED", note.encode()))
            text = io.StringIO()
            writer = csv.writer(text, lineterminator="\n")
            writer.writerows([*records, [record_path, "", ""]])
            out.writestr(record_path, text.getvalue())
    return len(kept), len(left_out)


TVM_FFI_STUB = '''"""Build-time stand-in for tvm_ffi (tools/carry_peers.py): FlashInfer's ninja file needs only its header paths."""
from . import libinfo


def load_module(path):
    raise RuntimeError("this tvm_ffi stand-in builds FlashInfer modules; it cannot load them")
'''

TVM_FFI_LIBINFO_STUB = '''def find_include_path():
    return {include!r}


def find_dlpack_include_path():
    return {dlpack!r}
'''

BUILD_SCRIPT = """
import shutil, sys
from flashinfer.jit import cpp_ext
from flashinfer.topk import gen_topk_module
spec = gen_topk_module()
spec.write_ninja()
cpp_ext.run_ninja(spec.build_dir, spec.ninja_path, True)
shutil.copyfile(spec.jit_library_path, sys.argv[1])
"""


#: cuRAND's headers for a CUDA 13 toolkit that lacks them (FlashInfer's top-k includes sampling.cuh, which includes curand.h)
CURAND_HEADERS = ("nvidia-curand>=10.4,<10.5", "manylinux_2_27_x86_64", "nvidia/cu13/include/")


def cuda_toolkit() -> tuple[Path, list[Path]]:
    """The CUDA toolkit nvcc belongs to and the folders it links from, as ``nvcc --dryrun`` says
    (``which nvcc`` may be a wrapper script outside the toolkit)."""
    nvcc = shutil.which("nvcc") or (os.environ.get("CUDA_HOME", "") + "/bin/nvcc")
    try:
        lines = subprocess.run([nvcc, "--dryrun", "-c", "probe.cu"], capture_output=True, text=True, check=False).stderr.splitlines()
    except OSError:
        raise typer.BadParameter("--build-flashinfer-topk needs nvcc (on PATH, or under CUDA_HOME)") from None
    here = next((line.split("=", 1)[1] for line in lines if line.startswith("#$ _HERE_=")), None)
    if here is None:
        raise typer.BadParameter(f"{nvcc} --dryrun did not say where its toolkit is")
    libraries = next((line.split("=", 1)[1] for line in lines if line.startswith("#$ LIBRARIES=")), "")
    return Path(here).parent.resolve(), [Path(flag.strip('"')[2:]).resolve() for flag in libraries.split() if flag.startswith('"-L')]


def link_stub(folder: Path) -> Path:
    """A ``libcuda.so`` stub (soname libcuda.so.1, no symbols) for a toolkit that ships none:
    FlashInfer links ``-lcuda``; the module then binds to the device's driver when loaded."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "stub.c").write_text("")
    subprocess.run(["cc", "-shared", "-Wl,-soname,libcuda.so.1", "-o", str(folder / "libcuda.so"), str(folder / "stub.c")], check=True)
    return folder


def build_flashinfer_topk(flashinfer_wheel: Path, tvm_ffi_wheel: Path, nvml_wheel: Path, work: Path, downloads: Path) -> Path:
    """Compile FlashInfer's top-k module for sm_90a from the pruned wheel (its Python code generates the
    ninja file; nvml is imported by it); the path of the built .so."""
    built = work / "topk.so"
    if built.is_file():
        print(f"prebuilt top-k module found: {built}")
        return built
    toolkit, library_dirs = cuda_toolkit()
    cuda_home = os.environ.get("CUDA_HOME") or str(toolkit)
    if not any((d / "libcuda.so").is_file() for d in library_dirs):
        library_dirs.append(link_stub(work / "link-stub"))
    site = work / "site"
    shutil.rmtree(site, ignore_errors=True)
    for pure_python in (flashinfer_wheel, nvml_wheel):
        with zipfile.ZipFile(pure_python) as wheel:
            wheel.extractall(site)
    tvm = work / "tvm_ffi_wheel"
    with zipfile.ZipFile(tvm_ffi_wheel) as wheel:
        wheel.extractall(tvm)
    stub = site / "tvm_ffi"
    stub.mkdir(exist_ok=True)
    (stub / "__init__.py").write_text(TVM_FFI_STUB)
    include, dlpack = tvm / "tvm_ffi" / "include", tvm / "tvm_ffi" / "3rdparty" / "dlpack" / "include"
    if not (dlpack / "dlpack" / "dlpack.h").is_file():
        dlpack = next(p.parent.parent for p in tvm.rglob("dlpack/dlpack.h"))
    (stub / "libinfo.py").write_text(TVM_FFI_LIBINFO_STUB.format(include=str(include), dlpack=str(dlpack)))
    extra_flags = []
    if not (toolkit / "include" / "curand.h").is_file():
        requirement, platform, prefix = CURAND_HEADERS
        download([requirement], downloads, platform)
        curand = work / "curand"
        with zipfile.ZipFile(sorted(downloads.glob("nvidia_curand-10.4.*.whl"))[-1]) as wheel:
            wheel.extractall(curand, [n for n in wheel.namelist() if n.startswith(prefix)])
        extra_flags.append(f"-I{curand / prefix}")
    env = {
        **os.environ,
        "FLASHINFER_EXTRA_CUDAFLAGS": " ".join(extra_flags),
        "FLASHINFER_EXTRA_LDFLAGS": " ".join(f"-L{d}" for d in library_dirs),
        "PYTHONPATH": str(site),
        "CUDA_HOME": cuda_home,
        "FLASHINFER_WORKSPACE_BASE": str(work / "workspace"),
        "FLASHINFER_CUDA_ARCH_LIST": "9.0a",
        "FLASHINFER_DISABLE_VERSION_CHECK": "1",
    }
    print(f"building FlashInfer's top-k module for sm_90a in {work} (this takes a while)")
    subprocess.run([sys.executable, "-c", BUILD_SCRIPT, str(built)], check=True, env=env)
    return built


def main(
    out: Path = typer.Option(ROOT / ".whl" / "peers", help="folder of the carry-ready wheels (carry it to the device)"),
    downloads: Path = typer.Option(ROOT / ".whl" / "peers-download", help="folder of the downloaded wheels (not carried)"),
    build_flashinfer_topk_module: bool = typer.Option(
        False, "--build-flashinfer-topk", help="compile FlashInfer's top-k module here for sm_90a and put it in the wheel"
    ),
) -> None:
    download([peer.requirement for peer in PEERS], downloads)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    for peer in PEERS:
        source = wheel_of(peer, downloads)
        target = out / source.name
        if peer.keep is None:
            shutil.copyfile(source, target)
            print(f"{source.name}: as downloaded, {target.stat().st_size / 2**20:.1f} MiB")
            continue
        kept, left = prune_wheel(source, target, peer)
        if peer.project == "flashinfer-python" and build_flashinfer_topk_module:
            tvm_ffi, nvml = (wheel_of(next(p for p in PEERS if p.project == n), downloads) for n in ("apache-tvm-ffi", "nvidia-ml-py"))
            with tempfile.TemporaryDirectory() as scratch:
                staged = Path(scratch) / target.name
                shutil.move(target, staged)
                module = build_flashinfer_topk(staged, tvm_ffi, nvml, downloads / "flashinfer-topk-build", downloads)
                prune_wheel(source, target, peer, extra={"flashinfer/data/aot/topk/topk.so": module.read_bytes()})
            print(f"  with the prebuilt top-k module ({module.stat().st_size / 2**20:.1f} MiB)")
        print(f"{source.name}: {source.stat().st_size / 2**20:.1f} MiB -> {target.stat().st_size / 2**20:.1f} MiB "
              f"({kept} files kept, {left} left out)")  # fmt: skip
    total = sum(p.stat().st_size for p in out.glob("*.whl"))
    fits = "fits" if total <= CARRY_LIMIT_BYTES else "does NOT fit"
    print(f"\n{out}: {total / 2**20:.1f} MiB in {len(list(out.glob('*.whl')))} wheels; {fits} the 64 MiB carry")
    relative = out.relative_to(ROOT) if out.is_relative_to(ROOT) else out
    print("On the device (carry the folder, e.g. carry: [\"" + str(relative) + "\"]):")
    print(f"  python -m pip install --no-index --no-deps --target /tmp/peers {relative}/*.whl")
    print("  PYTHONPATH=/tmp/peers python -m dsa_bench run -w indexer_h64")
    if total > CARRY_LIMIT_BYTES:
        raise typer.Exit(1)


if __name__ == "__main__":
    typer.run(main)
