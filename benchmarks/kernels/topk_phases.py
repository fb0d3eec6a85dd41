#!/usr/bin/env python
"""Where a row's time goes inside the CUDA top-k: per-phase clock64 stamps, on a CUDA GPU.

    python benchmarks/kernels/topk_phases.py [--case indexer_127_b31_p91 ...] [--input-sets 1]

For each case of workloads/indexer_h64.yaml it writes the rows' scores (the definition's fp32
reference scores of the harness's own input sets, seeds as ``benchmarks/kernels/indexer.py``
draws them) to files, writes a copy of ``topk_filtered.cuh`` in which thread 0 of each block
stamps ``clock64()`` after each phase of the fast path (the stamps are inserted after fixed
anchor lines: the script fails if the kernel no longer has them), compiles ``topk_phases.cu``
against that copy with nvcc for sm_90a and runs it. Phases: the seq_len load, the row load with
pass 1 (key range), pass 2 (histogram), the threshold scan, pass 3 (per-thread counts and their
scan), pass 4 (emit and collect), level 2 (sub-binning; about 100 cycles when skipped), the rank
of the last bin and the coalesced copy-out. The stamps are the kernel's own clock (cycles at the
SM clock, 1980 MHz on the H200), not the harness's timer; each stamp costs thread 0 a store.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
CSRC = ROOT / "solutions" / "triton" / "indexer" / "csrc"
DRIVER = Path(__file__).resolve().with_name("topk_phases.cu")
DEFAULT_CASES = ["indexer_086_b31_p36", "indexer_108_b1_p82", "indexer_127_b31_p91"]

#: (mark, anchor): the stamp goes right after the anchor, a line of the kernel's source.
MARKS: list[tuple[int, str]] = [
    (0, "      len = row_len;"),
    (1, "if (row_len > args.max_len) __trap();"),
    (2, "    f.warp_hi[warp] = hi;\n  }\n  __syncthreads();"),
    (3, "    if (key != kNoKey) atomicAdd(&f.hist[(key - lo) >> shift], 1);\n  });\n  __syncthreads();"),
    (4, "fast_threshold<kThreads, kFastBins>(f, topk);"),
    (5, "const int exclusive = __shfl_sync(kFullMask, warp_base, kWarpSize - 1) + inclusive - packed;"),
    (6, "  if (tid == 0) f.emitted = above;  // level 2 hands out the slots after the keys above\n  __syncthreads();"),
    (7, "const int first_tie_slot = above + sub_above;"),
    (8, "    if (member && member_lane == 0 && rank < tie_need) f.selected[first_tie_slot + rank] = static_cast<int>(me.y);\n  }"),
    (9, "out_row[i] = src.id(f.selected[i]);"),
]
STAMPS = """
__device__ long long g_marks[4096 * 16];
__device__ int g_info[4096 * 4];
#define DSA_MARK(i) do { if (threadIdx.x == 0) g_marks[blockIdx.x * 16 + (i)] = clock64(); } while (0)
"""


def instrument(source: str) -> str:
    """The kernel source with the phase stamps (and the level-1 bin size recorded per row)."""
    for mark, anchor in MARKS:
        if anchor not in source:
            raise SystemExit(f"topk_phases: anchor of phase stamp {mark} not found in topk_filtered.cuh: {anchor!r}")
        at = source.index(anchor) + len(anchor)
        source = source[:at] + f" DSA_MARK({mark});" + source[at:]
    source = source.replace("namespace dsa_topk {", "namespace dsa_topk {" + STAMPS, 1)
    guard = "if (in_bin > max_candidates && !one_key_bin) return false;"
    if guard not in source:
        raise SystemExit(f"topk_phases: anchor {guard!r} not found in topk_filtered.cuh")
    return source.replace(guard, "if (tid == 0) g_info[blockIdx.x * 4] = in_bin;\n  " + guard, 1)


def write_rows(case_ids: list[str], input_sets: int, folder: Path) -> list[Path]:
    import torch

    from dsa_bench.definitions import indexer
    from dsa_bench.workloads import build_inputs, derive_seed, load_workload

    workload = load_workload(ROOT / "workloads" / "indexer_h64.yaml")
    by_id = {c.id: c for c in workload.cases}
    files = []
    for case_id in case_ids:
        if case_id not in by_id:
            raise SystemExit(f"topk_phases: no case {case_id!r} in workloads/indexer_h64.yaml")
        for s in range(input_sets):
            seed = derive_seed(workload.settings.seed, case_id, "bench", 0, s)
            x = build_inputs(workload.definition, by_id[case_id], seed, torch.device("cpu"))
            scores = indexer.scores(x["q_index_fp8"], x["k_index_cache_fp8"], x["weights"], x["seq_lens"], x["block_table"])
            path = folder / f"{case_id}_set{s}.bin"
            with path.open("wb") as f:
                f.write(np.array(scores.shape, dtype=np.int32).tobytes())
                f.write(x["seq_lens"].numpy().astype(np.int32).tobytes())
                f.write(scores.numpy().astype(np.float32).tobytes())
            files.append(path)
    return files


def build(nvcc: str, folder: Path) -> Path:
    """Compiles the driver against the instrumented kernel in ``folder``; returns the executable."""
    shutil.copy(CSRC / "topk_filtered.h", folder)
    (folder / "topk_filtered_marked.cuh").write_text(instrument((CSRC / "topk_filtered.cuh").read_text()))
    launcher = (CSRC / "topk_filtered.cu").read_text().replace('#include "topk_filtered.cuh"', '#include "topk_filtered_marked.cuh"')
    (folder / "topk_filtered.cu").write_text(launcher)
    shutil.copy(DRIVER, folder)
    exe = folder / "topk_phases"
    subprocess.run([nvcc, "-O3", "-std=c++17", "-arch=sm_90a", "-o", str(exe), str(folder / DRIVER.name)], check=True)
    return exe


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--case", action="append", help=f"repeatable; default: {' '.join(DEFAULT_CASES)}")
    p.add_argument("--input-sets", type=int, default=1, help="input sets per case (the benchmark's seeds)")
    p.add_argument("--synthetic", action="store_true", help="synthetic rows instead of the workload's")
    args = p.parse_args()
    import torch

    nvcc = shutil.which("nvcc")
    if nvcc is None or not torch.cuda.is_available():
        print("topk_phases: needs nvcc and a CUDA GPU", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="topk_phases_") as tmp:
        exe = build(nvcc, Path(tmp))
        files = [] if args.synthetic else write_rows(args.case or DEFAULT_CASES, args.input_sets, Path(tmp))
        return subprocess.run([str(exe), *map(str, files)], check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
