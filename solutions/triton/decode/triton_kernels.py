"""Triton kernels of the FP8 sparse MLA decode: the split kernel (with its in-launch combines) and the combine kernel.

One program owns (head block ``hb``, split ``s``, query token ``t``): BLOCK_H heads of token t
and the positions s, s + S, s + 2S, ... of its index row (strided, because valid slots cluster
at the front of short rows). Per step it gathers BLOCK_N records, dequantizes them in registers
(FP8 e4m3 -> fp32 x scale -> bf16; RoPE bf16 as stored), computes the logits with ``tl.dot``
(bf16 operands, fp32 accumulation), folds them into a log2-domain online softmax and multiplies
P (bf16) by V, which is the first D_V = 512 dims of the same dequantized rows.

``MODE`` says what a program does with its result:

* ``MODE_DIRECT`` (S = 1): normalise, apply the sink, write ``out`` and ``lse``.
* ``MODE_PARTIAL``: write the partial (out / l in the partial dtype, lse2 = m + log2 l in fp32)
  for the combine kernel, launched next (the two-launch path; the only one the interpreter may
  take besides MODE_LAST, since it runs programs one after another).
* ``MODE_BARRIER``: write the partial, arrive at the (token, head block)'s ticket word, wait for
  the other S - 1 programs, then combine value columns [s * 512 / S, (s + 1) * 512 / S). Only
  launched when every program of the grid is resident at once (grid <= SMs: any kernel that
  launches at all fits one program per SM), so the spin cannot wait for a program that never
  starts.
* ``MODE_LAST``: write the partial and arrive; the last of the S programs to arrive combines all
  512 columns alone (no spin, so any grid size; one program does the whole combine).

Ticket words (MODE_BARRIER, MODE_LAST): one int32 word per (token, head block), TICKET_STRIDE
words apart, that only ever grows (mod 2^32) and is zeroed once when allocated. Every call adds
TICKETS_PER_CALL in all (TICKETS_PER_CALL / S per program), so a call starts on a multiple of
TICKETS_PER_CALL whatever earlier calls' split counts were; the value a program's atomic returns
rounded down to that multiple is the call's start, the episode ends at start + TICKETS_PER_CALL,
and the program whose arrival reaches it is the last. 64 divides 2^32, so wrapping keeps this.
(The design of the sparse attention's CUDA ticket barrier, docs/kernels/attention.md.)
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..common.triton_math import dot, online_softmax_step, to_storage

MODE_DIRECT, MODE_PARTIAL, MODE_BARRIER, MODE_LAST = 0, 1, 2, 3
#: int32 words between two units' ticket words (128 bytes: no two share a cache line)
TICKET_STRIDE = 32
#: how far one call advances a unit's ticket word, whatever its split count (S divides it)
TICKETS_PER_CALL = 64
#: partial elements (splits x heads x columns) one program of the combine kernel takes at once
COMBINE_ELEMENTS = 8192
COMBINE_NUM_WARPS = 4
LOG2_E = 1.4426950408889634
#: the same constants as the kernels read them (a jit function may read only constexpr globals)
_LOG2_E: tl.constexpr = tl.constexpr(LOG2_E)
_LN_2: tl.constexpr = tl.constexpr(0.6931471805599453)


# --------------------------------------------------------------------------- device code


@triton.jit
def _record_rows(cache_ptr, tok, valid, page_stride,
                 BLOCK_SIZE: tl.constexpr, DATA_SLOT_BYTES: tl.constexpr, SCALE_BASE: tl.constexpr,
                 SCALE_SLOT_BYTES: tl.constexpr, ROPE_OFFSET: tl.constexpr):  # fmt: skip
    """Byte pointers [BLOCK_N] to the data row, the scales and the RoPE (as bf16) of tokens ``tok``
    (physical ids block * BLOCK_SIZE + slot; invalid ones point at token 0 and must stay masked)."""
    tok64 = tl.where(valid, tok, 0).to(tl.int64)
    page = cache_ptr + (tok64 // BLOCK_SIZE) * page_stride
    slot = tok64 % BLOCK_SIZE
    data_row = page + slot * DATA_SLOT_BYTES
    scale_row = page + SCALE_BASE + slot * SCALE_SLOT_BYTES
    rope_row = (data_row + ROPE_OFFSET).to(tl.pointer_type(tl.bfloat16))
    return data_row, scale_row, rope_row


@triton.jit
def _prefetch_l2(data_row, scale_row, valid, DATA_SPAN_BYTES: tl.constexpr, SCALES_IN_SPAN: tl.constexpr, POINTS: tl.constexpr):
    """``prefetch.global.L2`` of every 128-byte line of the valid tokens' records (the data row's
    DATA_SPAN_BYTES, and the scale row when it lies elsewhere): a hint with no result to wait
    for, so the records of the next block travel from DRAM while this one is attended."""
    LINE: tl.constexpr = 128
    tl.static_assert(POINTS * LINE >= DATA_SPAN_BYTES + LINE, "a point in every line the span touches")
    # points LINE bytes apart from the row start, the rest on its last byte: one in every line
    at = tl.minimum(tl.arange(0, POINTS) * LINE, DATA_SPAN_BYTES - 1)
    points = tl.where(valid[:, None], data_row[:, None] + at[None, :], data_row[:, None])
    tl.inline_asm_elementwise("prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", "=r,l", [points], dtype=tl.int32, is_pure=False, pack=1)
    if not SCALES_IN_SPAN:
        tl.inline_asm_elementwise("prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", "=r,l", [scale_row], dtype=tl.int32, is_pure=False,
                                  pack=1)


@triton.jit
def _gather(data_row, scale_row, rope_row, valid,
            BLOCK_N: tl.constexpr, D_V: tl.constexpr, QUANT_DIMS: tl.constexpr, SCALE_TILE: tl.constexpr,
            NUM_SCALES: tl.constexpr, SCALES_FP32: tl.constexpr, V_ROPE_DIMS: tl.constexpr, K_EXTRA_DIMS: tl.constexpr):  # fmt: skip
    """The record bytes of BLOCK_N tokens, as loaded: (FP8 bytes [BLOCK_N, D_V] uint8 (columns >=
    QUANT_DIMS 0), scales [BLOCK_N, D_V / SCALE_TILE] (fp32, or UE8M0 bytes; tiles past NUM_SCALES 0),
    RoPE bf16: [BLOCK_N, K_EXTRA_DIMS] for the K-only dims, else [BLOCK_N, D_V] holding the V dims
    at columns >= QUANT_DIMS, else an unused [BLOCK_N, 16] of zeros).

    Masked loads: bytes of invalid tokens (NaN on purpose) are never read, their rows are 0.
    """
    NUM_TILES: tl.constexpr = D_V // SCALE_TILE
    cols = tl.arange(0, D_V)
    tiles = tl.arange(0, NUM_TILES)
    if QUANT_DIMS == D_V:
        raw = tl.load(data_row[:, None] + cols[None, :], mask=valid[:, None], other=0)
    else:
        raw = tl.load(data_row[:, None] + cols[None, :], mask=valid[:, None] & (cols < QUANT_DIMS)[None, :], other=0)
    scale_mask = valid[:, None] & (tiles < NUM_SCALES)[None, :]
    if SCALES_FP32:
        scale = tl.load(scale_row.to(tl.pointer_type(tl.float32))[:, None] + tiles[None, :], mask=scale_mask, other=0.0)
    else:
        scale = tl.load(scale_row[:, None] + tiles[None, :], mask=scale_mask, other=0)
    if K_EXTRA_DIMS > 0:
        rope = tl.load(rope_row[:, None] + (V_ROPE_DIMS + tl.arange(0, K_EXTRA_DIMS))[None, :], mask=valid[:, None], other=0.0)
    elif V_ROPE_DIMS > 0:
        rope = tl.load(rope_row[:, None] + (cols - QUANT_DIMS)[None, :], mask=valid[:, None] & (cols >= QUANT_DIMS)[None, :], other=0.0)
    else:
        rope = tl.zeros([BLOCK_N, 16], tl.bfloat16)
    return raw, scale, rope


@triton.jit
def _dequantize(raw, scale, rope,
                BLOCK_N: tl.constexpr, D_V: tl.constexpr, QUANT_DIMS: tl.constexpr, SCALE_TILE: tl.constexpr,
                SCALES_FP32: tl.constexpr, V_ROPE_DIMS: tl.constexpr, INTERPRETED: tl.constexpr):  # fmt: skip
    """The main part of BLOCK_N K rows, [BLOCK_N, D_V] bf16 (it is also V), from ``_gather``'s bytes:
    columns < QUANT_DIMS e4m3 x their tile's scale (fp32, or UE8M0 2^(byte - 127) built from the
    exponent bits, exact), columns >= QUANT_DIMS the V RoPE dims as stored."""
    NUM_TILES: tl.constexpr = D_V // SCALE_TILE
    x = raw.to(tl.float8e4nv, bitcast=True).to(tl.float32)
    if not SCALES_FP32:
        scale = (scale.to(tl.int32) << 23).to(tl.float32, bitcast=True)
    x = tl.reshape(tl.reshape(x, [BLOCK_N, NUM_TILES, SCALE_TILE]) * scale[:, :, None], [BLOCK_N, D_V])
    if V_ROPE_DIMS > 0:
        cols = tl.arange(0, D_V)
        x = tl.where((cols < QUANT_DIMS)[None, :], x, rope.to(tl.float32))
    return to_storage(x, tl.bfloat16, INTERPRETED)


@triton.jit
def _attend(q_main, q_extra, raw, scale, rope, valid, m_i, l_i, acc, qk_scale_log2,
            BLOCK_N: tl.constexpr, D_V: tl.constexpr, QUANT_DIMS: tl.constexpr, SCALE_TILE: tl.constexpr,
            SCALES_FP32: tl.constexpr, V_ROPE_DIMS: tl.constexpr, K_EXTRA_DIMS: tl.constexpr, INTERPRETED: tl.constexpr):  # fmt: skip
    """One block of records (``_gather``'s bytes) folded into the online softmax state (m, l, acc)."""
    kv = _dequantize(raw, scale, rope, BLOCK_N, D_V, QUANT_DIMS, SCALE_TILE, SCALES_FP32, V_ROPE_DIMS, INTERPRETED)
    scores = dot(q_main, tl.trans(kv), None, INTERPRETED)
    if K_EXTRA_DIMS > 0:
        scores = dot(q_extra, tl.trans(rope), scores, INTERPRETED)
    p, m_i, l_i, acc = online_softmax_step(scores, valid, m_i, l_i, acc, qk_scale_log2)
    acc = dot(to_storage(p, tl.bfloat16, INTERPRETED), kv, acc, INTERPRETED)
    return m_i, l_i, acc


@triton.jit
def _block_ids(idx_row, block, split, num_pos, BLOCK_N: tl.constexpr, NUM_SPLITS: tl.constexpr):
    """Token ids [BLOCK_N] of block ``block`` of split ``split`` (-1 past the row's length)."""
    jb = block * BLOCK_N + tl.arange(0, BLOCK_N)
    return tl.load(idx_row + jb * NUM_SPLITS, mask=split + jb * NUM_SPLITS < num_pos, other=-1)


@triton.jit
def _finish(o, lse2, empty, sink_ptr, heads, cols, out_ptrs, lse_ptrs, write_lse, HAS_SINK: tl.constexpr, INTERPRETED: tl.constexpr):
    """Store out = o (already divided by l; 0 for an empty row) times the sink factor
    1 / (1 + exp(sink - lse)), and, when ``write_lse``, lse in natural log (+inf for an empty row)."""
    lse2 = tl.where(empty, float("inf"), lse2)
    if HAS_SINK:
        # sink = -inf (no sink) gives exp2(-inf) = 0, factor 1. An empty row keeps factor 1 by
        # selection, not arithmetic: a finite sink above FLT_MAX / log2(e) (about 2.4e38) makes
        # sink2 +inf, and +inf - lse2 (+inf) is NaN, which 0 * NaN would carry into out.
        sink2 = tl.load(sink_ptr + heads) * _LOG2_E
        factor = 1.0 / (1.0 + tl.exp2(sink2 - lse2))
        o = o * tl.where(empty, 1.0, factor)[:, None]
    tl.store(out_ptrs, to_storage(o, out_ptrs.dtype.element_ty, INTERPRETED))
    if write_lse:
        tl.store(lse_ptrs, lse2 * _LN_2)


@triton.jit
def _combine_cols(unit, col0, part_out_ptr, part_lse_ptr, sink_ptr, heads, out_row, lse_row, stride_o_h, stride_l_h, write_lse,
                  NUM_SPLITS: tl.constexpr, BLOCK_H: tl.constexpr, D_V: tl.constexpr, SLICE: tl.constexpr,
                  HAS_SINK: tl.constexpr, INTERPRETED: tl.constexpr):  # fmt: skip
    """Merge the NUM_SPLITS partials of ``unit`` (a token's head block) for value columns [col0, col0 + SLICE).

    Partial s: out_s = acc_s / l_s and lse2_s = m_s + log2 l_s (-inf for a split without valid
    slots). Weights 2^(lse2_s - max) with 0 as the reference when every split is empty (weights
    0, output 0, never NaN). Loads go through L2 (.cg): other SMs wrote the partials during this
    launch (MODE_BARRIER, MODE_LAST).
    """
    splits = tl.arange(0, NUM_SPLITS)
    rows = tl.arange(0, BLOCK_H)
    cols = col0 + tl.arange(0, SLICE)
    part = (unit * NUM_SPLITS + splits).to(tl.int64)
    lse_s = tl.load(part_lse_ptr + part[:, None] * BLOCK_H + rows[None, :], cache_modifier=".cg")  # [S, H]
    lse_max = tl.max(lse_s, axis=0)
    ref = tl.where(lse_max == float("-inf"), 0.0, lse_max)
    weight = tl.exp2(lse_s - ref[None, :])
    total = tl.sum(weight, axis=0)  # [H]
    empty = total == 0.0
    o_s = tl.load(part_out_ptr + (part[:, None, None] * BLOCK_H + rows[None, :, None]) * D_V + cols[None, None, :], cache_modifier=".cg")
    o = tl.sum(o_s.to(tl.float32) * weight[:, :, None], axis=0) / tl.where(empty, 1.0, total)[:, None]
    lse2 = ref + tl.log2(tl.where(empty, 1.0, total))
    _finish(o, lse2, empty, sink_ptr, heads, cols, out_row + heads[:, None] * stride_o_h + cols[None, :], lse_row + heads * stride_l_h,
            write_lse, HAS_SINK, INTERPRETED)


@triton.jit
def _decode_kernel(
    q_ptr, cache_ptr, idx_ptr, topk_length_ptr, sink_ptr, out_ptr, lse_ptr, part_out_ptr, part_lse_ptr, ticket_ptr,
    qk_scale_log2, page_stride,
    stride_q_b, stride_q_s, stride_q_h, stride_i_b, stride_i_s,
    stride_o_b, stride_o_s, stride_o_h, stride_l_b, stride_l_s, stride_l_h,
    S_Q: tl.constexpr, TOPK: tl.constexpr, D_V: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
    NUM_SPLITS: tl.constexpr, SPLIT_SCAN: tl.constexpr, MODE: tl.constexpr, L2_PREFETCH: tl.constexpr,
    HAS_TOPK_LENGTH: tl.constexpr, HAS_SINK: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, QUANT_DIMS: tl.constexpr, SCALE_TILE: tl.constexpr, NUM_SCALES: tl.constexpr,
    SCALES_FP32: tl.constexpr, V_ROPE_DIMS: tl.constexpr, K_EXTRA_DIMS: tl.constexpr, DATA_SLOT_BYTES: tl.constexpr,
    SCALE_BASE: tl.constexpr, SCALE_SLOT_BYTES: tl.constexpr, ROPE_OFFSET: tl.constexpr, DATA_SPAN_BYTES: tl.constexpr,
    SCALES_IN_SPAN: tl.constexpr, PREFETCH_POINTS: tl.constexpr,
    TICKET_STRIDE: tl.constexpr, TICKETS_PER_CALL: tl.constexpr, INTERPRETED: tl.constexpr,
):  # fmt: skip
    """Grid (h_q / BLOCK_H, NUM_SPLITS, b * s_q); see the module docstring."""
    SPLIT_LEN: tl.constexpr = (TOPK + NUM_SPLITS - 1) // NUM_SPLITS  # positions of split 0 (others: at most this)
    tl.static_assert(BLOCK_N <= SPLIT_LEN, "a block larger than its split would read other splits' slots")
    tl.static_assert(SPLIT_SCAN >= SPLIT_LEN, "the bound scan covers the split")
    tl.static_assert(D_V % NUM_SPLITS == 0, "each split combines one equal slice of the value columns")
    tl.static_assert(TICKETS_PER_CALL % NUM_SPLITS == 0, "every call advances a ticket word by TICKETS_PER_CALL")
    hb = tl.program_id(0)
    split = tl.program_id(1)
    t = tl.program_id(2)
    num_hb = tl.num_programs(0)
    bi = t // S_Q
    qi = t % S_Q

    heads = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    dv = tl.arange(0, D_V)
    q_rows = q_ptr + bi * stride_q_b + qi * stride_q_s + heads[:, None] * stride_q_h
    q_main = tl.load(q_rows + dv[None, :])
    if K_EXTRA_DIMS > 0:
        q_extra = tl.load(q_rows + D_V + tl.arange(0, K_EXTRA_DIMS)[None, :])
    else:
        q_extra = q_main  # unused

    # Positions split, split + S, ... below the row's length; the loop stops after the block
    # holding the split's last valid slot (short rows and tail padding cost nothing).
    idx_row = idx_ptr + bi * stride_i_b + qi * stride_i_s + split
    if HAS_TOPK_LENGTH:
        num_pos = tl.minimum(tl.load(topk_length_ptr + bi), TOPK)
    else:
        num_pos = TOPK
    j = tl.arange(0, SPLIT_SCAN)
    ids = tl.load(idx_row + j * NUM_SPLITS, mask=split + j * NUM_SPLITS < num_pos, other=-1)
    last = tl.max(tl.where(ids >= 0, j + 1, 0), axis=0)

    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, D_V], tl.float32)
    # L2_PREFETCH: block b + 1's records are prefetched into L2 before block b is gathered, so a
    # gather waits for L2, not DRAM. The ids are L1/L2 hits: the bound scan above read them all.
    for block in range(tl.cdiv(last, BLOCK_N)):
        if L2_PREFETCH and not INTERPRETED:
            tok_next = _block_ids(idx_row, block + 1, split, num_pos, BLOCK_N, NUM_SPLITS)
            valid_next = tok_next >= 0
            data_next, scale_next, _ = _record_rows(cache_ptr, tok_next, valid_next, page_stride, BLOCK_SIZE, DATA_SLOT_BYTES,
                                                    SCALE_BASE, SCALE_SLOT_BYTES, ROPE_OFFSET)
            _prefetch_l2(data_next, scale_next, valid_next, DATA_SPAN_BYTES, SCALES_IN_SPAN, PREFETCH_POINTS)
        tok = _block_ids(idx_row, block, split, num_pos, BLOCK_N, NUM_SPLITS)
        valid = tok >= 0
        data_row, scale_row, rope_row = _record_rows(cache_ptr, tok, valid, page_stride, BLOCK_SIZE, DATA_SLOT_BYTES, SCALE_BASE,
                                                     SCALE_SLOT_BYTES, ROPE_OFFSET)
        raw, scale, rope = _gather(data_row, scale_row, rope_row, valid, BLOCK_N, D_V, QUANT_DIMS, SCALE_TILE, NUM_SCALES,
                                   SCALES_FP32, V_ROPE_DIMS, K_EXTRA_DIMS)
        m_i, l_i, acc = _attend(q_main, q_extra, raw, scale, rope, valid, m_i, l_i, acc, qk_scale_log2, BLOCK_N, D_V, QUANT_DIMS,
                                SCALE_TILE, SCALES_FP32, V_ROPE_DIMS, K_EXTRA_DIMS, INTERPRETED)

    empty = l_i == 0.0
    o = acc / tl.where(empty, 1.0, l_i)[:, None]
    lse2 = m_i + tl.log2(tl.where(empty, 1.0, l_i))
    out_row = out_ptr + bi * stride_o_b + qi * stride_o_s
    lse_row = lse_ptr + bi * stride_l_b + qi * stride_l_s
    if MODE == 0:  # MODE_DIRECT
        _finish(o, lse2, empty, sink_ptr, heads, dv, out_row + heads[:, None] * stride_o_h + dv[None, :], lse_row + heads * stride_l_h,
                True, HAS_SINK, INTERPRETED)
    else:
        unit = t * num_hb + hb
        part = (unit * NUM_SPLITS + split).to(tl.int64)
        rows = tl.arange(0, BLOCK_H)
        part_rows = part_out_ptr + (part * BLOCK_H + rows[:, None]) * D_V
        tl.store(part_rows + dv[None, :], to_storage(o, part_out_ptr.dtype.element_ty, INTERPRETED))
        tl.store(part_lse_ptr + part * BLOCK_H + rows, tl.where(empty, float("-inf"), lse2))
        if MODE >= 2:  # MODE_BARRIER, MODE_LAST: arrive at the unit's ticket word
            SLICE: tl.constexpr = D_V // NUM_SPLITS
            STEP: tl.constexpr = TICKETS_PER_CALL // NUM_SPLITS
            word = ticket_ptr + unit * TICKET_STRIDE
            tl.debug_barrier()  # every thread's partial stores precede the (release) arrival
            old = tl.atomic_add(word, STEP, sem="acq_rel")
            end = (old & -TICKETS_PER_CALL) + TICKETS_PER_CALL
            if MODE == 2:
                if old + STEP != end:
                    # an acquiring read at GPU scope (Triton lowers this add of 0 to ld.acquire.gpu)
                    seen = tl.atomic_add(word, 0, sem="acquire")
                    while seen != end:
                        seen = tl.atomic_add(word, 0, sem="acquire")
                tl.debug_barrier()
                _combine_cols(unit, split * SLICE, part_out_ptr, part_lse_ptr, sink_ptr, heads, out_row, lse_row, stride_o_h, stride_l_h,
                              split == 0, NUM_SPLITS, BLOCK_H, D_V, SLICE, HAS_SINK, INTERPRETED)
            else:
                if old + STEP == end:
                    tl.debug_barrier()
                    for c in range(NUM_SPLITS):
                        _combine_cols(unit, c * SLICE, part_out_ptr, part_lse_ptr, sink_ptr, heads, out_row, lse_row, stride_o_h,
                                      stride_l_h, c == 0, NUM_SPLITS, BLOCK_H, D_V, SLICE, HAS_SINK, INTERPRETED)


@triton.jit
def _combine_kernel(
    part_out_ptr, part_lse_ptr, sink_ptr, out_ptr, lse_ptr,
    stride_o_b, stride_o_s, stride_o_h, stride_l_b, stride_l_s, stride_l_h,
    S_Q: tl.constexpr, BLOCK_H: tl.constexpr, D_V: tl.constexpr, NUM_SPLITS: tl.constexpr, SLICE: tl.constexpr,
    HAS_SINK: tl.constexpr, INTERPRETED: tl.constexpr,
):  # fmt: skip
    """Second launch of the two-launch path. Grid (D_V / SLICE, h_q / BLOCK_H, b * s_q): program
    (c, hb, t) combines value columns [c * SLICE, (c + 1) * SLICE) of token t's head block hb
    (SLICE chosen by the host so a program holds a bounded number of partial elements)."""
    tl.static_assert(D_V % SLICE == 0, "the slices tile the value columns")
    c = tl.program_id(0)
    hb = tl.program_id(1)
    t = tl.program_id(2)
    bi = t // S_Q
    qi = t % S_Q
    heads = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    _combine_cols(t * tl.num_programs(1) + hb, c * SLICE, part_out_ptr, part_lse_ptr, sink_ptr, heads,
                  out_ptr + bi * stride_o_b + qi * stride_o_s, lse_ptr + bi * stride_l_b + qi * stride_l_s, stride_o_h, stride_l_h,
                  c == 0, NUM_SPLITS, BLOCK_H, D_V, SLICE, HAS_SINK, INTERPRETED)
