"""Triton device helpers shared by the attention-like kernels (sparse attention, MLA decode).

They hold the numerics both families share: bf16 products with fp32 accumulation, fp32 -> bf16
rounding to nearest even, and one block of the log2-domain online softmax. Each takes an
``INTERPRETED`` constexpr where Triton's interpreter needs a work-around; compiled code is the
plain form.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def dot(a, b, acc, INTERPRETED: tl.constexpr):
    """``a @ b + acc`` with bf16 operands and fp32 accumulation.

    Under the interpreter the operands go to fp32 first: Triton 3.9's interpreter multiplies the
    raw uint16 bit patterns of bf16 operands. bf16 -> fp32 is exact and every bf16 product is
    exact in fp32, so this is what the tensor cores compute (up to the order of additions).
    """
    if INTERPRETED:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc=acc, input_precision="ieee")
    else:
        return tl.dot(a, b, acc=acc)


@triton.jit
def to_storage(x, dtype: tl.constexpr, INTERPRETED: tl.constexpr):
    """fp32 ``x`` converted to ``dtype``, bf16 rounded to nearest even as the GPU's cvt.rn does.

    Triton 3.9's interpreter truncates fp32 -> bf16 (and its explicit "rtne" mode loses the
    carry into the exponent), which biases every rounded probability downwards; there the
    rounding is done on the bits (finite values; inf stays inf).
    """
    if INTERPRETED and dtype == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        return bits.to(tl.float32, bitcast=True).to(dtype)
    else:
        return x.to(dtype)


@triton.jit
def online_softmax_step(scores, valid, m_i, l_i, acc, qk_scale_log2):
    """One block of the log2-domain online softmax.

    ``scores`` [H, BLOCK_N] are raw q·k products; invalid slots become -inf. Returns the
    probabilities ``p`` (to multiply with V), the new running max and sum, and ``acc`` rescaled
    to the new max. A row whose max is still -inf uses 0 as its reference so that -inf - -inf
    never happens: its alpha and p are exp2(-inf) = 0.
    """
    scores = tl.where(valid[None, :], scores * qk_scale_log2, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(scores, axis=1))
    m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_ref)
    p = tl.exp2(scores - m_ref[:, None])
    l_new = l_i * alpha + tl.sum(p, axis=1)
    return p, m_new, l_new, acc * alpha[:, None]
