// The consumer warps of the 16/32-head kernel: mma.sync m16n8k16 (bf16, fp32 accumulate), one m16
// tile per 16 heads over the same records, with the m64 consumers' online softmax (softmax.cuh),
// bf16 rounding of P and partial format (PartialsM16).
//
// Per 64-record tile, warp w (of kM16Warps = 8) of pair p = w / 2, half h = w % 2:
//   S     the pair's partial [16 heads, records 16p .. 16p + 15] = Q K^T per m16 tile over the
//         k-steps t of d_qk with t % 2 == h (half of Q's and of the records' columns each warp,
//         so the eight warps read Q as often as four warps scoring all of d_qk): A (Q) and B (the
//         records, rows K-major) by ldmatrix from shared memory, two n8 tiles;
//   swap  the pair adds its partials through shared memory (s_swap, the pair's named barrier):
//         warp h keeps n8 tile h (records 16p + 8h .. = 8w .. 8w + 7) and hands n8 tile 1 - h to
//         its partner, so each warp ends with the full S of records 8w .. 8w + 7;
//   max   the rows' maxima over the quad, then over the warps through shared memory (barrier A);
//   P     2^(S - ref) as bf16 into the shared P [heads, 64 records] (barrier B);
//   O     [heads, value columns 64w .. 64w + 63] = alpha O + P V: A (P) by ldmatrix, B (V, the
//         same record rows read transposed) by ldmatrix.trans, 8 n8 tiles per m16 tile;
// then lane 0 of each warp releases the stage. The rows' sums of P are per warp until the end.
#pragma once

#include "instructions.cuh"
#include "producer.cuh"  // Row
#include "softmax.cuh"

namespace dsa_decode {
namespace {

constexpr int kM16BRowsPerLoad = 16;  // records (S) or value columns (O) one ldmatrix.x4 covers
constexpr int kM16Pairs = kM16Warps / 2;
constexpr int kM16PairRecords = kTileTokens / kM16Pairs;  // records a pair scores: two n8 tiles
static_assert(kM16RecordsPerWarp == 8 && kM16PairRecords == kM16BRowsPerLoad && kM16ColsPerWarp % kM16BRowsPerLoad == 0,
              "S: a pair's two n8 tiles, one per warp after the swap; O: pairs of n8 tiles");
// Named barriers of the pairs (64 threads each): kM16PairBarrier + p. Ids 2 and 3 are the 64-head
// kernel's; this kernel uses kMathBarrier and these only.
constexpr int kM16PairBarrier = 4;
static_assert(kM16PairBarrier > kPFreeBarrier && kM16PairBarrier + kM16Pairs <= 16, "sixteen hardware barriers");

// Four 8x8 bf16 blocks from shared memory in the mma fragment layout; lane l gives the address of
// row l % 8 of block l / 8 (.trans: each block transposed).
__device__ __forceinline__ void ldmatrix_x4(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}
// D[16, 8] += A[16, 16] B[16, 8], bf16 inputs, fp32 accumulators (rows lane / 4 and + 8, columns 2 (lane % 4) + {0, 1}).
__device__ __forceinline__ void mma_m16n8k16(float* d, const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Shared memory of the 16/32-head kernel: the record stages the producer fills (its layout, as
// Tiles), Q [heads, d_qk] and P [heads, 64 records] in atoms of kHeads rows, and the pairs' S swap.
template <int kFormat, int kMTiles>
struct TilesM16 {
  static constexpr int kHeads = kMmaM * kMTiles;
  alignas(1024) uint8_t kv[kStages][Layout<kFormat>::kAtoms * kAtomBytes];
  alignas(128) uint8_t q[Layout<kFormat>::kAtoms * kHeads * kAtomRowBytes];
  alignas(128) uint8_t p[kHeads * kAtomRowBytes];
  // The pairs' S swap: [pair][the warp it is for (w % 2)][m16 tile][lane], one fp32 n8 fragment (4
  // values) a lane, so a warp's 512-byte store or load is whole 128-byte wavefronts.
  float4 s_swap[kM16Pairs][2][kMTiles][kWarpSize];
};
struct SmallM16 {
  float bias[kStages][kTileTokens];  // 0 or -inf per record of a stage
  float row_max[kM16Warps][kMmaM * 2];  // each warp's tile maxima of its records, per head
  float row_sum[kM16Warps][kMmaM * 2];  // each warp's sums of P, per head, at the end
  uint64_t full[kStages];
  uint64_t empty[kStages];
};
template <int kFormat, int kMTiles>
constexpr int shared_bytes_m16() {
  return static_cast<int>(sizeof(TilesM16<kFormat, kMTiles>) + sizeof(SmallM16)) + 1024;  // + the base's alignment
}
static_assert(shared_bytes_m16<kFormatV32, 2>() <= 227 * 1024, "V3.2 tiles fit Hopper's 227 KB per block");

template <int kFormat, int kMTiles>
__device__ __forceinline__ void consume_m16(const DecodeArgs& a, const Row& row, TilesM16<kFormat, kMTiles>& tiles, SmallM16& sm,
                                            int ct) {  // ct: the consumer thread, 0 .. kM16ConsumerThreads - 1
  using L = Layout<kFormat>;
  using P = PartialsM16<kMTiles>;
  constexpr int kHeads = P::kHeads;
  constexpr int kOTiles = kM16ColsPerWarp / 8;  // n8 tiles of O per m16 tile
  const int w = ct / kWarpSize, lane = ct % kWarpSize, quad = lane % 4;
  const int g = lane / 4;  // rows g and g + 8 of each m16 tile

  // Q [kHeads, d_qk] into its swizzled tile; every load issued before the first store.
  // (V3.2 at 16 heads has 1152 chunks for 256 threads: the last pass only the first 128 threads.)
  constexpr int kQChunks = L::kDqk / kChunkCols;
  constexpr int kQChunksAll = kHeads * kQChunks;
  constexpr int kQChunksPerThread = (kQChunksAll + kM16ConsumerThreads - 1) / kM16ConsumerThreads;
  const uint16_t* q_rows = a.q + row.bi * a.q_stride_b + row.si * a.q_stride_s;
  {
    uint4 q_chunks[kQChunksPerThread];
#pragma unroll
    for (int k = 0; k < kQChunksPerThread; ++k) {
      const int c = ct + k * kM16ConsumerThreads;
      if (kQChunksAll % kM16ConsumerThreads == 0 || c < kQChunksAll)
        q_chunks[k] = __ldg(reinterpret_cast<const uint4*>(q_rows + (c / kQChunks) * a.q_stride_h + (c % kQChunks) * kChunkCols));
    }
#pragma unroll
    for (int k = 0; k < kQChunksPerThread; ++k) {
      const int c = ct + k * kM16ConsumerThreads;
      if (kQChunksAll % kM16ConsumerThreads == 0 || c < kQChunksAll)
        *reinterpret_cast<uint4*>(tiles.q + swizzled_rows<kHeads>(c / kQChunks, (c % kQChunks) * kChunkCols)) = q_chunks[k];
    }
  }
  named_barrier(kMathBarrier, kM16ConsumerThreads);

  float acc[kMTiles][kOTiles * 4];
#pragma unroll
  for (int mi = 0; mi < kMTiles; ++mi)
#pragma unroll
    for (int i = 0; i < kOTiles * 4; ++i) acc[mi][i] = 0.0f;
  float m_run[kMTiles][2], l_run[kMTiles][2];
#pragma unroll
  for (int mi = 0; mi < kMTiles; ++mi) m_run[mi][0] = m_run[mi][1] = neg_inf(), l_run[mi][0] = l_run[mi][1] = 0.0f;
  const uint32_t q_base = smem_addr(tiles.q);
  const uint32_t p_base = smem_addr(tiles.p);
  // Pair p = w / 2 scores records 16p .. 16p + 15, warp w over the k-steps t = 2 u + w % 2 of d_qk
  // (u = 0 .. kPairSteps - 1): k-step t is columns 32 (u % 2) + 16 (w % 2) .. of atom u / 2, so a lane's chunk there
  // is its chunk at u = 0 with bit 2 flipped for odd u (the 128-byte swizzle XORs the chunk with
  // row % 8), and every ldmatrix address is one of two per-lane offsets plus a constant.
  // ldmatrix lanes: A (heads lane % 16, k-offset 8 (lane / 16)); B of S (records 16p + 8 (lane / 16)
  // + lane % 8, k-offset 8 ((lane / 8) % 2): blocks 0, 1 are n8 tile 0's b0, b1, blocks 2, 3 n8 tile
  // 1's); B of O (records 8 ((lane / 8) % 2) + lane % 8, columns 8 (lane / 16)).
  const int wp = w / 2, wh = w % 2;  // the warp's pair and its half of the k-steps
  const int a_row = lane % 16, a_col = 8 * (lane / 16);
  const int s_record = kM16PairRecords * wp + 8 * (lane / 16) + lane % 8, s_col = 8 * ((lane / 8) % 2);
  constexpr uint32_t kOddStep = 4 * 16;  // chunk bit 2, in bytes
  const uint32_t q_even = swizzled_rows<kHeads>(a_row, kMmaK * wh + a_col), q_odd = q_even ^ kOddStep;
  const uint32_t k_even = swizzled(s_record, kMmaK * wh + s_col), k_odd = k_even ^ kOddStep;
  const int v_record = 8 * ((lane / 8) % 2) + lane % 8, v_col = kM16ColsPerWarp * w + 8 * (lane / 16);

  for (int i = 0; i < row.n_tiles; ++i) {
    const int stage = i % kStages;
    mbarrier_wait(&sm.full[stage], (i / kStages) & 1);
    const uint32_t kv_base = smem_addr(tiles.kv[stage]);

    // The pair's partial S over this warp's k-steps, per m16 tile: s[mi][chain][n8 tile][fragment].
    // Odd and even u accumulate apart (two chains), so a warp has 4 (16 heads) or 8 (32 heads)
    // independent mma accumulators in flight.
    static_assert(L::kDqk % (2 * kMmaK) == 0 && (L::kDqk / (2 * kMmaK)) % 2 == 0,
                  "d_qk splits into equal k-steps for the pair's two warps, an even number each");
    constexpr int kPairSteps = L::kDqk / (2 * kMmaK);  // V3.2 18, V4 16 k-steps a warp
    float s[kMTiles][2][2][4];
#pragma unroll
    for (int mi = 0; mi < kMTiles; ++mi)
#pragma unroll
      for (int c = 0; c < 2; ++c)
#pragma unroll
        for (int j = 0; j < 8; ++j) s[mi][c][j / 4][j % 4] = 0.0f;
#pragma unroll
    for (int u = 0; u < kPairSteps; ++u) {
      uint32_t b[4];
      ldmatrix_x4(kv_base + (u % 2 ? k_odd : k_even) + (u / 2) * kAtomBytes, b);
#pragma unroll
      for (int mi = 0; mi < kMTiles; ++mi) {
        uint32_t qa[4];
        ldmatrix_x4(q_base + (u % 2 ? q_odd : q_even) + ((u / 2) * kHeads + kMmaM * mi) * kAtomRowBytes, qa);
        mma_m16n8k16(s[mi][u % 2][0], qa, b[0], b[1]);
        mma_m16n8k16(s[mi][u % 2][1], qa, b[2], b[3]);
      }
    }
    // The swap: warp wh of the pair keeps n8 tile wh (records 8w ..), stores its partial of n8 tile
    // 1 - wh for its partner and, after the pair's barrier, adds the partner's partial of n8 tile
    // wh. Both warps store and load one 512-byte fragment per m16 tile and take the softmax of 8 records.
    // Reuse of s_swap: a warp rewrites its partner's slot at the next tile only after barrier A of
    // this tile, which the partner reaches after its load here (bar.sync orders the accesses).
    float sc[kMTiles][4];  // S of records 8w .. 8w + 7 (fragment 0 as softmax.cuh reads it)
#pragma unroll
    for (int mi = 0; mi < kMTiles; ++mi) {
      float give[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float tile0 = s[mi][0][0][j] + s[mi][1][0][j], tile1 = s[mi][0][1][j] + s[mi][1][1][j];
        sc[mi][j] = wh == 0 ? tile0 : tile1;
        give[j] = wh == 0 ? tile1 : tile0;
      }
      tiles.s_swap[wp][1 - wh][mi][lane] = make_float4(give[0], give[1], give[2], give[3]);
    }
    named_barrier(kM16PairBarrier + wp, 2 * kWarpSize);
#pragma unroll
    for (int mi = 0; mi < kMTiles; ++mi) {
      const float4 got = tiles.s_swap[wp][wh][mi][lane];
      sc[mi][0] += got.x, sc[mi][1] += got.y, sc[mi][2] += got.z, sc[mi][3] += got.w;
    }
    float max[kMTiles][2];
#pragma unroll
    for (int mi = 0; mi < kMTiles; ++mi) {
      scale_and_row_max(sc[mi], &sm.bias[stage][kM16RecordsPerWarp * w], quad, a.scale_log2, max[mi][0], max[mi][1]);
      if (quad == 0) {
        sm.row_max[w][kMmaM * mi + g] = max[mi][0];
        sm.row_max[w][kMmaM * mi + g + 8] = max[mi][1];
      }
    }
    // Barrier A: every warp's maxima are in (and, by program order, every warp's P V of the
    // previous tile has completed, so P may be overwritten below, and every warp's load of s_swap
    // of this tile, so its partner may overwrite it at the next).
    named_barrier(kMathBarrier, kM16ConsumerThreads);
    float alpha[kMTiles][2];
#pragma unroll
    for (int mi = 0; mi < kMTiles; ++mi) {
      float ref[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float tile_max = max[mi][h];
#pragma unroll
        for (int x = 0; x < kM16Warps; ++x) tile_max = fmaxf(tile_max, sm.row_max[x][kMmaM * mi + g + 8 * h]);
        softmax_step(m_run[mi][h], tile_max, ref[h], alpha[mi][h]);
      }
      float sum0 = 0.0f, sum1 = 0.0f;
      {
        // The warp's 8 P columns are chunk w of each row: lanes (g, quad) hit bank 4 (w ^ g) + quad, no conflict.
        const uint2 pair = softmax_p_pairs(sc[mi], 0, ref[0], ref[1], sum0, sum1);
        const int token = kM16RecordsPerWarp * w + 2 * quad;
        const int within = (token % kChunkCols) * 2;
        *reinterpret_cast<uint32_t*>(tiles.p + swizzled_rows<kHeads>(kMmaM * mi + g, token) + within) = pair.x;
        *reinterpret_cast<uint32_t*>(tiles.p + swizzled_rows<kHeads>(kMmaM * mi + g + 8, token) + within) = pair.y;
      }
      l_run[mi][0] = l_run[mi][0] * alpha[mi][0] + sum0;
      l_run[mi][1] = l_run[mi][1] * alpha[mi][1] + sum1;
    }
    named_barrier(kMathBarrier, kM16ConsumerThreads);  // barrier B: all of P is stored

    // O[:, 64w ..] = alpha O + P V.
#pragma unroll
    for (int mi = 0; mi < kMTiles; ++mi)
#pragma unroll
      for (int j = 0; j < kOTiles; ++j) {
        acc[mi][4 * j + 0] *= alpha[mi][0];
        acc[mi][4 * j + 1] *= alpha[mi][0];
        acc[mi][4 * j + 2] *= alpha[mi][1];
        acc[mi][4 * j + 3] *= alpha[mi][1];
      }
#pragma unroll
    for (int k = 0; k < kTileTokens; k += kMmaK) {
      uint32_t pa[kMTiles][4];
#pragma unroll
      for (int mi = 0; mi < kMTiles; ++mi) ldmatrix_x4(p_base + swizzled_rows<kHeads>(kMmaM * mi + a_row, k + a_col), pa[mi]);
#pragma unroll
      for (int n = 0; n < kM16ColsPerWarp; n += kM16BRowsPerLoad) {
        uint32_t b[4];
        ldmatrix_x4_trans(kv_base + swizzled(k + v_record, n + v_col), b);
#pragma unroll
        for (int mi = 0; mi < kMTiles; ++mi) {
          mma_m16n8k16(&acc[mi][4 * (n / 8)], pa[mi], b[0], b[1]);
          mma_m16n8k16(&acc[mi][4 * (n / 8 + 1)], pa[mi], b[2], b[3]);
        }
      }
    }
    __syncwarp();
    if (lane == 0) mbarrier_arrive(&sm.empty[stage]);
  }

  // Row sums over the quad, then over the warps.
#pragma unroll
  for (int mi = 0; mi < kMTiles; ++mi) {
#pragma unroll
    for (int x = 1; x < 4; x *= 2) {
      l_run[mi][0] += __shfl_xor_sync(0xffffffffu, l_run[mi][0], x);
      l_run[mi][1] += __shfl_xor_sync(0xffffffffu, l_run[mi][1], x);
    }
    if (quad == 0) sm.row_sum[w][kMmaM * mi + g] = l_run[mi][0], sm.row_sum[w][kMmaM * mi + g + 8] = l_run[mi][1];
  }
  named_barrier(kMathBarrier, kM16ConsumerThreads);
#pragma unroll
  for (int mi = 0; mi < kMTiles; ++mi) {
    float l0 = 0.0f, l1 = 0.0f;
#pragma unroll
    for (int x = 0; x < kM16Warps; ++x) l0 += sm.row_sum[x][kMmaM * mi + g], l1 += sm.row_sum[x][kMmaM * mi + g + 8];
    const float m0 = m_run[mi][0], m1 = m_run[mi][1];
    const bool empty0 = l0 == 0.0f, empty1 = l1 == 0.0f;
    const float lse2_0 = m0 + fast_log2(empty0 ? 1.0f : l0), lse2_1 = m1 + fast_log2(empty1 ? 1.0f : l1);
    const int head0 = kMmaM * mi + g, head1 = head0 + 8;
    const int col0 = kM16ColsPerWarp * w + 2 * quad;  // + 8 j
    const float* o = acc[mi];
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
      for (int j = 0; j < kOTiles; ++j) {
        *reinterpret_cast<__nv_bfloat162*>(out0 + 8 * j) = __floats2bfloat162_rn(o[4 * j + 0] * inv0, o[4 * j + 1] * inv0);
        *reinterpret_cast<__nv_bfloat162*>(out1 + 8 * j) = __floats2bfloat162_rn(o[4 * j + 2] * inv1, o[4 * j + 3] * inv1);
      }
      if (w == 0 && quad == 0) {
        float* lse = a.lse + row.bi * a.lse_stride_b + row.si * a.lse_stride_s;
        lse[head0 * a.lse_stride_h] = empty0 ? pos_inf() : lse0;
        lse[head1 * a.lse_stride_h] = empty1 ? pos_inf() : lse1;
      }
    } else {
      // The m64 consumers' partial (consumer_m64.cuh): fp16 with the owner's largest |O / l| at 2^14.
      const int64_t part = row.part;
      const int owner = mi * kM16ConsumerThreads + ct;
      const float inv0 = empty0 ? 0.0f : 1.0f / l0, inv1 = empty1 ? 0.0f : 1.0f / l1;
      float top0 = 0.0f, top1 = 0.0f;
#pragma unroll
      for (int j = 0; j < kOTiles; ++j) {
        top0 = fmaxf(top0, fmaxf(fabsf(o[4 * j + 0]), fabsf(o[4 * j + 1])));
        top1 = fmaxf(top1, fmaxf(fabsf(o[4 * j + 2]), fabsf(o[4 * j + 3])));
      }
      const float top = fmaxf(top0 * inv0, top1 * inv1);
      const float up = top > 0.0f ? kPartialTop / top : 0.0f;
      const float up0 = inv0 * up, up1 = inv1 * up;
      uint2* frags = reinterpret_cast<uint2*>(a.part_out) + part * P::kFragments + owner;
#pragma unroll
      for (int j = 0; j < kOTiles; ++j)
        frags[j * P::kOwners] = make_uint2(half2_bits(o[4 * j + 0] * up0, o[4 * j + 1] * up0),
                                           half2_bits(o[4 * j + 2] * up1, o[4 * j + 3] * up1));
      a.part_scale[part * P::kOwners + owner] = top * (1.0f / kPartialTop);
      if (w == 0 && quad == 0) {
        a.part_lse[part * kHeads + head0] = empty0 ? neg_inf() : lse2_0;
        a.part_lse[part * kHeads + head1] = empty1 ? neg_inf() : lse2_1;
      }
    }
  }
}

}  // namespace
}  // namespace dsa_decode
