"""The CUDA filtered top-k (``csrc/topk_filtered.cuh``): its just-in-time build and a checked Python entry.

The kernel, its launcher and a small C ABI (``csrc/topk_capi.cpp``: device pointers, strides,
the stream and the device) are one shared library, built by ``common/cuda_build.py`` and called
through ctypes on torch's current stream of the moment (so a capturing stream captures it).
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from ..common.cuda_build import CudaLibrary, load_checked_library
from .shapes import PAGE_SIZE, TOPK

HERE = Path(__file__).resolve().parent
#: compiled sources (relative to this folder): the C ABI and the launcher with its kernel
SOURCES = ("csrc/topk_capi.cpp", "csrc/topk_filtered.cu")
#: headers they include (part of the build's digest)
HEADERS = ("csrc/topk_filtered.h", "csrc/topk_filtered.cuh", "../common/csrc/capi.h")
#: the C ABI's exports are named dsa_topk_<name>
PREFIX = "dsa_topk_"
_P, _I64 = ctypes.c_void_p, ctypes.c_int64
#: the C ABI's functions (restype, argtypes); see csrc/topk_capi.cpp
SIGNATURES = {
    "filtered": (ctypes.c_int, (
        ctypes.c_int, _P,  # device, stream
        _P, _I64, _P, _P, _I64, _P, _I64,  # scores, its row stride, seq_lens, block_table, its row stride, topk_indices, its row stride
        _I64, _I64, _I64, _I64,  # batch, max_len, candidate_capacity, fast_candidates
        ctypes.c_int,  # dependent_launch
        _I64,  # topk: tokens kept per row (the definition's k)
    )),
    "split": (ctypes.c_int, (
        ctypes.c_int, _P, _P, _I64, _P, _P, _I64, _P, _I64, _I64, _I64, _I64, _I64, ctypes.c_int, _I64,  # as "filtered"
        _I64, _I64, _P,  # split_len, split_chunks, partial [batch * split_chunks, topk]
    )),
}  # fmt: skip
#: constants of csrc/topk_filtered.h (checked against the built library in load_topk_extension, as are
#: its TOPK and PAGE_SIZE against shapes.py)
MAX_CANDIDATES = 8192  # the radix select's largest shared candidate buffer (entries)
FAST_CANDIDATES = 1024  # the fast path's largest threshold bin
SPLIT_MAX_CHUNK_LEN = 32768  # the split top-k's longest chunk (its stage-1 blocks hold one)
SPLIT_MAX_CANDIDATES = 32768  # its most candidates per row (split_chunks * topk; a stage-2 block holds them)

#: what the built library's exported constants must be
EXPECTED_CONSTANTS = {
    "TOPK": TOPK, "PAGE_SIZE": PAGE_SIZE, "MAX_CANDIDATES": MAX_CANDIDATES, "FAST_CANDIDATES": FAST_CANDIDATES,
    "SPLIT_MAX_CHUNK_LEN": SPLIT_MAX_CHUNK_LEN, "SPLIT_MAX_CANDIDATES": SPLIT_MAX_CANDIDATES,
}  # fmt: skip
#: the library's stem (its cache folder is <stem>_<digest>) and its name in errors
STEM, WHAT = "dsa_topk_filtered", "the CUDA filtered top-k"


def load_topk_extension(verbose: bool | None = None) -> CudaLibrary:
    """The compiled library (built on first use); raises cuda_build.CudaBuildError with the reason."""
    return load_checked_library(STEM, WHAT, HERE, SOURCES, HEADERS, PREFIX, SIGNATURES, EXPECTED_CONSTANTS,
                                "indexer/cuda_topk.py and shapes.py disagree with csrc/topk_filtered.h", verbose)  # fmt: skip


_TENSOR_ARGS = (
    ("scores", torch.float32, 2),
    ("seq_lens", torch.int32, 1),
    ("block_table", torch.int32, 2),
    ("topk_indices", torch.int32, 2),
)


def check_topk_tensors(
    scores: torch.Tensor, seq_lens: torch.Tensor, block_table: torch.Tensor, topk_indices: torch.Tensor
) -> tuple[int, int]:
    """Checks what every CUDA top-k's C call needs of its tensors (raises ValueError naming the
    argument); returns (batch, max_len = max_num_pages * 64). The caller checks topk_indices' width."""
    tensors = (scores, seq_lens, block_table, topk_indices)
    for (name, dtype, dims), tensor in zip(_TENSOR_ARGS, tensors, strict=True):
        if not isinstance(tensor, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
        if not tensor.is_cuda:
            raise ValueError(f"{name} must be a CUDA tensor, got one on {tensor.device}")
        if tensor.device != scores.device:
            raise ValueError(f"{name} is on {tensor.device} but scores are on {scores.device}")
        if tensor.dtype != dtype or tensor.dim() != dims:
            raise ValueError(f"{name} must be a {dims}-d {dtype} tensor, got a {tensor.dim()}-d {tensor.dtype} one")
        if tensor.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous in its last dimension")
    batch, max_len = scores.shape[0], block_table.shape[1] * PAGE_SIZE
    if seq_lens.shape[0] != batch or block_table.shape[0] != batch or topk_indices.shape[0] != batch:
        raise ValueError("scores, seq_lens, block_table and topk_indices must agree on the batch size")
    if scores.shape[1] < max_len:
        raise ValueError(f"scores must have max_num_pages * {PAGE_SIZE} = {max_len} columns, got {scores.shape[1]}")
    if scores.stride(0) % 4 or scores.data_ptr() % 16:
        raise ValueError("score rows must be 16-byte aligned (the kernel reads them as float4)")
    if max(batch, max_len, block_table.stride(0), topk_indices.stride(0), scores.stride(0)) > 2**31 - 1:
        raise ValueError("problem too large for 32-bit indexing")
    return batch, max_len


def _checked_topk(topk_indices: torch.Tensor, topk: int | None, candidate_capacity: int, fast_candidates: int) -> int:
    """The call's k (default: ``topk_indices``' width), after checking it and the test hooks."""
    if topk is None:
        topk = topk_indices.shape[1]
    if not 1 <= topk <= TOPK:
        raise ValueError(f"topk must be in 1..{TOPK}, got {topk}")
    if topk_indices.shape[1] != topk:
        raise ValueError(f"topk_indices must have topk = {topk} columns, got {topk_indices.shape[1]}")
    if not -1 <= candidate_capacity <= 2**31 - 1:
        raise ValueError(f"candidate_capacity must be -1 or non-negative, got {candidate_capacity}")
    if not -1 <= fast_candidates <= FAST_CANDIDATES:
        raise ValueError(f"fast_candidates must be -1 or 0..{FAST_CANDIDATES}, got {fast_candidates}")
    return topk


def filtered_topk(
    scores: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    topk_indices: torch.Tensor,
    candidate_capacity: int = -1,
    fast_candidates: int = -1,
    dependent_launch: bool = False,
    topk: int | None = None,
) -> None:
    """Write the top-``topk`` physical ids (default: ``topk_indices``' width) of every row of ``scores`` into ``topk_indices``.

    ``scores [B, W]`` fp32 (W >= max_num_pages * 64, rows 16-byte aligned), ``seq_lens [B]`` and
    ``block_table [B, max_num_pages]`` int32, ``topk_indices [B, topk]`` int32, all on one CUDA
    device. Every argument is checked here, before the C call: the C side repeats only the
    checks that guard what it hands on (a nonzero return raises RuntimeError with its message),
    and a raw pointer cannot be checked for shape or device at all. ``candidate_capacity`` and
    ``fast_candidates`` are test hooks (-1: defaults; see csrc/topk_capi.cpp).
    ``dependent_launch``: launch as a programmatic dependent of the stream's previous kernel, which
    must be the one that writes ``scores`` (the score kernel): the top-k's blocks may start
    before it ends and wait for its completion before they read a score.
    """
    batch, max_len = check_topk_tensors(scores, seq_lens, block_table, topk_indices)
    topk = _checked_topk(topk_indices, topk, candidate_capacity, fast_candidates)
    device = scores.device
    load_topk_extension().call(
        "filtered", device.index, torch.cuda.current_stream(device).cuda_stream,  # the stream now: captured when capturing
        scores.data_ptr(), scores.stride(0), seq_lens.data_ptr(), block_table.data_ptr(), block_table.stride(0),
        topk_indices.data_ptr(), topk_indices.stride(0), batch, max_len, candidate_capacity, fast_candidates,
        int(dependent_launch), topk,
    )  # fmt: skip


def split_chunks(max_len: int, split_len: int) -> int:
    """Chunks per row of the split top-k for block tables of ``max_len`` tokens."""
    return -(-max_len // split_len)


def split_topk(
    scores: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    topk_indices: torch.Tensor,
    split_len: int,
    candidate_capacity: int = -1,
    fast_candidates: int = -1,
    dependent_launch: bool = False,
    topk: int | None = None,
) -> None:
    """``filtered_topk``'s result by the split top-k (csrc/topk_filtered.h): each row cut into chunks
    of ``split_len`` tokens (a multiple of 64 above ``topk``, at most SPLIT_MAX_CHUNK_LEN), one block
    selecting each chunk's top-k, then one block per row selecting among its chunks' selections
    (at most SPLIT_MAX_CANDIDATES). Two launches, the second the first's programmatic dependent;
    the chunks' selections go to a scratch tensor of ``B * chunks * topk`` int32 allocated here
    (from the capture's pool when a graph is being captured). Arguments as ``filtered_topk``'s.
    """
    batch, max_len = check_topk_tensors(scores, seq_lens, block_table, topk_indices)
    topk = _checked_topk(topk_indices, topk, candidate_capacity, fast_candidates)
    chunks = split_chunks(max_len, split_len)
    fits = chunks * topk <= SPLIT_MAX_CANDIDATES
    if not (topk < split_len <= SPLIT_MAX_CHUNK_LEN and split_len % PAGE_SIZE == 0 and topk % 4 == 0 and fits):
        raise ValueError(
            f"split_len {split_len} with topk {topk} and {max_len}-token block tables: split_len must be a multiple of {PAGE_SIZE} "
            f"in ({topk}, {SPLIT_MAX_CHUNK_LEN}], topk a multiple of 4, and ceil(max_len / split_len) * topk <= {SPLIT_MAX_CANDIDATES}"
        )
    device = scores.device
    partial = torch.empty((batch * chunks, topk), dtype=torch.int32, device=device)
    load_topk_extension().call(
        "split", device.index, torch.cuda.current_stream(device).cuda_stream,
        scores.data_ptr(), scores.stride(0), seq_lens.data_ptr(), block_table.data_ptr(), block_table.stride(0),
        topk_indices.data_ptr(), topk_indices.stride(0), batch, max_len, candidate_capacity, fast_candidates,
        int(dependent_launch), topk, split_len, chunks, partial.data_ptr(),
    )  # fmt: skip
