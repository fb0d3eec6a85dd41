"""The CUDA filtered top-k (``csrc/topk_filtered.cuh``): its just-in-time build and a checked Python entry."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import torch

from ..common.cuda_build import CudaBuildError, build_extension
from .shapes import PAGE_SIZE, TOPK

HERE = Path(__file__).resolve().parent
#: compiled sources (relative to this folder): the torch binding (host compiler) and the pure-CUDA launcher (nvcc)
SOURCES = ("csrc/topk_binding.cpp", "csrc/topk_filtered.cu")
#: headers they include (part of the build's digest)
HEADERS = ("csrc/topk_filtered.h", "csrc/topk_filtered.cuh")
#: constants of csrc/topk_filtered.h (checked against the built module in load_topk_extension, as are
#: its TOPK and PAGE_SIZE against shapes.py)
MAX_CANDIDATES = 8192  # the radix select's largest shared candidate buffer (entries)
FAST_CANDIDATES = 1024  # the fast path's largest threshold bin

_module: ModuleType | None = None


def load_topk_extension(verbose: bool | None = None) -> ModuleType:
    """The compiled extension (built on first use); raises cuda_build.CudaBuildError with the reason."""
    global _module
    if _module is None:
        module = build_extension("dsa_topk_filtered", "the CUDA filtered top-k", HERE, SOURCES, HEADERS, verbose)
        expected = {"TOPK": TOPK, "PAGE_SIZE": PAGE_SIZE, "MAX_CANDIDATES": MAX_CANDIDATES, "FAST_CANDIDATES": FAST_CANDIDATES}
        mismatched = [name for name, value in expected.items() if getattr(module, name) != value]
        if mismatched:
            raise CudaBuildError(f"indexer/topk.py and shapes.py disagree with csrc/topk_filtered.h on {mismatched}")
        _module = module
    return _module


_TENSOR_ARGS = (
    ("scores", torch.float32, 2),
    ("seq_lens", torch.int32, 1),
    ("block_table", torch.int32, 2),
    ("topk_indices", torch.int32, 2),
)


def filtered_topk(
    scores: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    topk_indices: torch.Tensor,
    candidate_capacity: int = -1,
    fast_candidates: int = -1,
) -> None:
    """Write the top-2048 physical ids of every row of ``scores`` into ``topk_indices``.

    ``scores [B, W]`` fp32 (W >= max_num_pages * 64, rows 16-byte aligned), ``seq_lens [B]`` and
    ``block_table [B, max_num_pages]`` int32, ``topk_indices [B, 2048]`` int32, all on one CUDA
    device. Every argument is checked here, before it reaches the binding: the binding repeats
    the checks with TORCH_CHECK, but an exception thrown out of the extension has crashed the
    process on the H200 machine's toolchain (torch 2.11, nvcc 13.0; cause not established), so
    it must never be the place where bad input is caught. ``candidate_capacity`` and
    ``fast_candidates`` are test hooks (-1: defaults; see topk_binding.cpp).
    """
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
    if topk_indices.shape[1] != TOPK:
        raise ValueError(f"topk_indices must have {TOPK} columns, got {topk_indices.shape[1]}")
    if scores.shape[1] < max_len:
        raise ValueError(f"scores must have max_num_pages * {PAGE_SIZE} = {max_len} columns, got {scores.shape[1]}")
    if scores.stride(0) % 4 or scores.data_ptr() % 16:
        raise ValueError("score rows must be 16-byte aligned (the kernel reads them as float4)")
    if max(batch, max_len, block_table.stride(0), topk_indices.stride(0), scores.stride(0)) > 2**31 - 1:
        raise ValueError("problem too large for 32-bit indexing")
    if not -1 <= candidate_capacity <= 2**31 - 1:
        raise ValueError(f"candidate_capacity must be -1 or non-negative, got {candidate_capacity}")
    if not -1 <= fast_candidates <= FAST_CANDIDATES:
        raise ValueError(f"fast_candidates must be -1 or 0..{FAST_CANDIDATES}, got {fast_candidates}")
    load_topk_extension().filtered_topk(scores, seq_lens, block_table, topk_indices, candidate_capacity, fast_candidates)
