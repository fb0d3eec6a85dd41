#!/usr/bin/env python
"""Print a digest of the sm_90 machine code (SASS) of the triton solution's CUDA kernels.

    python benchmarks/kernels/sass_digest.py

Needs no GPU: the CUDA top-k and the CUDA attention kernel are compiled with
``nvcc -arch=sm_90a -cubin``, and each cubin is disassembled with ``cuobjdump -sass``. Only
instruction lines are hashed (line tables and source positions are left out), so two source
revisions that print the same digests compile to the same kernels, and a measurement of one
holds for the other.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOLUTION = ROOT / "solutions" / "triton"
INSTRUCTION = re.compile(r"\s+/\*[0-9a-f]{4}\*/")


def sass_digest(cuobjdump: str, cubin: bytes) -> tuple[int, str]:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        sass = subprocess.run([cuobjdump, "-sass", f.name], capture_output=True, text=True, check=True).stdout
    lines = [line for line in sass.splitlines() if INSTRUCTION.match(line)]
    return len(lines), hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16]


def _cuobjdump() -> str | None:
    """The cuobjdump Triton's NVIDIA backend bundles, else the CUDA toolkit's."""
    try:
        import triton
    except ImportError:
        return shutil.which("cuobjdump")
    bundled = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    return str(bundled) if bundled.exists() else shutil.which("cuobjdump")


def main() -> int:
    cuobjdump = _cuobjdump()
    if cuobjdump is None:
        print("sass_digest: no cuobjdump (Triton's NVIDIA backend or the CUDA toolkit)", file=sys.stderr)
        return 2
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        print("sass_digest: no nvcc on PATH", file=sys.stderr)
        return 2
    cuda_sources = (
        ("top-k      filtered_topk_kernel<512, 1024>         ", "indexer/csrc/topk_filtered.cu"),
        ("attention  CUDA split, combine and cluster kernels ", "attention/csrc/attention_sm90.cu"),
    )
    for label, source in cuda_sources:
        with tempfile.TemporaryDirectory() as tmp:
            cubin = Path(tmp) / "kernel.cubin"
            subprocess.run([nvcc, "-arch=sm_90a", "-std=c++17", "-O3", "-cubin", "-o", str(cubin), str(SOLUTION / source)], check=True)
            count, digest = sass_digest(cuobjdump, cubin.read_bytes())
        print(f"{label}   {count:5d} instructions  {digest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
