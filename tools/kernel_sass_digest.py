#!/usr/bin/env python
"""Print a digest of the sm_90 machine code (SASS) of the triton solution's GPU kernels.

    python tools/kernel_sass_digest.py

Needs no GPU: the Triton sparse-attention kernels of their default plans are compiled ahead of
time with Triton's bundled ptxas, the CUDA top-k and the CUDA attention kernel with
``nvcc -arch=sm_90a -cubin``, and each cubin is
disassembled with ``cuobjdump -sass``. Only instruction lines are hashed (line tables and source
positions are left out), so two source revisions that print the same digests compile to the same
kernels, and a measurement of one holds for the other. benchmarks/README.md uses it that way.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
SOLUTION = ROOT / "solutions" / "triton"
INSTRUCTION = re.compile(r"\s+/\*[0-9a-f]{4}\*/")


def sass_digest(cuobjdump: str, cubin: bytes) -> tuple[int, str]:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        sass = subprocess.run([cuobjdump, "-sass", f.name], capture_output=True, text=True, check=True).stdout
    lines = [line for line in sass.splitlines() if INSTRUCTION.match(line)]
    return len(lines), hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16]


def main() -> int:
    os.environ.pop("TRITON_INTERPRET", None)
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    sys.path.insert(0, str(ROOT / "tests" / "solutions"))
    import sparse_attention_sm90_check as check

    bundled = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    cuobjdump = str(bundled) if bundled.exists() else shutil.which("cuobjdump")
    if cuobjdump is None:
        print("kernel_sass_digest: no cuobjdump (Triton's NVIDIA backend or the CUDA toolkit)", file=sys.stderr)
        return 2
    sa = check._import_solution_module()
    for plan in check.default_plans(sa):
        partial = "*bf16" if plan.partial_dtype == torch.bfloat16 else "*fp32"
        for label, fn, constexprs in check._kernels_of(sa, plan):
            signature = check._signature(fn, constexprs, partial)
            compiled = triton.compile(
                ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=check._aligned(fn, signature)),
                target=GPUTarget("cuda", 90, 32),
                options={"num_warps": plan.num_warps, "num_stages": plan.num_stages},
            )
            count, digest = sass_digest(cuobjdump, compiled.asm["cubin"])
            print(f"attention {label:10s} S={plan.splits:<3d} BN={plan.block_n:<4d} {partial[1:]:5s} {count:5d} instructions  {digest}")
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        print("top-k: no nvcc on PATH, skipped (and the CUDA attention)")
        return 0
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
