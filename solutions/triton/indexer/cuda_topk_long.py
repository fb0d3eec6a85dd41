"""The long-row CUDA top-k (``csrc/topk_long.cuh``): its build, its per-shape scratch, a checked Python entry.

Rows of up to 8192 tokens are the filtered top-k's (``cuda_topk.py``: one block per row, the row
cached in registers). Past that, that block falls to a radix select that re-reads the row from
global memory digit by digit; this one splits each row over many blocks (a histogram pass, then
up to three level passes, each over fewer candidates; docs/kernels/indexer.md, "Long rows").
The entry picks it by shape: ``policy.uses_long_path(batch, max_num_pages)``.
"""

from __future__ import annotations

import ctypes

import torch

from ..common.cuda_build import CudaLibrary, load_checked_library
from .cuda_topk import HERE, check_topk_tensors
from .shapes import PAGE_SIZE, TOPK

#: compiled sources (relative to this folder): the C ABI and the launcher with its kernels
SOURCES = ("csrc/topk_long_capi.cpp", "csrc/topk_long.cu")
#: headers they include (part of the build's digest)
HEADERS = ("csrc/topk_long.h", "csrc/topk_long.cuh", "csrc/topk_filtered.h", "csrc/topk_filtered.cuh", "../common/csrc/capi.h")
PREFIX = "dsa_topk_long_"
_P, _I64 = ctypes.c_void_p, ctypes.c_int64
SIGNATURES = {
    "select": (ctypes.c_int, (
        ctypes.c_int, _P,  # device, stream
        _P, _I64, _P, _P, _I64, _P, _I64,  # scores, its row stride, seq_lens, block_table, its row stride, topk_indices, its row stride
        _P, _P,  # scratch, candidates
        _I64, _I64, _I64,  # batch, max_len, topk
        ctypes.c_int,  # dependent_launch
    )),
}  # fmt: skip
#: constants of csrc/topk_long.h
SCRATCH_INTS = 2 * 4096 + 256 + 20  # per row: the three levels' histograms, then the row's counters and thresholds
EXPECTED_CONSTANTS = {"TOPK": TOPK, "PAGE_SIZE": PAGE_SIZE, "SCRATCH_INTS": SCRATCH_INTS}
STEM, WHAT = "dsa_topk_long", "the CUDA long-row top-k"

def load_long_topk_extension(verbose: bool | None = None) -> CudaLibrary:
    """The compiled library (built on first use); raises cuda_build.CudaBuildError with the reason."""
    return load_checked_library(STEM, WHAT, HERE, SOURCES, HEADERS, PREFIX, SIGNATURES, EXPECTED_CONSTANTS,
                                "indexer/cuda_topk_long.py and shapes.py disagree with csrc/topk_long.h", verbose)  # fmt: skip


#: Scratch per (device, batch, max_len): the histograms, counters and thresholds (zeroed once here;
#: every call leaves them zero again) and two candidate buffers of a whole row each, so that no
#: threshold bin is ever too large for them (B x max_len x 16 bytes: 128 MiB at 64 x 128K).
#: Allocated on a call's first, eager run (LaunchGraphs runs a new argument signature eagerly
#: before it captures), so captured graphs keep reusing the same memory. Shared by every call of
#: one shape on a device: two such calls must not run at once on different streams.
_SCRATCH: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}


def scratch_for(device: torch.device, batch: int, max_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    key = (device, batch, max_len)
    if key not in _SCRATCH:
        if torch.cuda.is_current_stream_capturing():
            raise RuntimeError("the long-row top-k's scratch must be allocated before a graph capture (call it eagerly once)")
        scratch = torch.zeros((batch, SCRATCH_INTS), dtype=torch.int32, device=device)
        candidates = torch.empty((batch, 4 * max_len), dtype=torch.int32, device=device)
        _SCRATCH[key] = (scratch, candidates)
    return _SCRATCH[key]


def long_topk(
    scores: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    topk_indices: torch.Tensor,
    dependent_launch: bool = False,
) -> None:
    """Write the top-k physical ids (k = ``topk_indices.shape[1]``, at most 2048) of every row.

    Tensors as for ``cuda_topk.filtered_topk``. ``dependent_launch``: the first kernel is a
    programmatic dependent of the stream's previous kernel, which must be the one that writes
    ``scores``.
    """
    batch, max_len = check_topk_tensors(scores, seq_lens, block_table, topk_indices)
    k = topk_indices.shape[1]
    if not 1 <= k <= TOPK:
        raise ValueError(f"topk_indices must have 1..{TOPK} columns, got {k}")
    if batch > 65535 or max_len > (2**31 - 1) // 4:
        raise ValueError(f"batch {batch} x max_len {max_len} exceeds the launch grid (65535 rows) or 32-bit buffer indexing")
    if batch == 0:
        return
    device = scores.device
    scratch, candidates = scratch_for(device, batch, max_len)
    load_long_topk_extension().call(
        "select", device.index, torch.cuda.current_stream(device).cuda_stream,
        scores.data_ptr(), scores.stride(0), seq_lens.data_ptr(), block_table.data_ptr(), block_table.stride(0),
        topk_indices.data_ptr(), topk_indices.stride(0), scratch.data_ptr(), candidates.data_ptr(),
        batch, max_len, k, int(dependent_launch),
    )  # fmt: skip
