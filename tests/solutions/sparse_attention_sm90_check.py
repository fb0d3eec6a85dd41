"""Compile the sparse-attention kernels for sm_90 (H100/H200) on a machine without a GPU.

    python tests/solutions/sparse_attention_sm90_check.py            # the default GPU plans
    python tests/solutions/sparse_attention_sm90_check.py --all      # plus the tuning variants

Triton compiles ahead of time for a named target with the ptxas it ships, so a CPU machine can
catch what the interpreter never sees: a plan that fails to compile, spills registers to local
memory, or needs more shared memory than an sm_90 block may have. Prints one line per kernel
(registers per thread, stack bytes, shared memory, MMA flavour).

Must run without TRITON_INTERPRET (under it ``@triton.jit`` builds interpreter functions).
Exit status: 0 all fine; 1 a kernel spills or exceeds shared memory; 2 a kernel failed to
compile; 77 the toolchain is unavailable here (no NVIDIA backend or cuobjdump).
"""

from __future__ import annotations

import importlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import traceback
import types
from pathlib import Path

EXIT_OK, EXIT_RESOURCES, EXIT_COMPILE, EXIT_UNAVAILABLE = 0, 1, 2, 77
TRITON_SOLUTION = Path(__file__).resolve().parents[2] / "solutions" / "triton"
SM90_MAX_SHARED_PER_BLOCK = 227 * 1024
SM90_SMS = 132

_POINTERS = {
    "q_nope_ptr": "*bf16", "q_pe_ptr": "*bf16", "ckv_ptr": "*bf16", "kpe_ptr": "*bf16", "idx_ptr": "*i32",
    "out_ptr": "*bf16", "lse_ptr": "*fp32", "part_ml_ptr": "*fp32", "sync_ptr": "*i32",
}


def _signature(fn, constexprs: dict, partial_dtype: str) -> dict:
    """Triton signature from the kernel's own parameter names: pointers by name, strides i32."""
    sig = {}
    for name in fn.arg_names:
        if name in constexprs:
            sig[name] = "constexpr"
        elif name == "part_acc_ptr":
            sig[name] = partial_dtype
        elif name in _POINTERS:
            sig[name] = _POINTERS[name]
        elif name == "qk_scale_log2":
            sig[name] = "fp32"
        elif name.startswith("stride_"):
            sig[name] = "i32"
        else:
            raise KeyError(f"no signature rule for parameter {name!r} of {fn.__name__}")
    return sig


def _aligned(fn, signature: dict) -> dict:
    """What Triton's JIT specialises for the harness's contiguous tensors: every pointer and every
    stride is a multiple of 16 (16-byte aligned allocations; strides 16..32768 elements). Without
    these hints the compiler cannot prove the gathered rows contiguous and stops vectorising."""
    return {
        (i,): [["tt.divisibility", 16]]
        for i, name in enumerate(fn.arg_names)
        if signature[name].startswith("*") or name.startswith("stride_")
    }


def _kernels_of(sa, plan) -> list[tuple[str, object, dict]]:
    shape = {"H": sa.NUM_HEADS, "D_CKV": sa.D_CKV, "D_KPE": sa.D_KPE, "TOPK": sa.TOPK, "PAGE_SIZE": sa.PAGE_SIZE, "INTERPRETED": False}
    if plan.path == "dsplit":
        return [("dsplit", sa._dsplit_kernel, {**shape, "SLICE_D": sa.D_CKV // plan.splits, "BLOCK_N": plan.block_n})]
    split = {
        **shape, "NUM_SPLITS": plan.splits, "BLOCK_N": plan.block_n, "FUSED_COMBINE": plan.path == "fused",
        "SYNC_STRIDE": sa.SYNC_STRIDE, "SENSE_OFFSET": sa.SENSE_OFFSET,
    }
    kernels = [(plan.path, sa._split_kernel, split)]
    if plan.path == "two_launch":
        kernels.append(("combine", sa._combine_kernel, {"H": sa.NUM_HEADS, "D_CKV": sa.D_CKV, "NUM_SPLITS": plan.splits, "INTERPRETED": False}))
    return kernels


def check_plans(plans) -> int:
    os.environ.pop("TRITON_INTERPRET", None)
    try:
        import triton
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource
    except ImportError as exc:
        print(f"unavailable: {exc}")
        return EXIT_UNAVAILABLE
    bundled = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    cuobjdump = str(bundled) if bundled.exists() else shutil.which("cuobjdump")
    if cuobjdump is None or not (Path(triton.__file__).parent / "backends" / "nvidia").is_dir():
        print("unavailable: Triton's NVIDIA backend or cuobjdump is missing")
        return EXIT_UNAVAILABLE
    import torch

    sa = _import_solution_module()
    status = EXIT_OK
    seen = set()
    for plan in plans:
        plan.validate()
        partial = "*bf16" if plan.partial_dtype == torch.bfloat16 else "*fp32"
        for label, fn, constexprs in _kernels_of(sa, plan):
            key = (fn.__name__, tuple(sorted(constexprs.items())), plan.num_warps, plan.num_stages, partial)
            if key in seen:
                continue
            seen.add(key)
            what = f"{label:10s} S={plan.splits:<3d} BN={plan.block_n:<4d} warps={plan.num_warps} stages={plan.num_stages} {partial[1:]}"
            try:
                signature = _signature(fn, constexprs, partial)
                compiled = triton.compile(
                    ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=_aligned(fn, signature)),
                    target=GPUTarget("cuda", 90, 32),
                    options={"num_warps": plan.num_warps, "num_stages": plan.num_stages},
                )
            except Exception:  # noqa: BLE001 - any compiler failure is this kernel's verdict, reported in full
                print(f"{what}: COMPILE ERROR\n{traceback.format_exc()}")
                status = max(status, EXIT_COMPILE)
                continue
            with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
                cubin.write(compiled.asm["cubin"])
                cubin.flush()
                usage = subprocess.run([cuobjdump, "-res-usage", cubin.name], capture_output=True, text=True, check=False).stdout
            found = re.search(r"REG:(\d+) STACK:(\d+) SHARED:\d+ LOCAL:(\d+)", usage)
            if found is None:
                print(f"unavailable: cannot read cuobjdump's resource usage:\n{usage}")
                return EXIT_UNAVAILABLE
            regs, stack, local = (int(g) for g in found.groups())
            shared = int(compiled.metadata.shared)
            ptx = compiled.asm["ptx"]
            mma = "wgmma" if "wgmma" in ptx else "mma.sync" if "mma.sync" in ptx else "-"
            problems = []
            if stack or local:
                problems.append(f"spills ({stack} B stack, {local} B local)")
            if shared > SM90_MAX_SHARED_PER_BLOCK:
                problems.append(f"needs {shared} B shared > {SM90_MAX_SHARED_PER_BLOCK}")
            print(f"{what}: regs {regs:3d}  stack {stack:4d}  smem {shared:6d}  {mma:8s} {'; '.join(problems) or 'ok'}")
            if problems:
                status = max(status, EXIT_RESOURCES)
    return status


def _import_solution_module():
    """attention/entry.py as a module of a package rooted at the solution folder (the solution's
    files import each other relatively), under a name that cannot collide with the triton package."""
    name = "dsa_triton_solution_sm90_check"
    if name not in sys.modules:
        package = types.ModuleType(name)
        package.__path__ = [str(TRITON_SOLUTION)]
        sys.modules[name] = package
    return importlib.import_module(f"{name}.attention.entry")


def default_plans(sa) -> list:
    """The plans ``kernel`` picks on a 132-SM H200 for 1..40 tokens, plus the dsplit short path."""
    plans = {sa.triton_gpu_plan(t, SM90_SMS * sa.PROGRAMS_PER_SM_BOUND) for t in range(1, 41)}
    plans.add(sa.Plan("dsplit", splits=16, block_n=64, num_warps=8, num_stages=2))
    return sorted(plans, key=lambda p: (p.path, -p.splits))


def main(argv: list[str]) -> int:
    os.environ.pop("TRITON_INTERPRET", None)
    try:
        sa = _import_solution_module()
    except ImportError as exc:
        print(f"unavailable: {exc}")
        return EXIT_UNAVAILABLE
    plans = default_plans(sa)
    if "--all" in argv:
        import torch

        plans += [sa.Plan("fused", s, bn, w, st) for s, bn, w, st in ((16, 64, 8, 2), (16, 128, 8, 1), (32, 64, 4, 2), (16, 64, 8, 1))]
        plans += [sa.Plan("fused", 16, 128, 8, 2, partial_dtype=torch.bfloat16), sa.Plan("dsplit", 16, 128, 8, 2), sa.Plan("dsplit", 8, 64, 4, 2)]
    return check_plans(plans)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
