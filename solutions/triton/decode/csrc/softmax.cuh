// The online softmax on accumulator fragments (rows r0 and r0 + 8, records 8j + 2 quad + {0, 1}:
// the layout of both wgmma's and mma.sync's accumulators), in the log2 domain.
#pragma once

#include "config.cuh"

namespace dsa_decode {
namespace {

// S times the softmax scale (log2 domain) plus each record's bias (0, or -inf for an invalid id;
// `bias` is the tile's first scored record's), and the rows' maxima over the quad. Fragment j of
// S: records 8j + 2 quad + {0, 1} from the first, rows r0 and r0 + 8.
template <int kRegs>
__device__ __forceinline__ void scale_and_row_max(float (&s)[kRegs], const float* bias, int quad, float scale_log2,
                                                  float& max0, float& max1) {
  max0 = neg_inf(), max1 = neg_inf();
#pragma unroll
  for (int j = 0; j < kRegs / 4; ++j) {
    const int token = 8 * j + 2 * quad;
    const float b0 = bias[token], b1 = bias[token + 1];
    s[4 * j + 0] = fmaf(s[4 * j + 0], scale_log2, b0);
    s[4 * j + 1] = fmaf(s[4 * j + 1], scale_log2, b1);
    s[4 * j + 2] = fmaf(s[4 * j + 2], scale_log2, b0);
    s[4 * j + 3] = fmaf(s[4 * j + 3], scale_log2, b1);
    max0 = fmaxf(max0, fmaxf(s[4 * j + 0], s[4 * j + 1]));
    max1 = fmaxf(max1, fmaxf(s[4 * j + 2], s[4 * j + 3]));
  }
#pragma unroll
  for (int x = 1; x < 4; x *= 2) {
    max0 = fmaxf(max0, __shfl_xor_sync(0xffffffffu, max0, x));
    max1 = fmaxf(max1, __shfl_xor_sync(0xffffffffu, max1, x));
  }
}

// One online-softmax step of a row: the new running max from the tile's, the reference its P is
// taken against (a row that has seen no valid record keeps -inf as its max and 0 as its
// reference) and the factor for the old O and l.
__device__ __forceinline__ void softmax_step(float& m_run, float tile_max, float& ref, float& alpha) {
  const float next = fmaxf(m_run, tile_max);
  ref = next == neg_inf() ? 0.0f : next;
  alpha = fast_exp2(m_run - ref);
  m_run = next;
}

// Records 8j + 2 quad + {0, 1} of S's fragment j: P = 2^(S - ref) of rows r0 (.x) and r0 + 8 (.y)
// as bf16 pairs, the rows' sums of P grown by them.
template <int kRegs>
__device__ __forceinline__ uint2 softmax_p_pairs(const float (&s)[kRegs], int j, float ref0, float ref1, float& sum0,
                                                 float& sum1) {
  const float p0 = fast_exp2(s[4 * j + 0] - ref0), p1 = fast_exp2(s[4 * j + 1] - ref0);
  const float p2 = fast_exp2(s[4 * j + 2] - ref1), p3 = fast_exp2(s[4 * j + 3] - ref1);
  sum0 += p0 + p1;
  sum1 += p2 + p3;
  const __nv_bfloat162 top = __floats2bfloat162_rn(p0, p1), bottom = __floats2bfloat162_rn(p2, p3);
  return make_uint2(*reinterpret_cast<const uint32_t*>(&top), *reinterpret_cast<const uint32_t*>(&bottom));
}

}  // namespace
}  // namespace dsa_decode
