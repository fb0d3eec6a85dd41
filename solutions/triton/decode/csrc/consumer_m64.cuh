// The consumer warpgroups of the 64-head kernel (wgmma at M = 64) in their two schedules (Role,
// config.cuh), and their epilogue (the output, or a split's partial).
#pragma once

#include "instructions.cuh"
#include "producer.cuh"  // Row
#include "softmax.cuh"

namespace dsa_decode {
namespace {

// S [64 heads, kRecords] = Q K^T over the tile's d_qk (kAtoms atoms), Q and K (records from
// k_base) K-major in shared memory: chained wgmma m64n32k16 or m64n64k16, completed on return.
template <int kAtoms, int kRecords>
__device__ __forceinline__ void score_tile(float (&s)[kRecords / 2], uint32_t q_base, uint32_t k_base) {
  static_assert(kRecords == 32 || kRecords == 64, "wgmma m64n32 or m64n64");
#pragma unroll
  for (int j = 0; j < kRecords / 2; ++j) s[j] = 0.0f;
  fence_registers(s);
  wgmma_fence();
#pragma unroll
  for (int atom = 0; atom < kAtoms; ++atom) {
#pragma unroll
    for (int k = 0; k < kAtomCols / kMmaK; ++k) {
      const uint32_t offset = atom * kAtomBytes + k * kMmaK * 2;
      if constexpr (kRecords == 32) {
        wgmma_m64n32k16(s, kmajor_desc(q_base + offset), kmajor_desc(k_base + offset), atom + k > 0);
      } else {
        wgmma_m64n64k16(s, kmajor_desc(q_base + offset), kmajor_desc(k_base + offset), atom + k > 0);
      }
    }
  }
  wgmma_commit();
  wgmma_wait_all();
  fence_registers(s);
}

// O's rows r0 and r0 + 8 times their factors.
__device__ __forceinline__ void rescale_rows(float (&acc)[kAccRegs], float alpha0, float alpha1) {
#pragma unroll
  for (int j = 0; j < kAccRegs / 4; ++j) {
    acc[4 * j + 0] *= alpha0;
    acc[4 * j + 1] *= alpha0;
    acc[4 * j + 2] *= alpha1;
    acc[4 * j + 3] *= alpha1;
  }
}

// O[:, 256m ..] += P V over one k-step (V's rows at v_addr): one m64n256 wgmma, or with kSplitPv
// two m64n128 over the column halves (a kernel launched at 128 registers a thread: two producer
// warpgroups, M64Roles). P from shared memory (p_desc) or, _rs, from the scorer's registers.
template <bool kSplitPv>
__device__ __forceinline__ void pv_step(float (&acc)[kAccRegs], uint64_t p_desc, uint32_t v_addr) {
  if constexpr (kSplitPv) {
    constexpr int kHalf = kAccRegs / 2;
    wgmma_m64n128k16(reinterpret_cast<float(&)[kHalf]>(acc[0]), p_desc, mnmajor_desc(v_addr));
    wgmma_m64n128k16(reinterpret_cast<float(&)[kHalf]>(acc[kHalf]), p_desc, mnmajor_desc(v_addr + kPvColAtoms / 2 * kAtomBytes));
  } else {
    wgmma_m64n256k16(acc, p_desc, mnmajor_desc(v_addr), 1);
  }
}
template <bool kSplitPv>
__device__ __forceinline__ void pv_step_rs(float (&acc)[kAccRegs], const uint32_t* pa, uint32_t v_addr) {
  if constexpr (kSplitPv) {
    constexpr int kHalf = kAccRegs / 2;
    wgmma_m64n128k16_rs(reinterpret_cast<float(&)[kHalf]>(acc[0]), pa[0], pa[1], pa[2], pa[3], mnmajor_desc(v_addr));
    wgmma_m64n128k16_rs(reinterpret_cast<float(&)[kHalf]>(acc[kHalf]), pa[0], pa[1], pa[2], pa[3],
                        mnmajor_desc(v_addr + kPvColAtoms / 2 * kAtomBytes));
  } else {
    wgmma_m64n256k16_rs(acc, pa[0], pa[1], pa[2], pa[3], mnmajor_desc(v_addr));
  }
}

// The consumer warpgroups (consumer thread mt, 0 .. kMathThreads - 1): attend the tiles in their
// Role (above), then write the output (or the split's partial).
template <int kFormat, Role kRole, bool kSplitPv>
__device__ __forceinline__ void consume(const DecodeArgs& a, const Row& row, Tiles<kFormat>& tiles, Small& sm, int mt) {
  using L = Layout<kFormat>;
  // Value columns 256m.. of O (halves: also records 32m.. of S).
  const int m = kRole == Role::kHalf ? mt / kWarpgroupThreads : kRole == Role::kScorer ? 0 : 1;
  const int lane = mt % kWarpSize;
  const int quad = lane % 4;
  // Accumulator fragment j: heads r0 and r0 + 8, value columns col0 + 8 j (+ 1).
  const Fragment frag = partial_fragment(mt, 0);
  const int r0 = frag.r0, r1 = r0 + 8;

  // Q [64 heads, d_qk] into its swizzled tile, by both consumer warpgroups.
  // Every load of a thread is issued before its first store: a loop of load-then-store waited
  // for DRAM once per chunk before the first tile could start.
  constexpr int kQChunks = L::kDqk / kChunkCols;
  constexpr int kQChunksPerThread = kHeadsPerProgram * kQChunks / kMathThreads;
  static_assert(kHeadsPerProgram * kQChunks % kMathThreads == 0, "Q's chunks split evenly over the consumers");
  const uint16_t* q_rows = a.q + row.bi * a.q_stride_b + row.si * a.q_stride_s +
                           static_cast<int64_t>(row.hb) * kHeadsPerProgram * a.q_stride_h;
  {
    uint4 q_chunks[kQChunksPerThread];
#pragma unroll
    for (int k = 0; k < kQChunksPerThread; ++k) {
      const int c = mt + k * kMathThreads;
      q_chunks[k] = __ldg(reinterpret_cast<const uint4*>(q_rows + (c / kQChunks) * a.q_stride_h + (c % kQChunks) * kChunkCols));
    }
#pragma unroll
    for (int k = 0; k < kQChunksPerThread; ++k) {
      const int c = mt + k * kMathThreads;
      *reinterpret_cast<uint4*>(tiles.q + swizzled(c / kQChunks, (c % kQChunks) * kChunkCols)) = q_chunks[k];
    }
  }
  fence_proxy_async();
  named_barrier(kMathBarrier, kMathThreads);

  float acc[kAccRegs];
#pragma unroll
  for (int i = 0; i < kAccRegs; ++i) acc[i] = 0.0f;
  float m_run0 = neg_inf(), m_run1 = neg_inf(), l_run0 = 0.0f, l_run1 = 0.0f;
  const uint32_t q_base = smem_addr(tiles.q);
  const uint32_t p_base = smem_addr(tiles.p);
  for (int i = 0; i < row.n_tiles; ++i) {
    const int stage = i % kStages;
    mbarrier_wait(&sm.full[stage], (i / kStages) & 1);
    const uint32_t kv_base = smem_addr(tiles.kv[stage]);
    const uint32_t v_base = kv_base + m * (kPvCols / kAtomCols) * kAtomBytes;  // V's columns 256m..
    if constexpr (kRole == Role::kHalf) {
      // S [64 heads, 32 records] = Q K^T for records 32m .. 32m + 31; the online softmax, log2 domain.
      float s[kLogitRegs];
      score_tile<L::kAtoms, kQkTokens>(s, q_base, kv_base + m * kQkTokens * kAtomRowBytes);
      float max0, max1;
      scale_and_row_max(s, &sm.bias[stage][m * kQkTokens], quad, a.scale_log2, max0, max1);
      if (quad == 0) {
        sm.row_max[m][r0] = max0;
        sm.row_max[m][r1] = max1;
      }
      // Barrier A: both halves' maxima are in (and, by program order, both warpgroups' P.V of the
      // previous tile has completed, so P may be overwritten below).
      named_barrier(kMathBarrier, kMathThreads);
      float ref0, ref1, alpha0, alpha1;
      softmax_step(m_run0, fmaxf(max0, sm.row_max[1 - m][r0]), ref0, alpha0);
      softmax_step(m_run1, fmaxf(max1, sm.row_max[1 - m][r1]), ref1, alpha1);
      float sum0 = 0.0f, sum1 = 0.0f;
#pragma unroll
      for (int j = 0; j < kLogitRegs / 4; ++j) {
        const uint2 pair = softmax_p_pairs(s, j, ref0, ref1, sum0, sum1);
        const int token = m * kQkTokens + 8 * j + 2 * quad;
        const int within = (token % kChunkCols) * 2;
        *reinterpret_cast<uint32_t*>(tiles.p + swizzled(r0, token) + within) = pair.x;
        *reinterpret_cast<uint32_t*>(tiles.p + swizzled(r1, token) + within) = pair.y;
      }
      l_run0 = l_run0 * alpha0 + sum0;
      l_run1 = l_run1 * alpha1 + sum1;
      fence_proxy_async();
      named_barrier(kMathBarrier, kMathThreads);  // barrier B: all of P is stored

      // O[:, 256m ..] = alpha O + P V.
      rescale_rows(acc, alpha0, alpha1);
      fence_registers(acc);
      wgmma_fence();
#pragma unroll
      for (int k = 0; k < kTileTokens / kMmaK; ++k)
        pv_step<kSplitPv>(acc, kmajor_desc(p_base + k * kMmaK * 2), v_base + k * kMmaK * kAtomRowBytes);
    } else if constexpr (kRole == Role::kScorer) {
      // S [64 heads, 64 records] = Q K^T; the online softmax, log2 domain.
      float s[kScorerLogitRegs];
      score_tile<L::kAtoms, kTileTokens>(s, q_base, kv_base);
      float max0, max1;
      scale_and_row_max(s, sm.bias[stage], quad, a.scale_log2, max0, max1);
      float ref0, ref1, alpha0, alpha1;
      softmax_step(m_run0, max0, ref0, alpha0);
      softmax_step(m_run1, max1, ref1, alpha1);
      // P as bf16 pairs in the A-fragment order of wgmma: pair 2j heads r0, pair 2j + 1 heads r1.
      uint32_t pa[kPRegs];
      float sum0 = 0.0f, sum1 = 0.0f;
#pragma unroll
      for (int j = 0; j < kScorerLogitRegs / 4; ++j) {
        const uint2 pair = softmax_p_pairs(s, j, ref0, ref1, sum0, sum1);
        pa[2 * j] = pair.x;
        pa[2 * j + 1] = pair.y;
      }
      l_run0 = l_run0 * alpha0 + sum0;
      l_run1 = l_run1 * alpha1 + sum1;
      // P and the rescale factors to warpgroup 2, once it has read the previous tile's: one
      // stmatrix per k-step stores its four 8x8 blocks (heads r0.. and r0 + 8.., records 16k.. and
      // 16k + 8..), lane l giving the address of row l % 8 of block l / 8.
      if (i > 0) named_barrier(kPFreeBarrier, kMathThreads);
#pragma unroll
      for (int k = 0; k < kTileTokens / kMmaK; ++k) {
        const int block = lane / 8;
        const int head = 16 * (mt / kWarpSize) + 8 * (block % 2) + lane % 8;
        stmatrix_x4(p_base + swizzled(head, k * kMmaK + kChunkCols * (block / 2)), pa[4 * k], pa[4 * k + 1], pa[4 * k + 2],
                    pa[4 * k + 3]);
      }
      if (quad == 0) {
        sm.row_scale[r0] = alpha0;
        sm.row_scale[r1] = alpha1;
      }
      fence_proxy_async();  // P is read by warpgroup 2's wgmma
      named_barrier_arrive(kPReadyBarrier, kMathThreads);

      // O[:, 0 .. 255] = alpha O + P V, P from registers.
      rescale_rows(acc, alpha0, alpha1);
      fence_registers(acc);
      wgmma_fence();
#pragma unroll
      for (int k = 0; k < kTileTokens / kMmaK; ++k)
        pv_step_rs<kSplitPv>(acc, pa + 4 * k, v_base + k * kMmaK * kAtomRowBytes);
    } else {  // Role::kSecond
      // O[:, 256 .. 511] = alpha O + P V, P and alpha from the scorer.
      named_barrier(kPReadyBarrier, kMathThreads);
      rescale_rows(acc, sm.row_scale[r0], sm.row_scale[r1]);
      fence_registers(acc);
      wgmma_fence();
#pragma unroll
      for (int k = 0; k < kTileTokens / kMmaK; ++k)
        pv_step<kSplitPv>(acc, kmajor_desc(p_base + k * kMmaK * 2), v_base + k * kMmaK * kAtomRowBytes);
    }
    wgmma_commit();
    wgmma_wait_all();
    fence_registers(acc);
    if (lane == 0) mbarrier_arrive(&sm.empty[stage]);
    // Scorer schedule: P and the scales are read (the wgmma has completed), the scorer may store the next tile's.
    if (kRole == Role::kSecond && i + 1 < row.n_tiles) named_barrier_arrive(kPFreeBarrier, kMathThreads);
  }

  // Row sums over the quad; halves: then over both warpgroups; scorer: its m and l to the second.
  if constexpr (kRole != Role::kSecond) {
#pragma unroll
    for (int x = 1; x < 4; x *= 2) {
      l_run0 += __shfl_xor_sync(0xffffffffu, l_run0, x);
      l_run1 += __shfl_xor_sync(0xffffffffu, l_run1, x);
    }
    if (quad == 0) {
      sm.row_sum[m][r0] = l_run0, sm.row_sum[m][r1] = l_run1;
      if constexpr (kRole == Role::kScorer) sm.row_max[0][r0] = m_run0, sm.row_max[0][r1] = m_run1;
    }
  }
  named_barrier(kMathBarrier, kMathThreads);
  float l0 = l_run0, l1 = l_run1;
  if constexpr (kRole == Role::kHalf) {
    l0 += sm.row_sum[1 - m][r0], l1 += sm.row_sum[1 - m][r1];
  } else if constexpr (kRole == Role::kSecond) {
    m_run0 = sm.row_max[0][r0], m_run1 = sm.row_max[0][r1];
    l0 = sm.row_sum[0][r0], l1 = sm.row_sum[0][r1];
  }
  const bool empty0 = l0 == 0.0f, empty1 = l1 == 0.0f;
  const float lse2_0 = m_run0 + fast_log2(empty0 ? 1.0f : l0), lse2_1 = m_run1 + fast_log2(empty1 ? 1.0f : l1);
  const int head0 = row.hb * kHeadsPerProgram + r0, head1 = head0 + 8;
  const int col0 = m * kPvCols + 2 * quad;  // + 8 j
  if (row.splits == 1) {
    const float lse0 = lse2_0 * kLn2, lse1 = lse2_1 * kLn2;
    float f0 = 1.0f, f1 = 1.0f;
    if (a.sink != nullptr) {
      f0 = 1.0f / (1.0f + expf(__ldg(a.sink + head0) - lse0));
      f1 = 1.0f / (1.0f + expf(__ldg(a.sink + head1) - lse1));
    }
    const float inv0 = empty0 ? 0.0f : f0 / l0, inv1 = empty1 ? 0.0f : f1 / l1;
    uint16_t* out0 = a.out + row.bi * a.out_stride_b + row.si * a.out_stride_s + head0 * a.out_stride_h + col0;
    uint16_t* out1 = out0 + 8 * a.out_stride_h;
#pragma unroll
    for (int j = 0; j < kAccRegs / 4; ++j) {
      const __nv_bfloat162 top = __floats2bfloat162_rn(acc[4 * j + 0] * inv0, acc[4 * j + 1] * inv0);
      const __nv_bfloat162 bottom = __floats2bfloat162_rn(acc[4 * j + 2] * inv1, acc[4 * j + 3] * inv1);
      *reinterpret_cast<__nv_bfloat162*>(out0 + 8 * j) = top;
      *reinterpret_cast<__nv_bfloat162*>(out1 + 8 * j) = bottom;
    }
    if (m == 0 && quad == 0) {
      float* lse = a.lse + row.bi * a.lse_stride_b + row.si * a.lse_stride_s;
      lse[head0 * a.lse_stride_h] = empty0 ? pos_inf() : lse0;
      lse[head1 * a.lse_stride_h] = empty1 ? pos_inf() : lse1;
    }
  } else {
    const int64_t part = row.part;
    // fp16 with the thread's largest |O / l| at 2^14: every element keeps fp16's 11 bits (2^-11
    // of itself) and none overflows; part_scale undoes the factor.
    const float inv0 = empty0 ? 0.0f : 1.0f / l0, inv1 = empty1 ? 0.0f : 1.0f / l1;
    float top0 = 0.0f, top1 = 0.0f;
#pragma unroll
    for (int j = 0; j < kAccRegs / 4; ++j) {
      top0 = fmaxf(top0, fmaxf(fabsf(acc[4 * j + 0]), fabsf(acc[4 * j + 1])));
      top1 = fmaxf(top1, fmaxf(fabsf(acc[4 * j + 2]), fabsf(acc[4 * j + 3])));
    }
    const float top = fmaxf(top0 * inv0, top1 * inv1);
    const float up = top > 0.0f ? kPartialTop / top : 0.0f;
    const float up0 = inv0 * up, up1 = inv1 * up;
    // In fragment order (partial_fragment): store j of the 256 consumer threads is 2 KB in a row.
    uint2* frags = reinterpret_cast<uint2*>(a.part_out) + part * kPartialFragments + mt;
#pragma unroll
    for (int j = 0; j < kAccRegs / 4; ++j)
      frags[j * kMathThreads] = make_uint2(half2_bits(acc[4 * j + 0] * up0, acc[4 * j + 1] * up0),
                                           half2_bits(acc[4 * j + 2] * up1, acc[4 * j + 3] * up1));
    a.part_scale[part * kMathThreads + mt] = top * (1.0f / kPartialTop);
    if (m == 0 && quad == 0) {
      a.part_lse[part * kHeadsPerProgram + r0] = empty0 ? neg_inf() : lse2_0;
      a.part_lse[part * kHeadsPerProgram + r1] = empty1 ? neg_inf() : lse2_1;
    }
  }
}

}  // namespace
}  // namespace dsa_decode
