"""The long-row CUDA top-k kernels: their build, the multi-pass kernel's scratch, checked Python entries.

Rows of up to 8192 tokens are the filtered top-k's (``cuda_topk.py``: one block per row, the row
cached in registers). Past that, that block falls to a radix select that re-reads the row from
global memory digit by digit; the kernels here split each row over many blocks:

- ``long_topk`` (``csrc/topk_long.cuh``): a histogram pass, then up to three level passes, each
  over fewer candidates, meeting through global memory; any row length.
- ``cluster_topk`` (``csrc/topk_cluster.cuh``): one launch, one thread-block cluster of 2..16
  blocks per row holding the row in registers, the blocks meeting through each other's shared
  memory; rows of up to ``CLUSTER_MAX_LEN`` tokens.

docs/kernels/indexer.md, "Long rows". The entry picks one by shape (``policy.long_topk_kind``).
"""

from __future__ import annotations

import ctypes
import functools

import torch

from ..common.cuda_build import CudaLibrary, load_checked_library
from .cuda_topk import HERE, check_topk_tensors
from .policy import CLUSTER_PATH_MAX_TOKENS
from .shapes import PAGE_SIZE, TOPK

#: compiled sources (relative to this folder): the C ABI and the launcher with its kernels
SOURCES = ("csrc/topk_long_capi.cpp", "csrc/topk_long.cu")
#: headers they include (part of the build's digest)
HEADERS = (
    "csrc/topk_long.h", "csrc/topk_long.cuh", "csrc/topk_cluster.cuh", "csrc/topk_filtered.h", "csrc/topk_filtered.cuh",
    "../common/csrc/capi.h",
)  # fmt: skip
PREFIX = "dsa_topk_long_"
_P, _I64 = ctypes.c_void_p, ctypes.c_int64
SIGNATURES = {
    "select": (ctypes.c_int, (
        ctypes.c_int, _P,  # device, stream
        _P, _I64, _P, _P, _I64, _P, _I64,  # scores, its row stride, seq_lens, block_table, its row stride, topk_indices, its row stride
        _P, _P,  # scratch, candidates (the multi-pass kernel's; null for the cluster kernel)
        _I64, _I64, _I64,  # batch, max_len, topk
        ctypes.c_int, ctypes.c_int,  # dependent_launch, cluster (1: the cluster kernel)
    )),
    "cluster_capacity": (ctypes.c_int, (ctypes.c_int, _I64, ctypes.POINTER(ctypes.c_int32))),  # device, max_len -> clusters
}  # fmt: skip
#: constants of csrc/topk_long.h
SCRATCH_INTS = 2 * 4096 + 256 + 20  # per row: the three levels' histograms, then the row's counters and thresholds
#: the cluster top-k's longest row: 16 blocks x 1024 threads x 8 scores in registers
CLUSTER_MAX_LEN = CLUSTER_PATH_MAX_TOKENS
EXPECTED_CONSTANTS = {"TOPK": TOPK, "PAGE_SIZE": PAGE_SIZE, "SCRATCH_INTS": SCRATCH_INTS, "CLUSTER_MAX_LEN": CLUSTER_MAX_LEN}
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
    cluster: bool = False,
) -> None:
    """Write the top-k physical ids (k = ``topk_indices.shape[1]``, at most 2048) of every row.

    Tensors as for ``cuda_topk.filtered_topk``; every argument is checked here (ValueError naming
    what is wrong). ``dependent_launch``: the first kernel is a programmatic dependent of the
    stream's previous kernel, which must be the one that writes ``scores``. ``cluster``: the cluster
    kernel (``cluster_topk``), for block tables of at most ``CLUSTER_MAX_LEN`` tokens.
    """
    batch, max_len = check_topk_tensors(scores, seq_lens, block_table, topk_indices)
    k = topk_indices.shape[1]
    if not 1 <= k <= TOPK:
        raise ValueError(f"topk_indices must have 1..{TOPK} columns, got {k}")
    longest = CLUSTER_MAX_LEN if cluster else (2**31 - 1) // 4
    if batch > 65535 or max_len > longest:
        what = f"the cluster top-k's {CLUSTER_MAX_LEN} tokens" if cluster else "32-bit buffer indexing"
        raise ValueError(f"batch {batch} x max_len {max_len} exceeds the launch grid (65535 rows) or {what}")
    if batch == 0:
        return
    device = scores.device
    scratch, candidates = (None, None) if cluster else scratch_for(device, batch, max_len)
    load_long_topk_extension().call(
        "select", device.index, torch.cuda.current_stream(device).cuda_stream,
        scores.data_ptr(), scores.stride(0), seq_lens.data_ptr(), block_table.data_ptr(), block_table.stride(0),
        topk_indices.data_ptr(), topk_indices.stride(0), scratch.data_ptr() if scratch is not None else None,
        candidates.data_ptr() if candidates is not None else None, batch, max_len, k, int(dependent_launch), int(cluster),
    )  # fmt: skip


#: ``long_topk``'s contract in one launch of one thread-block cluster per row (block tables of at most
#: ``CLUSTER_MAX_LEN`` tokens)
cluster_topk = functools.partial(long_topk, cluster=True)


_CLUSTER_CAPACITY: dict[tuple[int, int], int] = {}


def cluster_capacity(device: torch.device, max_len: int) -> int:
    """Clusters of the cluster top-k for rows of up to ``max_len`` tokens that ``device`` runs at
    once (0: it cannot run them, e.g. too few free SMs in a GPC for a 16-block cluster, or
    ``max_len > CLUSTER_MAX_LEN``). Cached per device and cluster size."""
    key = (device.index if device.index is not None else torch.cuda.current_device(), max_len)
    if key not in _CLUSTER_CAPACITY:
        clusters = ctypes.c_int32(0)
        load_long_topk_extension().call("cluster_capacity", key[0], max_len, ctypes.byref(clusters))
        _CLUSTER_CAPACITY[key] = clusters.value
    return _CLUSTER_CAPACITY[key]
