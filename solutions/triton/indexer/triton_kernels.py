"""Triton kernels of the lightning indexer: the fused FP8 score kernel and the id-emit kernel.

Both run compiled on a GPU and under ``TRITON_INTERPRET=1`` on CPU tensors, with the tiles
``policy.py`` picks (large ones under the interpreter, which runs programs one after another; one
page per program on a GPU). The kernels are the same code either way, and the tests also run the
GPU tiles under the interpreter.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..common.interpreter import INTERPRETED
from .policy import ScoreTile, default_score_tile, emit_block
from .shapes import HEAD_DIM, NUM_HEADS, PAGE_BYTES, PAGE_SIZE, PAGE_VALUE_BYTES, SCALE_BYTES, TOPK

#: Score of a position at or beyond seq_len. Every real score is finite (masked loads keep the
#: NaN bytes of unreachable cache pages out), so -inf ranks below all of them and torch.topk
#: over a row with L > TOPK never picks it.
SENTINEL_SCORE = float("-inf")

#: Whether this Triton can end a program's part in a programmatic dependent launch early
#: (``griddepcontrol.launch_dependents``): the top-k launched after the score kernel then starts
#: while the score kernel's last programs run. Without it the trigger is each program's exit.
CAN_LAUNCH_DEPENDENTS = not INTERPRETED and hasattr(getattr(tl.extra, "cuda", None), "gdc_launch_dependents")


# --------------------------------------------------------------------------- zero-copy cache views


def cache_views(k_index_cache_fp8: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Zero-copy views of the packed cache: (``[P, 64, 128]`` fp8 values, ``[P, 64]`` fp32 scales).

    The ``[P, 64, 1, 132]`` int8 tensor is only a shape; per page the bytes are 64 x 128 FP8
    values token-major, then 64 fp32 scales. Both views keep the 8448-byte page stride.
    """
    if k_index_cache_fp8.element_size() != 1 or not k_index_cache_fp8.is_contiguous():
        raise ValueError("k_index_cache_fp8 must be a contiguous 1-byte tensor")
    raw = k_index_cache_fp8.view(torch.uint8).view(k_index_cache_fp8.shape[0], PAGE_BYTES)
    values = raw[:, :PAGE_VALUE_BYTES].view(torch.float8_e4m3fn).view(-1, PAGE_SIZE, HEAD_DIM)
    scales = raw[:, PAGE_VALUE_BYTES:].view(torch.float32)
    return values, scales


# --------------------------------------------------------------------------- score kernel


@triton.jit
def _page_logits(keys, q_t, DOT: tl.constexpr):
    """[tokens, NUM_HEADS] fp32 logits of FP8 keys [tokens, HEAD_DIM] against q_t [HEAD_DIM, NUM_HEADS] (see DOTS)."""
    if DOT == "fp8":
        # Hopper's default for FP8 operands keeps the whole K = 128 dot in the MMA accumulator.
        return tl.dot(keys, q_t, out_dtype=tl.float32)
    elif DOT == "fp32":
        return tl.dot(keys.to(tl.float32), q_t.to(tl.float32), input_precision="ieee", out_dtype=tl.float32)
    else:
        return tl.dot(keys.to(tl.float16), q_t.to(tl.float16), out_dtype=tl.float32)


@triton.jit
def _score_pages_loop(
    q_ptr, k_values_ptr, k_scales_ptr, weights_ptr, block_table_ptr, scores_ptr, row_width, stride_bt_row,
    pid_n, row, seq_len,
    NUM_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE_SIZE: tl.constexpr, PAGE_BYTES: tl.constexpr, TOPK: tl.constexpr,
    LOOP_PAGES: tl.constexpr, LOOP_SLOTS: tl.constexpr, SKIP_SHORT_ROWS: tl.constexpr, DOT: tl.constexpr,
    SENTINEL: tl.constexpr,
):
    """Pages [pid_n * LOOP_PAGES, +LOOP_PAGES) of row ``row``, one page per loop step.

    The program's block-table entries are loaded first, while seq_len (loaded just before) is
    still in flight: seq_len bounds the loop, so a table load inside it would wait for seq_len
    and the first key load for both, one after the other. The query and head weights are loaded
    once; the loop over the row's scored pages is software-pipelined (the launch's num_stages),
    so the next page's keys are in flight while this page's dot runs. Positions of the program's
    range at or beyond seq_len get the sentinel first, in one masked store.
    """
    first_page = pid_n * LOOP_PAGES
    table_slots = tl.arange(0, LOOP_SLOTS)  # LOOP_SLOTS: LOOP_PAGES rounded up to a power of two
    table_pages = tl.load(block_table_ptr + row * stride_bt_row + first_page + table_slots,
                          mask=(table_slots < LOOP_PAGES) & ((first_page + table_slots) * PAGE_SIZE < row_width), other=0)  # fmt: skip
    if SKIP_SHORT_ROWS:  # noqa: SIM102 -- a constexpr and a runtime condition stay separate in Triton
        if seq_len <= TOPK:
            return
    slot = tl.arange(0, PAGE_SIZE)
    out_row = scores_ptr + row * row_width
    for j in tl.static_range(LOOP_PAGES):  # page by page: LOOP_PAGES need not be a power of two
        span = (first_page + j) * PAGE_SIZE + slot
        tl.store(out_row + span, tl.full([PAGE_SIZE], SENTINEL, tl.float32), mask=(span >= seq_len) & (span < row_width))
    scored_pages = tl.minimum(tl.cdiv(seq_len, PAGE_SIZE) - first_page, LOOP_PAGES)

    dims = tl.arange(0, HEAD_DIM)
    heads = tl.arange(0, NUM_HEADS)
    token_offsets = slot[:, None] * HEAD_DIM + dims[None, :]
    q_t = tl.load(q_ptr + row * (NUM_HEADS * HEAD_DIM) + heads[None, :] * HEAD_DIM + dims[:, None])
    w = tl.load(weights_ptr + row * NUM_HEADS + heads)
    for i in range(0, scored_pages):
        tokens = (first_page + i) * PAGE_SIZE + slot
        valid = tokens < seq_len
        page = tl.sum(tl.where(table_slots == i, table_pages, 0)).to(tl.int64)  # entry i, from registers
        keys = tl.load(k_values_ptr + page * PAGE_BYTES + token_offsets, mask=valid[:, None])
        scale = tl.load(k_scales_ptr + page * (PAGE_BYTES // 4) + slot, mask=valid, other=0.0)
        logits = _page_logits(keys, q_t, DOT)
        head_sum = tl.sum(tl.maximum(logits, 0.0) * w[None, :], axis=1)
        tl.store(out_row + tokens, tl.where(valid, head_sum * scale, SENTINEL))


@triton.jit
def _score_kernel(
    q_ptr,  # [B, NUM_HEADS, HEAD_DIM] float8_e4m3fn, contiguous
    k_values_ptr,  # [P, PAGE_SIZE, HEAD_DIM] float8_e4m3fn view of the cache (page stride PAGE_BYTES)
    k_scales_ptr,  # [P, PAGE_SIZE] float32 view of the cache (page stride PAGE_BYTES / 4)
    weights_ptr,  # [B, NUM_HEADS] float32, contiguous
    seq_lens_ptr,  # [B] int32
    block_table_ptr,  # [B, max_num_pages] int32, rows stride_bt_row apart
    scores_ptr,  # [B, row_width] float32, contiguous; written
    row_width,  # max_num_pages * PAGE_SIZE
    stride_bt_row,
    NUM_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    PAGE_BYTES: tl.constexpr,
    TOPK: tl.constexpr,
    PAGES: tl.constexpr,  # pages per tile
    BLOCK_N: tl.constexpr,  # tokens per tile, PAGES * PAGE_SIZE
    LOOP_PAGES: tl.constexpr,  # one-page tiles per program (PAGES == 1), looped
    LOOP_SLOTS: tl.constexpr,  # LOOP_PAGES rounded up to a power of two
    SKIP_SHORT_ROWS: tl.constexpr,
    DOT: tl.constexpr,
    SENTINEL: tl.constexpr,
    LAUNCH_DEPENDENTS: tl.constexpr,  # let a dependent launch (the top-k) start now (CAN_LAUNCH_DEPENDENTS)
    ROWS_FIRST: tl.constexpr,  # grid axis 0 is the row (ScoreTile.rows_first)
):
    """Scores of pages ``[pid_n * PAGES, (pid_n + 1) * PAGES)`` of row ``pid_b``.

    score[j] = scale[j] * sum_h w[h] * relu(k[j] . q[h]); the per-token scale is a non-negative
    scalar per key, so it factors out of the head sum and multiplies the [BLOCK_N] result once.
    The layout strides are compile-time constants, so the key loads vectorise to 16 bytes.
    """
    tl.static_assert(BLOCK_N == PAGES * PAGE_SIZE)
    tl.static_assert(PAGE_BYTES % 16 == 0)
    tl.static_assert(LOOP_PAGES == 1 or PAGES == 1, "a looping program takes one-page tiles")
    if LAUNCH_DEPENDENTS:
        # The top-k waits for this whole grid's completion before it reads a score
        # (griddepcontrol.wait), so the trigger may come first.
        tl.extra.cuda.gdc_launch_dependents()
    if ROWS_FIRST:
        pid_n = tl.program_id(1)
        row = tl.program_id(0)
    else:
        pid_n = tl.program_id(0)
        row = tl.program_id(1)
    seq_len = tl.load(seq_lens_ptr + row)
    if LOOP_PAGES > 1:
        _score_pages_loop(q_ptr, k_values_ptr, k_scales_ptr, weights_ptr, block_table_ptr, scores_ptr, row_width, stride_bt_row,
                          pid_n, row, seq_len, NUM_HEADS, HEAD_DIM, PAGE_SIZE, PAGE_BYTES, TOPK, LOOP_PAGES, LOOP_SLOTS,
                          SKIP_SHORT_ROWS, DOT, SENTINEL)
        return
    if PAGES == 1:
        # GPU tile: its single block-table entry (pid_n < max_num_pages, so it exists) is loaded
        # before the seq_len tests, so the two loads are in flight together.
        page = tl.load(block_table_ptr + row * stride_bt_row + pid_n).to(tl.int64)  # int64: page * 8448 B
    if SKIP_SHORT_ROWS:  # noqa: SIM102 -- a constexpr and a runtime condition stay separate in Triton
        if seq_len <= TOPK:
            return  # every token of the row is selected: the top-k stage passes it through unscored
    tokens = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    out_ptrs = scores_ptr + row * row_width + tokens
    in_row = tokens < row_width  # the last tile of a row may overhang its padded width
    if pid_n * BLOCK_N >= seq_len:
        # Past the row's last page: its block-table entries may name pages of NaN bytes.
        tl.store(out_ptrs, tl.full([BLOCK_N], SENTINEL, tl.float32), mask=in_row)
        return

    slot = tl.arange(0, PAGE_SIZE)
    dims = tl.arange(0, HEAD_DIM)
    token_offsets = slot[:, None] * HEAD_DIM + dims[None, :]  # [PAGE_SIZE, HEAD_DIM] bytes within a page
    # Keys, [BLOCK_N, HEAD_DIM], become the MMA's A operand. The loads are masked, so the NaN
    # bytes that fill the unreachable slots of a row's last page are never read. Masked lanes
    # hold no defined value; that is harmless because a token's logits depend only on its own
    # key row and the final tl.where replaces the score of every position >= seq_len.
    if PAGES == 1:
        # GPU tile: one page, so the key tile is one base address plus offsets.
        keys = tl.load(k_values_ptr + page * PAGE_BYTES + token_offsets, mask=(tokens < seq_len)[:, None])
        scale = tl.load(k_scales_ptr + page * (PAGE_BYTES // 4) + slot, mask=tokens < seq_len, other=0.0)
    else:
        # Interpreter tile: one block-table entry per page, a [PAGES, PAGE_SIZE, HEAD_DIM] gather.
        logical_page = pid_n * PAGES + tl.arange(0, PAGES)
        page = tl.load(block_table_ptr + row * stride_bt_row + logical_page, mask=logical_page * PAGE_SIZE < seq_len, other=0)
        page = page.to(tl.int64)
        valid = tl.reshape(tokens < seq_len, (PAGES, PAGE_SIZE))
        k_ptrs = k_values_ptr + page[:, None, None] * PAGE_BYTES + token_offsets[None, :, :]
        keys = tl.reshape(tl.load(k_ptrs, mask=valid[:, :, None]), (BLOCK_N, HEAD_DIM))
        scale = tl.load(k_scales_ptr + page[:, None] * (PAGE_BYTES // 4) + slot[None, :], mask=valid, other=0.0)
        scale = tl.reshape(scale, (BLOCK_N,))
    # Query transposed, [HEAD_DIM, NUM_HEADS]: K-major, as the tensor cores want their B operand.
    heads = tl.arange(0, NUM_HEADS)
    q_t = tl.load(q_ptr + row * (NUM_HEADS * HEAD_DIM) + heads[None, :] * HEAD_DIM + dims[:, None])
    logits = _page_logits(keys, q_t, DOT)  # [BLOCK_N, NUM_HEADS]
    w = tl.load(weights_ptr + row * NUM_HEADS + heads)  # [NUM_HEADS]
    head_sum = tl.sum(tl.maximum(logits, 0.0) * w[None, :], axis=1)  # [BLOCK_N]
    tl.store(out_ptrs, tl.where(tokens < seq_len, head_sum * scale, SENTINEL), mask=in_row)


def launch_scores(
    q_index_fp8: torch.Tensor,
    k_index_cache_fp8: torch.Tensor,
    weights: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    scores: torch.Tensor,
    skip_short_rows: bool = True,
    tile: ScoreTile | None = None,
    launch_dependents: bool = False,
) -> None:
    """Fill ``scores [B, max_num_pages * 64]`` with the row scores (sentinel at positions >= L).

    With ``skip_short_rows`` rows of L <= TOPK are left unwritten: the top-k stage passes them
    through without looking at their scores. ``launch_dependents`` triggers a programmatic
    dependent launch at each program's start (where this Triton can, ``CAN_LAUNCH_DEPENDENTS``);
    only for a next kernel that waits for this grid before it reads the scores.
    """
    batch, max_pages = block_table.shape
    row_width = max_pages * PAGE_SIZE
    if tuple(scores.shape) != (batch, row_width) or scores.dtype != torch.float32 or not scores.is_contiguous():
        raise ValueError(f"scores must be a contiguous float32 [{batch}, {row_width}] tensor, got {scores.dtype} {tuple(scores.shape)}")
    if tuple(q_index_fp8.shape) != (batch, NUM_HEADS, HEAD_DIM) or not q_index_fp8.is_contiguous():
        raise ValueError(f"q_index_fp8 must be contiguous [{batch}, {NUM_HEADS}, {HEAD_DIM}], got {tuple(q_index_fp8.shape)}")
    if tuple(weights.shape) != (batch, NUM_HEADS) or not weights.is_contiguous():
        raise ValueError(f"weights must be contiguous [{batch}, {NUM_HEADS}], got {tuple(weights.shape)}")
    if block_table.stride(1) != 1:
        raise ValueError("block_table must be contiguous in its last dimension")
    if batch == 0:
        return
    tile = tile or default_score_tile(max_pages, batch)
    values, scales = cache_views(k_index_cache_fp8)  # the kernel hard-codes these strides (constexpr page layout)
    if values.stride() != (PAGE_BYTES, HEAD_DIM, 1) or scales.stride() != (PAGE_BYTES // SCALE_BYTES, 1):
        strides = f"{values.stride()} and {scales.stride()}"
        raise ValueError(f"k_index_cache_fp8 views must have the {PAGE_BYTES}-byte page stride, got {strides}")
    grid = (triton.cdiv(max_pages, tile.pages_per_program), batch)
    if tile.rows_first:
        grid = grid[::-1]
    _score_kernel[grid](
        q_index_fp8, values, scales, weights, seq_lens, block_table, scores, row_width, block_table.stride(0),
        NUM_HEADS=NUM_HEADS, HEAD_DIM=HEAD_DIM, PAGE_SIZE=PAGE_SIZE, PAGE_BYTES=PAGE_BYTES, TOPK=TOPK,
        PAGES=tile.pages, BLOCK_N=tile.block_n, LOOP_PAGES=tile.loop_pages, LOOP_SLOTS=triton.next_power_of_2(tile.loop_pages),
        SKIP_SHORT_ROWS=skip_short_rows,
        DOT=tile.dot, SENTINEL=SENTINEL_SCORE, LAUNCH_DEPENDENTS=launch_dependents and CAN_LAUNCH_DEPENDENTS,
        ROWS_FIRST=tile.rows_first, num_warps=tile.num_warps, num_stages=tile.num_stages,
    )  # fmt: skip


# --------------------------------------------------------------------------- id emit kernel


@triton.jit
def _emit_ids_kernel(
    block_table_ptr,  # [B, max_num_pages] int32
    seq_lens_ptr,  # [B] int32
    positions_ptr,  # [B, TOPK] int64 token positions (only read when HAS_POSITIONS)
    out_ptr,  # [B, TOPK] int32, written
    stride_bt_row,
    stride_pos_row,
    stride_out_row,
    max_pages,  # columns of the block table
    PAGE_SIZE: tl.constexpr,
    TOPK: tl.constexpr,
    BLOCK: tl.constexpr,
    HAS_POSITIONS: tl.constexpr,
):
    """Physical ids of slots ``[pid_c * BLOCK, (pid_c + 1) * BLOCK)`` of row ``pid_b``.

    A row with L <= TOPK keeps every token: slot i holds position i (or -1 for i >= L). A longer
    row (only with HAS_POSITIONS) holds the positions its top-k selected.
    """
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    seq_len = tl.load(seq_lens_ptr + row)
    if HAS_POSITIONS:
        selected = cols < tl.where(seq_len > TOPK, TOPK, 0)  # all slots of a long row, none of a short one
        chosen = tl.load(positions_ptr + row * stride_pos_row + cols, mask=selected, other=0)
        pos = tl.where(selected, chosen.to(tl.int32), cols)
        valid = pos < seq_len
        page = tl.load(block_table_ptr + row * stride_bt_row + pos // PAGE_SIZE, mask=valid, other=0)
    else:
        # Passthrough: slot i is position i. Its block-table entry is read whether or not i < L
        # (masked by the table's width only), so this load does not wait for seq_len's.
        pos = cols
        valid = pos < seq_len
        page = tl.load(block_table_ptr + row * stride_bt_row + pos // PAGE_SIZE, mask=pos // PAGE_SIZE < max_pages, other=0)
    ids = tl.where(valid, page * PAGE_SIZE + pos % PAGE_SIZE, -1)
    tl.store(out_ptr + row * stride_out_row + cols, ids)


def launch_emit_ids(
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    topk_indices: torch.Tensor,
    positions: torch.Tensor | None = None,
) -> None:
    """Write ``topk_indices [B, TOPK]``: passthrough rows, and (given ``positions``) selected rows."""
    batch = block_table.shape[0]
    if tuple(topk_indices.shape) != (batch, TOPK) or topk_indices.dtype != torch.int32 or topk_indices.stride(1) != 1:
        raise ValueError(
            f"topk_indices must be int32 [{batch}, {TOPK}] with contiguous rows, got {topk_indices.dtype} {tuple(topk_indices.shape)}"
        )
    if block_table.stride(1) != 1:
        raise ValueError("block_table must be contiguous in its last dimension")
    if positions is not None and (tuple(positions.shape) != (batch, TOPK) or positions.stride(1) != 1):
        raise ValueError(f"positions must be [{batch}, {TOPK}] with contiguous rows, got {tuple(positions.shape)}")
    if batch == 0:
        return
    block = emit_block()
    pos_arg = positions if positions is not None else topk_indices  # never read without HAS_POSITIONS
    _emit_ids_kernel[(batch, TOPK // block)](
        block_table, seq_lens, pos_arg, topk_indices,
        block_table.stride(0), pos_arg.stride(0), topk_indices.stride(0), block_table.shape[1],
        PAGE_SIZE=PAGE_SIZE, TOPK=TOPK, BLOCK=block, HAS_POSITIONS=positions is not None,
        num_warps=4,
    )  # fmt: skip
