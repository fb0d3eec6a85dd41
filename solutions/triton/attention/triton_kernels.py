"""Triton kernels of the sparse attention: the solution's path under the Triton interpreter.

They run under ``TRITON_INTERPRET=1`` on CPU tensors, where the CUDA kernel cannot; on a GPU the
CUDA kernel runs (``cuda.py``) and ``launch`` refuses. They have the numerics of the CUDA
kernel (log2-domain online softmax with the scale pre-multiplied by log2 e, fp32 accumulation,
the q_nope·ckv and q_pe·kpe products as two separate ``tl.dot``, P rounded to bf16 for the P·V
product), in two paths (``policy.interpreter_plan`` picks one):

* ``dsplit`` (the brief's short path, T <= policy.DSPLIT_MAX_TOKENS_INTERPRETER): one launch, grid
  (value slices, T). Every program scores all of its token's slots but multiplies by V only for
  its own slice of the 512 value columns, so no combine is needed. Loops stop after the row's
  last valid slot.
* ``two_launch``: grid (splits S, T). Split s owns the slots s, s + S, s + 2S, ... (strided,
  because valid slots cluster at the front of a row) and writes a partial (m, l, acc); a second
  launch, the combine kernel, merges value slice s of each token from its S partials. (The
  interpreter runs programs one after another, so no program may wait for another: the combine
  cannot share the launch.)
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..common.interpreter import interpreted
from ..common.triton_math import dot as _dot
from ..common.triton_math import online_softmax_step as _online_softmax_step
from ..common.triton_math import to_storage as _to_storage
from .policy import Plan
from .shapes import D_CKV, D_KPE, LOG2_E, NUM_HEADS, PAGE_SIZE, TOPK

# --------------------------------------------------------------------------- device code


@triton.jit
def _gather_rows(cache_ptr, tok, stride_page, stride_slot, PAGE_SIZE: tl.constexpr):
    """Row pointers [BLOCK_N] of physical token ids ``tok`` (page * PAGE_SIZE + slot), in int64."""
    tok = tok.to(tl.int64)
    return cache_ptr + (tok // PAGE_SIZE) * stride_page + (tok % PAGE_SIZE) * stride_slot


@triton.jit
def _block_logits(
    q_nope, q_pe, ckv_ptr, kpe_ptr, idx_ptrs,
    stride_ckv_page, stride_ckv_slot, stride_kpe_page, stride_kpe_slot,
    D_CKV: tl.constexpr, D_KPE: tl.constexpr, PAGE_SIZE: tl.constexpr, INTERPRETED: tl.constexpr,
):
    """Gathers one block of slots (their index addresses ``idx_ptrs`` [BLOCK_N]) and returns the
    raw logits q·k [H, BLOCK_N], the slots' validity, the ckv row pointers and the gathered ckv
    rows [BLOCK_N, D_CKV]."""
    tok = tl.load(idx_ptrs)
    valid = tok >= 0
    ckv_rows = _gather_rows(ckv_ptr, tl.where(valid, tok, 0), stride_ckv_page, stride_ckv_slot, PAGE_SIZE)
    kpe_rows = _gather_rows(kpe_ptr, tl.where(valid, tok, 0), stride_kpe_page, stride_kpe_slot, PAGE_SIZE)
    # Masked loads: cache bytes no valid index points at (NaN on purpose) are never read.
    k_nope = tl.load(ckv_rows[:, None] + tl.arange(0, D_CKV)[None, :], mask=valid[:, None], other=0.0)
    k_pe = tl.load(kpe_rows[:, None] + tl.arange(0, D_KPE)[None, :], mask=valid[:, None], other=0.0)
    scores = _dot(q_nope, tl.trans(k_nope), None, INTERPRETED)
    scores = _dot(q_pe, tl.trans(k_pe), scores, INTERPRETED)
    return scores, valid, ckv_rows, k_nope


@triton.jit
def _attend_block(
    q_nope, q_pe, ckv_ptr, kpe_ptr, idx_ptrs, acc, m_i, l_i, qk_scale_log2,
    stride_ckv_page, stride_ckv_slot, stride_kpe_page, stride_kpe_slot,
    D_CKV: tl.constexpr, D_KPE: tl.constexpr, PAGE_SIZE: tl.constexpr, INTERPRETED: tl.constexpr,
):
    """One block of slots (their index addresses ``idx_ptrs`` [BLOCK_N]) folded into (acc, m, l)."""
    scores, valid, ckv_rows, k_nope = _block_logits(
        q_nope, q_pe, ckv_ptr, kpe_ptr, idx_ptrs, stride_ckv_page, stride_ckv_slot, stride_kpe_page, stride_kpe_slot,
        D_CKV, D_KPE, PAGE_SIZE, INTERPRETED,
    )
    p, m_i, l_i, acc = _online_softmax_step(scores, valid, m_i, l_i, acc, qk_scale_log2)
    acc = _dot(_to_storage(p, k_nope.dtype, INTERPRETED), k_nope, acc, INTERPRETED)  # the ckv rows are also V
    return acc, m_i, l_i


@triton.jit
def _store_slice(
    acc, m, l, t, d_slice, heads, slice_cols, out_ptr, lse_ptr, stride_out_t, stride_out_h, stride_lse_t, INTERPRETED: tl.constexpr,
):
    """Writes output[t, :, slice_cols] = acc / l (0 where l == 0) and, from slice 0 only,
    lse[t] = m + log2 l (-inf where l == 0: a token without valid slots)."""
    empty = l == 0.0
    out = acc / tl.where(empty, 1.0, l)[:, None]
    tl.store(
        out_ptr + t * stride_out_t + heads[:, None] * stride_out_h + slice_cols[None, :],
        _to_storage(out, out_ptr.dtype.element_ty, INTERPRETED),
    )
    lse = tl.where(empty, float("-inf"), m + tl.log2(tl.where(empty, 1.0, l)))
    if d_slice == 0:
        tl.store(lse_ptr + t * stride_lse_t + heads, lse)


@triton.jit
def _dsplit_kernel(
    q_nope_ptr,
    q_pe_ptr,
    ckv_ptr,
    kpe_ptr,
    idx_ptr,
    out_ptr,
    lse_ptr,
    qk_scale_log2,
    stride_qn_t,
    stride_qn_h,
    stride_qp_t,
    stride_qp_h,
    stride_ckv_page,
    stride_ckv_slot,
    stride_kpe_page,
    stride_kpe_slot,
    stride_idx_t,
    stride_out_t,
    stride_out_h,
    stride_lse_t,
    H: tl.constexpr,
    D_CKV: tl.constexpr,
    D_KPE: tl.constexpr,
    TOPK: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    SLICE_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    INTERPRETED: tl.constexpr,
):
    """Grid (D_CKV // SLICE_D, T): program (d, t) writes output[t, :, d*SLICE_D:(d+1)*SLICE_D]
    (and lse[t] when d == 0) from all of token t's slots, without any partial results."""
    tl.static_assert(D_CKV % SLICE_D == 0, "value slices must tile the 512 columns")
    tl.static_assert(SLICE_D >= 16, "tl.dot needs N >= 16")
    tl.static_assert(TOPK % BLOCK_N == 0, "blocks must tile the 2048 slots")
    d_slice = tl.program_id(0)
    t = tl.program_id(1)

    heads = tl.arange(0, H)
    cols = tl.arange(0, D_CKV)
    cols_pe = tl.arange(0, D_KPE)
    slice_cols = d_slice * SLICE_D + tl.arange(0, SLICE_D)
    idx_row = idx_ptr + t * stride_idx_t

    # Loop bound: the block holding the row's last valid slot (tail padding: the valid count).
    pos = tl.arange(0, TOPK)
    last = tl.max(tl.where(tl.load(idx_row + pos) >= 0, pos + 1, 0), axis=0)
    num_blocks = tl.cdiv(last, BLOCK_N)

    q_nope = tl.load(q_nope_ptr + t * stride_qn_t + heads[:, None] * stride_qn_h + cols[None, :])
    q_pe = tl.load(q_pe_ptr + t * stride_qp_t + heads[:, None] * stride_qp_h + cols_pe[None, :])

    m_i = tl.full([H], float("-inf"), tl.float32)
    l_i = tl.zeros([H], tl.float32)
    acc = tl.zeros([H, SLICE_D], tl.float32)
    for block in range(num_blocks):
        slots = block * BLOCK_N + tl.arange(0, BLOCK_N)
        scores, valid, ckv_rows, _ = _block_logits(
            q_nope,
            q_pe,
            ckv_ptr,
            kpe_ptr,
            idx_row + slots,
            stride_ckv_page,
            stride_ckv_slot,
            stride_kpe_page,
            stride_kpe_slot,
            D_CKV,
            D_KPE,
            PAGE_SIZE,
            INTERPRETED,
        )
        p, m_i, l_i, acc = _online_softmax_step(scores, valid, m_i, l_i, acc, qk_scale_log2)
        # Only this program's value columns (an L1 hit: the same rows were just loaded).
        v = tl.load(ckv_rows[:, None] + slice_cols[None, :], mask=valid[:, None], other=0.0)
        acc = _dot(_to_storage(p, v.dtype, INTERPRETED), v, acc, INTERPRETED)

    _store_slice(acc, m_i, l_i, t, d_slice, heads, slice_cols, out_ptr, lse_ptr, stride_out_t, stride_out_h, stride_lse_t, INTERPRETED)


@triton.jit
def _combine_slice(
    t,
    d_slice,
    part_acc_ptr,
    part_ml_ptr,
    out_ptr,
    lse_ptr,
    stride_out_t,
    stride_out_h,
    stride_lse_t,
    H: tl.constexpr,
    D_CKV: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    SLICE_D: tl.constexpr,
    INTERPRETED: tl.constexpr,
):
    """Merge the NUM_SPLITS partials of token t for value columns [d_slice*SLICE_D, +SLICE_D).

    Partials: part_ml[t, s, 0, h] = running max m (log2 domain), part_ml[t, s, 1, h] = sum l,
    part_acc[t, s, h, :] = sum of p·v relative to m. Empty splits have m = -inf, l = 0, acc = 0.
    Loads use .cg (L2) because the partials were written by other SMs during this launch.
    """
    splits = tl.arange(0, NUM_SPLITS)
    heads = tl.arange(0, H)
    slice_cols = d_slice * SLICE_D + tl.arange(0, SLICE_D)
    part = t * NUM_SPLITS + splits  # [S]
    ml = part_ml_ptr + part[:, None] * (2 * H) + heads[None, :]
    m = tl.load(ml, cache_modifier=".cg")  # [S, H]
    l = tl.load(ml + H, cache_modifier=".cg")  # [S, H]
    m_max = tl.max(m, axis=0)  # [H]
    m_ref = tl.where(m_max == float("-inf"), 0.0, m_max)
    weight = tl.exp2(m - m_ref[None, :])  # 0 for empty splits, never NaN
    l_tot = tl.sum(weight * l, axis=0)  # [H]
    acc_ptrs = part_acc_ptr + (part[:, None, None] * H + heads[None, :, None]) * D_CKV + slice_cols[None, None, :]
    acc = tl.load(acc_ptrs, cache_modifier=".cg").to(tl.float32)  # [S, H, SLICE_D]
    acc = tl.sum(acc * weight[:, :, None], axis=0)  # [H, SLICE_D]
    _store_slice(acc, m_ref, l_tot, t, d_slice, heads, slice_cols, out_ptr, lse_ptr, stride_out_t, stride_out_h, stride_lse_t, INTERPRETED)


@triton.jit
def _split_kernel(
    q_nope_ptr,
    q_pe_ptr,
    ckv_ptr,
    kpe_ptr,
    idx_ptr,
    out_ptr,
    lse_ptr,
    part_acc_ptr,
    part_ml_ptr,
    qk_scale_log2,
    stride_qn_t,
    stride_qn_h,
    stride_qp_t,
    stride_qp_h,
    stride_ckv_page,
    stride_ckv_slot,
    stride_kpe_page,
    stride_kpe_slot,
    stride_idx_t,
    stride_out_t,
    stride_out_h,
    stride_lse_t,
    H: tl.constexpr,
    D_CKV: tl.constexpr,
    D_KPE: tl.constexpr,
    TOPK: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    INTERPRETED: tl.constexpr,
):
    """Grid (NUM_SPLITS, T): program (s, t) attends token t over slots s, s+S, s+2S, ... and
    writes its partial (m, l, acc); the combine kernel merges them."""
    SPLIT_SIZE: tl.constexpr = TOPK // NUM_SPLITS
    tl.static_assert(TOPK % NUM_SPLITS == 0, "splits must tile the 2048 slots")
    tl.static_assert(BLOCK_N <= SPLIT_SIZE, "a block larger than its split would read other splits' slots")
    tl.static_assert(SPLIT_SIZE % BLOCK_N == 0, "blocks must tile a split exactly")
    tl.static_assert(D_CKV % NUM_SPLITS == 0, "each split combines one equal slice of the value columns")
    s = tl.program_id(0)
    t = tl.program_id(1)

    heads = tl.arange(0, H)
    cols = tl.arange(0, D_CKV)
    cols_pe = tl.arange(0, D_KPE)
    idx_row = idx_ptr + t * stride_idx_t + s  # slot j of this split sits at idx_row[j * NUM_SPLITS]

    q_nope = tl.load(q_nope_ptr + t * stride_qn_t + heads[:, None] * stride_qn_h + cols[None, :])
    q_pe = tl.load(q_pe_ptr + t * stride_qp_t + heads[:, None] * stride_qp_h + cols_pe[None, :])

    m_i = tl.full([H], float("-inf"), tl.float32)
    l_i = tl.zeros([H], tl.float32)
    acc = tl.zeros([H, D_CKV], tl.float32)
    if SPLIT_SIZE == BLOCK_N:
        # The whole split is one block: no loop bound to compute, so the gather waits on one
        # index load instead of two (the bound's reduction, then the block's indices).
        acc, m_i, l_i = _attend_block(
            q_nope,
            q_pe,
            ckv_ptr,
            kpe_ptr,
            idx_row + tl.arange(0, BLOCK_N) * NUM_SPLITS,
            acc,
            m_i,
            l_i,
            qk_scale_log2,
            stride_ckv_page,
            stride_ckv_slot,
            stride_kpe_page,
            stride_kpe_slot,
            D_CKV,
            D_KPE,
            PAGE_SIZE,
            INTERPRETED,
        )
    else:
        # Loop bound: the block holding the split's last valid slot.
        j = tl.arange(0, SPLIT_SIZE)
        last = tl.max(tl.where(tl.load(idx_row + j * NUM_SPLITS) >= 0, j + 1, 0), axis=0)
        for block in range(tl.cdiv(last, BLOCK_N)):
            jb = block * BLOCK_N + tl.arange(0, BLOCK_N)  # < SPLIT_SIZE by the asserts above
            acc, m_i, l_i = _attend_block(
                q_nope,
                q_pe,
                ckv_ptr,
                kpe_ptr,
                idx_row + jb * NUM_SPLITS,
                acc,
                m_i,
                l_i,
                qk_scale_log2,
                stride_ckv_page,
                stride_ckv_slot,
                stride_kpe_page,
                stride_kpe_slot,
                D_CKV,
                D_KPE,
                PAGE_SIZE,
                INTERPRETED,
            )

    part = t * NUM_SPLITS + s
    tl.store(
        part_acc_ptr + (part * H + heads[:, None]) * D_CKV + cols[None, :], _to_storage(acc, part_acc_ptr.dtype.element_ty, INTERPRETED)
    )
    tl.store(part_ml_ptr + part * (2 * H) + heads, m_i)
    tl.store(part_ml_ptr + part * (2 * H) + H + heads, l_i)


@triton.jit
def _combine_kernel(
    part_acc_ptr,
    part_ml_ptr,
    out_ptr,
    lse_ptr,
    stride_out_t,
    stride_out_h,
    stride_lse_t,
    H: tl.constexpr,
    D_CKV: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    INTERPRETED: tl.constexpr,
):
    """Second launch of the two-launch path. Grid (NUM_SPLITS, T): program (d, t) combines
    value slice d of token t."""
    SLICE_D: tl.constexpr = D_CKV // NUM_SPLITS
    tl.static_assert(D_CKV % NUM_SPLITS == 0, "each program combines one equal slice of the value columns")
    _combine_slice(
        tl.program_id(1),
        tl.program_id(0),
        part_acc_ptr,
        part_ml_ptr,
        out_ptr,
        lse_ptr,
        stride_out_t,
        stride_out_h,
        stride_lse_t,
        H,
        D_CKV,
        NUM_SPLITS,
        SLICE_D,
        INTERPRETED,
    )


# --------------------------------------------------------------------------- host side

def launch(plan: Plan, q_nope, q_pe, ckv_cache, kpe_cache, sparse_indices, sm_scale, output, lse) -> None:
    """The Triton launches of ``plan`` (a validated ``dsplit`` or ``two_launch`` plan) for T >= 1
    tokens (shapes: shapes.py), under the interpreter only."""
    T = q_nope.shape[0]
    device = q_nope.device
    if not interpreted(device):
        raise ValueError(
            f"{plan}: the Triton kernels are this solution's interpreter path (TRITON_INTERPRET=1, CPU tensors); "
            "on a GPU the CUDA kernel runs (paths cuda, cuda_two_launch, cuda_cluster)"
        )
    qk_scale_log2 = float(sm_scale) * LOG2_E
    common_strides = (
        q_nope.stride(0),
        q_nope.stride(1),
        q_pe.stride(0),
        q_pe.stride(1),
        ckv_cache.stride(0),
        ckv_cache.stride(1),
        kpe_cache.stride(0),
        kpe_cache.stride(1),
        sparse_indices.stride(0),
        output.stride(0),
        output.stride(1),
        lse.stride(0),
    )
    shape_consts = {"H": NUM_HEADS, "D_CKV": D_CKV, "D_KPE": D_KPE, "TOPK": TOPK, "PAGE_SIZE": PAGE_SIZE, "INTERPRETED": True}
    options = {"num_warps": plan.num_warps, "num_stages": plan.num_stages}

    if plan.path == "dsplit":
        _dsplit_kernel[(plan.splits, T)](
            q_nope,
            q_pe,
            ckv_cache,
            kpe_cache,
            sparse_indices,
            output,
            lse,
            qk_scale_log2,
            *common_strides,
            **shape_consts,
            SLICE_D=D_CKV // plan.splits,
            BLOCK_N=plan.block_n,
            **options,
        )
        return

    # Partials are allocated per call (the caching allocator makes that a host-side lookup).
    part_acc = torch.empty(T * plan.splits * NUM_HEADS * D_CKV, dtype=plan.partial_dtype, device=device)
    part_ml = torch.empty(T * plan.splits * 2 * NUM_HEADS, dtype=torch.float32, device=device)
    grid = (plan.splits, T)
    _split_kernel[grid](
        q_nope,
        q_pe,
        ckv_cache,
        kpe_cache,
        sparse_indices,
        output,
        lse,
        part_acc,
        part_ml,
        qk_scale_log2,
        *common_strides,
        **shape_consts,
        NUM_SPLITS=plan.splits,
        BLOCK_N=plan.block_n,
        **options,
    )
    _combine_kernel[grid](
        part_acc,
        part_ml,
        output,
        lse,
        output.stride(0),
        output.stride(1),
        lse.stride(0),
        H=NUM_HEADS,
        D_CKV=D_CKV,
        NUM_SPLITS=plan.splits,
        INTERPRETED=True,
        num_warps=plan.num_warps,
    )
