"""Fast lightning indexer for ``dsa_topk_indexer_fp8_h64_d128_topk2048_ps64``.

Entry point (destination-passing style)::

    kernel(q_index_fp8, k_index_cache_fp8, weights, seq_lens, block_table, topk_indices)

    q_index_fp8        [B, 64, 128]             float8_e4m3fn
    k_index_cache_fp8  [num_pages, 64, 1, 132]  int8; per page (8448 B): 64 x 128 FP8 values
                                                 token-major, then 64 float32 scales
    weights            [B, 64]                  float32
    seq_lens           [B]                      int32, 0 <= L <= max_num_pages * 64
    block_table        [B, max_num_pages]       int32 page ids
    topk_indices       [B, 2048]                int32, written in full (the harness pre-fills
                                                 poison): the physical ids page * 64 + slot of
                                                 the min(2048, L) best tokens, then -1

Paths, picked from shapes only (no host-device synchronisation):

1. Passthrough: ``max_num_pages * 64 <= 2048`` means every row keeps all its tokens. One small
   Triton kernel expands the block table into physical ids with -1 padding; nothing is scored.
2. Scored, on a GPU: the fused Triton score kernel (``triton_kernels.py``) writes fp32 scores of
   the rows longer than 2048 into a ``[B, max_num_pages * 64]`` buffer, then the CUDA filtered
   radix top-k (``cuda_topk.py``, ``csrc/topk_filtered.cuh``) selects 2048 per row and writes physical ids straight
   from the block table; long block tables take the long-row top-k instead
   (``cuda_topk_long.py``, ``csrc/topk_long.cuh``: each row split over many blocks). Rows with
   L <= 2048 are passed through by the top-k kernel itself.
   The two launches are replayed as one CUDA graph per argument set (``LaunchGraphs``).
3. Scored, without CUDA (``TRITON_INTERPRET=1`` on CPU tensors): the same score kernel, then
   ``torch.topk`` and the Triton emit kernel. ``solution_notes()`` says which top-k is active.

DeepSeek-V4's selection sizes (``..._topk512_ps64``, ``..._topk1024_ps64``: ``topk_indices [B, k]``)
take ``other_topk_kernel``'s simpler path: every row scored (the score kernel's short-row skip is
for 2048), then the CUDA top-k of the call's shape (``select_topk_cuda``'s rule) with ``k``, launched
after it (torch.topk and a torch emit under the interpreter); a batch whose rows all fit in k
tokens is passed through by torch ops. Not tuned.

The contract's constants and the cache page layout are in ``shapes.py``.
"""

from __future__ import annotations

import functools

import torch

from ..common.interpreter import INTERPRETED, device_problem
from ..common.launch_graphs import LaunchGraphs
from . import cuda_topk, cuda_topk_long, policy, triton_kernels
from .shapes import HEAD_DIM, NUM_HEADS, PAGE_BYTES, PAGE_SIZE, TOPK

#: The CUDA top-k is used whenever Triton compiles for a GPU; it is built at import so that the
#: harness reports a missing nvcc or a build failure as this solution's compile error.
USE_CUDA_TOPK = not INTERPRETED and torch.cuda.is_available()
_cuda_topk = cuda_topk.load_topk_extension() if USE_CUDA_TOPK else None
_cuda_long_topk = cuda_topk_long.load_long_topk_extension() if USE_CUDA_TOPK else None


#: the split top-k of the policy's chunk length
_split_topk = functools.partial(cuda_topk.split_topk, split_len=policy.SPLIT_LEN)


def cuda_topk_for(batch: int, max_num_pages: int, device: torch.device):
    """The CUDA top-k for a call's shape: the one-block-per-row filtered top-k for rows it keeps in
    shared memory (``policy.uses_shared_rows``), else the split top-k for longer rows in large
    batches (``policy.uses_split_rows``), else the cluster top-k (``policy.uses_cluster_path``, where
    the device runs its cluster), else the multi-pass long-row top-k for long block tables
    (``policy.uses_long_path``), else the filtered top-k."""
    if policy.uses_shared_rows(batch, max_num_pages):
        return cuda_topk.filtered_topk
    if policy.uses_split_rows(batch, max_num_pages):
        return _split_topk
    if policy.uses_cluster_path(batch, max_num_pages) and cuda_topk_long.cluster_capacity(device, max_num_pages * PAGE_SIZE) > 0:
        return cuda_topk_long.cluster_topk
    if policy.uses_long_path(batch, max_num_pages):
        return cuda_topk_long.long_topk
    return cuda_topk.filtered_topk


def select_topk_cuda(scores, seq_lens, block_table, topk_indices, dependent_launch: bool = False) -> None:
    """The CUDA top-k for this call's shape (``cuda_topk_for``)."""
    select = cuda_topk_for(*block_table.shape, scores.device)
    select(scores, seq_lens, block_table, topk_indices, dependent_launch=dependent_launch)


def solution_notes() -> str:
    if _cuda_topk is not None:
        failed = getattr(_scored_graphs, "disabled_reason", None)
        graphs = (
            f"CUDA graph capture failed ({failed}), kernels launched eagerly"
            if failed
            else "the scored path is replayed as one CUDA graph per argument set"
        )
        return (
            "top-k: CUDA filtered select on 32-bit score keys (range-binned fast path, radix select fallback) with page-table emit "
            f"(library {_cuda_topk.name}), one block per row, the row's keys in registers up to {policy.LONG_ROW_REGISTER_TOKENS} "
            f"tokens and in shared memory up to {policy.SHARED_ROW_MAX_TOKENS} (policy.uses_shared_rows: batch >= "
            f"{policy.SHARED_ROW_MIN_BATCH}); longer ones up to {policy.SPLIT_MAX_TOKENS} tokens at batch >= "
            f"{policy.SPLIT_MIN_BATCH} split into chunks of {policy.SPLIT_LEN} (policy.uses_split_rows: a block per chunk, "
            "then a block per row over the chunks' selections); other long block tables (policy.uses_long_path: more than "
            f"{policy.LONG_PATH_MIN_TOKENS} tokens, batch <= {policy.LONG_PATH_MAX_BATCH}, or "
            f"{', '.join(f'<= {most} from {fewest}' for most, fewest in policy.LONG_PATH_WIDE)} tokens): rows split over many "
            f"blocks (a histogram pass and three level passes; library {_cuda_long_topk.name}), "
            f"or, for {policy.CLUSTER_PATH_MIN_TOKENS + 1}-{policy.CLUSTER_PATH_MAX_TOKENS} tokens when the clusters fit "
            f"{policy.CLUSTER_PATH_MAX_BLOCKS} blocks, or twice that at batch <= {policy.CLUSTER_PATH_TWO_WAVE_MAX_BATCH} "
            "(policy.uses_cluster_path), and this GPU runs them, over one "
            "thread-block cluster per row holding the row in registers (one launch); "
            "launched as the score kernel's programmatic dependent "
            f"({'triggered when its programs start' if triton_kernels.CAN_LAUNCH_DEPENDENTS else 'triggered when its programs end'}); "
            f"scores: Triton, {policy.DOTS[policy.GPU_SCORE_TILE.dot]}; {graphs}"
        )
    if INTERPRETED:
        return (
            "top-k: portable path, torch.topk on the Triton-computed scores (Triton interpreter on CPU, "
            "TRITON_INTERPRET=1); the CUDA filtered top-k is not used on this machine"
        )
    return "no CUDA device and TRITON_INTERPRET is unset: the Triton kernels cannot run here"


def _check_inputs(q, cache, weights, seq_lens, block_table, topk_indices, topk: int = TOPK) -> None:
    """Shapes, dtypes and devices, checked on the host from metadata only."""
    batch = block_table.shape[0]
    problems = []
    if q.dtype != torch.float8_e4m3fn or tuple(q.shape) != (batch, NUM_HEADS, HEAD_DIM):
        problems.append(f"q_index_fp8 must be float8_e4m3fn [{batch}, {NUM_HEADS}, {HEAD_DIM}], got {q.dtype} {tuple(q.shape)}")
    if cache.element_size() != 1 or cache.dim() != 4 or tuple(cache.shape[1:]) != (PAGE_SIZE, 1, PAGE_BYTES // PAGE_SIZE):
        want = f"[num_pages, {PAGE_SIZE}, 1, {PAGE_BYTES // PAGE_SIZE}]"
        problems.append(f"k_index_cache_fp8 must be a 1-byte {want} tensor, got {cache.dtype} {tuple(cache.shape)}")
    if weights.dtype != torch.float32 or tuple(weights.shape) != (batch, NUM_HEADS):
        problems.append(f"weights must be float32 [{batch}, {NUM_HEADS}], got {weights.dtype} {tuple(weights.shape)}")
    if seq_lens.dtype != torch.int32 or tuple(seq_lens.shape) != (batch,):
        problems.append(f"seq_lens must be int32 [{batch}], got {seq_lens.dtype} {tuple(seq_lens.shape)}")
    if block_table.dtype != torch.int32:
        problems.append(f"block_table must be int32, got {block_table.dtype}")
    if topk_indices.dtype != torch.int32 or tuple(topk_indices.shape) != (batch, topk):
        problems.append(f"topk_indices must be int32 [{batch}, {topk}], got {topk_indices.dtype} {tuple(topk_indices.shape)}")
    devices = {t.device for t in (q, cache, weights, seq_lens, block_table, topk_indices)}
    if len(devices) != 1:
        problems.append(f"all tensors must be on one device, got {sorted(map(str, devices))}")
    elif problem := device_problem(next(iter(devices))):
        problems.append(problem)
    if problems:
        raise ValueError("; ".join(problems))


def _contiguous(*tensors: torch.Tensor) -> list[torch.Tensor]:
    return [t if t.is_contiguous() else t.contiguous() for t in tensors]


def scored_path(select_topk, dependent, q_index_fp8, k_index_cache_fp8, weights, seq_lens, block_table, topk_indices) -> None:
    """Triton scores of the rows longer than 2048, then ``select_topk`` writes the ids.

    ``dependent``: the CUDA top-k is launched as a programmatic dependent of the score kernel, so
    its launch and block-table copy overlap the score kernel's tail (it reads the scores only
    after the score kernel has completed).
    """
    batch, max_pages = block_table.shape
    scores = torch.empty((batch, max_pages * PAGE_SIZE), dtype=torch.float32, device=q_index_fp8.device)
    triton_kernels.launch_scores(q_index_fp8, k_index_cache_fp8, weights, seq_lens, block_table, scores, skip_short_rows=True,
                        launch_dependents=dependent)  # fmt: skip
    if dependent:
        select_topk(scores, seq_lens, block_table, topk_indices, dependent_launch=True)
    else:
        select_topk(scores, seq_lens, block_table, topk_indices)


def portable_topk(scores: torch.Tensor, seq_lens: torch.Tensor, block_table: torch.Tensor, topk_indices: torch.Tensor) -> None:
    """torch.topk on the score buffer, then the Triton emit kernel maps positions to ids.

    Rows with L <= 2048 were not scored (their buffer rows hold garbage): the emit kernel passes
    them through and ignores their topk positions. Longer rows hold -inf past L, never chosen.
    """
    positions = torch.topk(scores, TOPK, dim=1, sorted=False).indices
    triton_kernels.launch_emit_ids(block_table, seq_lens, topk_indices, positions)


def scored_pipeline(select_topk, dependent: bool = False):
    """``scored_path`` with ``select_topk``, replayed as one CUDA graph per argument set on a GPU.

    The entry uses the CUDA top-k as the score kernel's dependent launch (torch.topk under the
    interpreter); the indexer benchmark builds its comparison pipelines from ``portable_topk``
    and from the CUDA top-k launched after the score kernel has ended.
    """
    scored = functools.partial(scored_path, select_topk, dependent)
    return LaunchGraphs(scored) if torch.cuda.is_available() and not INTERPRETED else scored


#: The entry's scored path: the CUDA top-k on a GPU, torch.topk under the interpreter.
_scored_graphs = scored_pipeline(select_topk_cuda, dependent=True) if _cuda_topk is not None else scored_pipeline(portable_topk)


def run_pipeline(scored, q_index_fp8, k_index_cache_fp8, weights, seq_lens, block_table, topk_indices) -> None:
    """Checks the inputs, then the passthrough kernel, or ``scored`` (see ``scored_pipeline``)."""
    _check_inputs(q_index_fp8, k_index_cache_fp8, weights, seq_lens, block_table, topk_indices)
    q_index_fp8, weights, seq_lens = _contiguous(q_index_fp8, weights, seq_lens)
    if block_table.stride(1) != 1:
        block_table = block_table.contiguous()
    batch, max_pages = block_table.shape
    if batch == 0:
        return
    if max_pages * PAGE_SIZE <= TOPK:
        triton_kernels.launch_emit_ids(block_table, seq_lens, topk_indices)
        return
    scored(q_index_fp8, k_index_cache_fp8, weights, seq_lens, block_table, topk_indices)


def kernel(
    q_index_fp8: torch.Tensor,
    k_index_cache_fp8: torch.Tensor,
    weights: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    topk_indices: torch.Tensor,
) -> None:
    """Write the top-2048 physical ids of every row into ``topk_indices`` (see the module doc)."""
    run_pipeline(_scored_graphs, q_index_fp8, k_index_cache_fp8, weights, seq_lens, block_table, topk_indices)


# --------------------------------------------------------------------------- V4's selection sizes

#: selection sizes besides TOPK that ``other_topk_kernel`` serves (DeepSeek-V4's two model sizes)
OTHER_TOPKS = (512, 1024)


def emit_ids_torch(block_table: torch.Tensor, seq_lens: torch.Tensor, topk_indices: torch.Tensor, positions: torch.Tensor | None) -> None:
    """``topk_indices [B, k]``: rows of L <= k list positions 0..L-1 then -1; longer rows the ids
    of ``positions [B, k]`` (torch ops: the Triton emit kernel is built for k = 2048)."""
    k = topk_indices.shape[1]
    slot = torch.arange(k, device=block_table.device)
    lens = seq_lens.long()[:, None]
    pages = block_table.long()
    if positions is None:
        positions = slot.expand(block_table.shape[0], k)
    short = lens <= k
    pos = torch.where(short, slot, positions)
    pos = pos.clamp(max=pages.shape[1] * PAGE_SIZE - 1)  # a short row's slots past its last page: masked below
    ids = pages.gather(1, pos // PAGE_SIZE) * PAGE_SIZE + pos % PAGE_SIZE
    topk_indices.copy_(torch.where(short & (slot >= lens), -1, ids).to(torch.int32))


def other_topk_scored_path(k: int, q_index_fp8, k_index_cache_fp8, weights, seq_lens, block_table, topk_indices) -> None:
    """Scores of every row, then the top-k of the rows longer than k (see the module doc)."""
    batch, max_pages = block_table.shape
    scores = torch.empty((batch, max_pages * PAGE_SIZE), dtype=torch.float32, device=q_index_fp8.device)
    triton_kernels.launch_scores(q_index_fp8, k_index_cache_fp8, weights, seq_lens, block_table, scores, skip_short_rows=False)
    if _cuda_topk is not None:
        select_topk_cuda(scores, seq_lens, block_table, topk_indices)  # k: the output's width
    else:
        emit_ids_torch(block_table, seq_lens, topk_indices, torch.topk(scores, k, dim=1, sorted=False).indices)


#: the scored path of each other selection size, replayed as a CUDA graph per argument set on a GPU
_other_topk_graphs = {
    k: (LaunchGraphs(path) if _cuda_topk is not None else path)
    for k, path in ((k, functools.partial(other_topk_scored_path, k)) for k in OTHER_TOPKS)
}


def other_topk_kernel(
    q_index_fp8: torch.Tensor,
    k_index_cache_fp8: torch.Tensor,
    weights: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    topk_indices: torch.Tensor,
) -> None:
    """Write the top-k physical ids of every row, k = ``topk_indices.shape[1]`` in OTHER_TOPKS."""
    k = topk_indices.shape[1]
    if k not in OTHER_TOPKS:
        raise ValueError(f"topk_indices has {k} columns; this entry serves k in {OTHER_TOPKS} (2048: kernel)")
    _check_inputs(q_index_fp8, k_index_cache_fp8, weights, seq_lens, block_table, topk_indices, topk=k)
    q_index_fp8, weights, seq_lens = _contiguous(q_index_fp8, weights, seq_lens)
    if block_table.stride(1) != 1:
        block_table = block_table.contiguous()
    batch, max_pages = block_table.shape
    if batch == 0:
        return
    if max_pages * PAGE_SIZE <= k:
        emit_ids_torch(block_table, seq_lens, topk_indices, None)
        return
    _other_topk_graphs[k](q_index_fp8, k_index_cache_fp8, weights, seq_lens, block_table, topk_indices)
