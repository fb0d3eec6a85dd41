// The 32-head kernel's consumers on transposed products with wgmma (beside consumer_m16.cuh's
// mma.sync pairs, which run 16 heads): M = 64 runs over a tile's records for the scores and over
// value dims for the output, so one warpgroup's wgmma covers a whole tile at 32 heads.
//
// Per 64-record tile:
//   warpgroup A (consumer threads 0 .. 127): S^T [64 records, 32 heads] = K Q^T (wgmma m64n32k16,
//     the records and Q both K-major in shared memory); the online softmax per head (a column of
//     S^T): the column maxima over the quad's rows, then over A's four warps through shared memory
//     (named barrier of A's 128 threads); P stored transposed, P [32 heads, 64 records] (stmatrix
//     .trans: the K-major B operand of the output), with the heads' rescale factors; then
//     O^T [value dims 0 .. 64 kStATiles - 1, 32 heads] = alpha O^T + V^T P^T (wgmma m64n32k16, V^T the same
//     record rows read MN-major);
//   warpgroup B (threads 128 .. 255): waits for P (named barrier), then the other value dims likewise.
// P and the rescale factors are double-buffered by the stage: buffer s is rewritten two tiles on,
// once every consumer warp has released stage s (the producer waits for that before it refills s).
// The rows' sums of P stay per thread of A until the end; the output goes through a shared fp32
// staging tile so that out is written in rows and split partials in PartialsM16<2>'s order (the
// same combine as the mma.sync consumers).
#pragma once

#include "consumer_m16.cuh"

namespace dsa_decode {
namespace {

constexpr int kStHeads = 2 * kMmaM;                                  // 32
constexpr int kStAccRegs = kAtomRows * kStHeads / kWarpgroupThreads;  // an m64n32 accumulator: 16
// m64 tiles of value dims (64 each) of O^T: A takes the first kStATiles, B the rest (A also scores).
constexpr int kStOTiles = kDv / kAtomCols;  // 8
constexpr int kStATiles = 2;
constexpr int kStBTiles = kStOTiles - kStATiles;
constexpr int kStMaxTiles = kStATiles > kStBTiles ? kStATiles : kStBTiles;
constexpr int kStCols = kStAccRegs / 2;                              // heads a thread: 8 (c / 2) + 2 quad + c % 2
constexpr int kStWarps = kWarpgroupThreads / kWarpSize;
// Named barriers: kMathBarrier (all 256 consumers) and these.
constexpr int kStMaxBarrier = 2;    // A: every warp's column maxima are in
constexpr int kStPBarrier = 3;      // A: all of P is stored (A's own wgmma reads it)
// A arrives, B waits: P and the rescale factors of stage s are in (barrier kStReadyBarrier + s: A can
// arrive for tile i + 1 before B has waited for tile i, never for tile i + 2, which needs the stage B
// releases after that wait).
constexpr int kStReadyBarrier = 4;
static_assert(kStReadyBarrier + kStages <= 16, "hardware barriers");
// The output staging tile: fp32 [32 heads, kDv] with 4 floats of padding a row (rows land on
// different banks), in the record stages once the last tile is done.
constexpr int kStStageRow = kDv + 4;
static_assert(kStAccRegs == 16 && kStOTiles * kAtomCols == kDv && kStATiles > 0 && kStBTiles > 0,
              "wgmma m64n32 for S^T and for each O^T tile, both warpgroups with some");

template <int kFormat>
struct TilesST {
  alignas(1024) uint8_t kv[kStages][Layout<kFormat>::kAtoms * kAtomBytes];   // the producer's stages
  alignas(1024) uint8_t q[Layout<kFormat>::kAtoms * kStHeads * kAtomRowBytes];  // Q [32, d_qk], atoms of 32 rows
  alignas(1024) uint8_t p[kStages][kStHeads * kAtomRowBytes];                // P [32 heads, 64 records] per stage
};
struct SmallST {
  float bias[kStages][kTileTokens];     // 0 or -inf per record of a stage (the producer's)
  float tile_max[kStWarps][kStHeads];   // A's warps' column maxima of the tile
  float scale[kStages][kStHeads];       // the heads' rescale factors of the stage's tile
  float row_sum[kStWarps][kStHeads];    // A's warps' sums of P, at the end
  float final_max[kStHeads];
  uint64_t full[kStages];
  uint64_t empty[kStages];
};
template <int kFormat>
constexpr int shared_bytes_st() {
  return static_cast<int>(sizeof(TilesST<kFormat>) + sizeof(SmallST)) + 1024;  // + the base's alignment
}
static_assert(shared_bytes_st<kFormatV32>() <= 227 * 1024, "V3.2 tiles fit Hopper's 227 KB per block");
static_assert(kStHeads * kStStageRow * 4 <= kStages * Layout<kFormatV4>::kAtoms * kAtomBytes, "the staging tile fits the stages");

// Head of a thread's column c (S^T and O^T fragments: columns 8 j + 2 quad + {0, 1}).
__device__ __forceinline__ int st_head(int c, int quad) { return 8 * (c / 2) + 2 * quad + c % 2; }

// O^T tiles first .. first + kTiles - 1 (value dims 64 t ..) = alpha O^T + V^T P^T, V^T the stage's
// record rows read MN-major, P^T the K-major P [heads, records].
template <int kTiles>
__device__ __forceinline__ void st_add_pv(float (&o)[kStMaxTiles][kStAccRegs], const float (&alpha)[kStCols], int first,
                                          uint32_t kv_base, uint32_t p_base) {
#pragma unroll
  for (int t = 0; t < kTiles; ++t) {
#pragma unroll
    for (int j = 0; j < kStCols / 2; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        o[t][4 * j + e] *= alpha[2 * j + e];
        o[t][4 * j + 2 + e] *= alpha[2 * j + e];
      }
    }
    fence_registers(o[t]);
  }
  wgmma_fence();
#pragma unroll
  for (int t = 0; t < kTiles; ++t)
#pragma unroll
    for (int k = 0; k < kTileTokens / kMmaK; ++k)
      wgmma_m64n32k16_ta(o[t], mnmajor_desc(kv_base + (first + t) * kAtomBytes + k * kMmaK * kAtomRowBytes),
                         kmajor_desc(p_base + k * kMmaK * 2));
  wgmma_commit();
  wgmma_wait_all();
#pragma unroll
  for (int t = 0; t < kTiles; ++t) fence_registers(o[t]);
}
// O^T tiles first .. into the staging tile [heads, kDv] (rows r0 and r0 + 8 of a tile are value dims).
template <int kTiles>
__device__ __forceinline__ void st_stage_out(const float (&o)[kStMaxTiles][kStAccRegs], int first, float* staged, int r0, int quad) {
#pragma unroll
  for (int t = 0; t < kTiles; ++t) {
    const int dim = kAtomCols * (first + t) + r0;
#pragma unroll
    for (int c = 0; c < kStCols; ++c) {
      const int j = c / 2, e = c % 2;
      staged[st_head(c, quad) * kStStageRow + dim] = o[t][4 * j + e];
      staged[st_head(c, quad) * kStStageRow + dim + 8] = o[t][4 * j + 2 + e];
    }
  }
}

template <int kFormat>
__device__ __forceinline__ void consume_st(const DecodeArgs& a, const Row& row, TilesST<kFormat>& tiles, SmallST& sm,
                                           int ct) {  // ct: the consumer thread, 0 .. kM16ConsumerThreads - 1
  using L = Layout<kFormat>;
  using P = PartialsM16<2>;
  static_assert(P::kHeads == kStHeads, "the 32-head partials");
  const int wg = ct / kWarpgroupThreads;  // 0: A, 1: B
  const int wi = (ct % kWarpgroupThreads) / kWarpSize, lane = ct % kWarpSize, quad = lane % 4;
  const int r0 = 16 * wi + lane / 4;  // accumulator rows r0 and r0 + 8: records (S^T), value dims (O^T)

  // Q [32, d_qk] into its swizzled tile; every load issued before the first store.
  constexpr int kQChunks = L::kDqk / kChunkCols;
  constexpr int kQChunksAll = kStHeads * kQChunks;
  static_assert(kQChunksAll % kM16ConsumerThreads == 0, "Q's chunks split evenly");
  constexpr int kQChunksPerThread = kQChunksAll / kM16ConsumerThreads;
  const uint16_t* q_rows = a.q + row.bi * a.q_stride_b + row.si * a.q_stride_s;
  {
    uint4 q_chunks[kQChunksPerThread];
#pragma unroll
    for (int k = 0; k < kQChunksPerThread; ++k) {
      const int c = ct + k * kM16ConsumerThreads;
      q_chunks[k] = __ldg(reinterpret_cast<const uint4*>(q_rows + (c / kQChunks) * a.q_stride_h + (c % kQChunks) * kChunkCols));
    }
#pragma unroll
    for (int k = 0; k < kQChunksPerThread; ++k) {
      const int c = ct + k * kM16ConsumerThreads;
      *reinterpret_cast<uint4*>(tiles.q + swizzled_rows<kStHeads>(c / kQChunks, (c % kQChunks) * kChunkCols)) = q_chunks[k];
    }
  }
  fence_proxy_async();  // Q is read by wgmma
  named_barrier(kMathBarrier, kM16ConsumerThreads);

  float o[kStMaxTiles][kStAccRegs];
#pragma unroll
  for (int t = 0; t < kStMaxTiles; ++t)
#pragma unroll
    for (int r = 0; r < kStAccRegs; ++r) o[t][r] = 0.0f;
  float m_run[kStCols], l_part[kStCols];  // A only
#pragma unroll
  for (int c = 0; c < kStCols; ++c) m_run[c] = neg_inf(), l_part[c] = 0.0f;
  const uint32_t q_base = smem_addr(tiles.q);

  for (int i = 0; i < row.n_tiles; ++i) {
    const int stage = i % kStages;
    mbarrier_wait(&sm.full[stage], (i / kStages) & 1);
    const uint32_t kv_base = smem_addr(tiles.kv[stage]);
    const uint32_t p_base = smem_addr(tiles.p[stage]);
    float alpha[kStCols];
    if (wg == 0) {
      // S^T = K Q^T over d_qk.
      float s[kStAccRegs];
#pragma unroll
      for (int r = 0; r < kStAccRegs; ++r) s[r] = 0.0f;
      fence_registers(s);
      wgmma_fence();
#pragma unroll
      for (int atom = 0; atom < L::kAtoms; ++atom) {
#pragma unroll
        for (int k = 0; k < kAtomCols / kMmaK; ++k) {
          const uint32_t offset = k * kMmaK * 2;
          wgmma_m64n32k16(s, kmajor_desc(kv_base + atom * kAtomBytes + offset),
                          kmajor_desc(q_base + atom * kStHeads * kAtomRowBytes + offset), atom + k > 0);
        }
      }
      wgmma_commit();
      wgmma_wait_all();
      fence_registers(s);
      // The softmax scale (log2 domain), each record's bias, the columns' maxima.
      const float b0 = sm.bias[stage][r0], b1 = sm.bias[stage][r0 + 8];
      float mx[kStCols];
#pragma unroll
      for (int j = 0; j < kStCols / 2; ++j) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          s[4 * j + e] = fmaf(s[4 * j + e], a.scale_log2, b0);
          s[4 * j + 2 + e] = fmaf(s[4 * j + 2 + e], a.scale_log2, b1);
          mx[2 * j + e] = fmaxf(s[4 * j + e], s[4 * j + 2 + e]);
        }
      }
#pragma unroll
      for (int x = 4; x < kWarpSize; x *= 2)
#pragma unroll
        for (int c = 0; c < kStCols; ++c) mx[c] = fmaxf(mx[c], __shfl_xor_sync(0xffffffffu, mx[c], x));
      if (lane < 4) {
#pragma unroll
        for (int c = 0; c < kStCols; c += 2) *reinterpret_cast<float2*>(&sm.tile_max[wi][st_head(c, quad)]) = make_float2(mx[c], mx[c + 1]);
      }
      named_barrier(kStMaxBarrier, kWarpgroupThreads);
      float ref[kStCols];
#pragma unroll
      for (int c = 0; c < kStCols; c += 2) {
        float2 top = *reinterpret_cast<const float2*>(&sm.tile_max[0][st_head(c, quad)]);
#pragma unroll
        for (int x = 1; x < kStWarps; ++x) {
          const float2 other = *reinterpret_cast<const float2*>(&sm.tile_max[x][st_head(c, quad)]);
          top.x = fmaxf(top.x, other.x), top.y = fmaxf(top.y, other.y);
        }
        softmax_step(m_run[c], top.x, ref[c], alpha[c]);
        softmax_step(m_run[c + 1], top.y, ref[c + 1], alpha[c + 1]);
      }
      // P = 2^(S - ref) as bf16 pairs: pk[g][j] holds record r0 + 8 g, heads 8 j + 2 quad and + 1.
      uint32_t pk[2][kStCols / 2];
#pragma unroll
      for (int j = 0; j < kStCols / 2; ++j) {
        const float p00 = fast_exp2(s[4 * j + 0] - ref[2 * j]), p01 = fast_exp2(s[4 * j + 1] - ref[2 * j + 1]);
        const float p10 = fast_exp2(s[4 * j + 2] - ref[2 * j]), p11 = fast_exp2(s[4 * j + 3] - ref[2 * j + 1]);
        l_part[2 * j] = l_part[2 * j] * alpha[2 * j] + (p00 + p10);
        l_part[2 * j + 1] = l_part[2 * j + 1] * alpha[2 * j + 1] + (p01 + p11);
        const __nv_bfloat162 top = __floats2bfloat162_rn(p00, p01), bottom = __floats2bfloat162_rn(p10, p11);
        pk[0][j] = *reinterpret_cast<const uint32_t*>(&top);
        pk[1][j] = *reinterpret_cast<const uint32_t*>(&bottom);
      }
      // Transposed into P [heads, records]: stmatrix h stores blocks b = lane / 8 of (records 16 wi +
      // 8 (b % 2), heads 8 (2 h + b / 2)); its row lane % 8 is head 8 (2 h + b / 2) + lane % 8.
#pragma unroll
      for (int h = 0; h < kStCols / 4; ++h) {
        const int b = lane / 8;
        const uint32_t at = p_base + swizzled_rows<kStHeads>(8 * (2 * h + b / 2) + lane % 8, 16 * wi + 8 * (b % 2));
        stmatrix_x4_trans(at, pk[0][2 * h], pk[1][2 * h], pk[0][2 * h + 1], pk[1][2 * h + 1]);
      }
      if (wi == 0 && lane < 4) {
#pragma unroll
        for (int c = 0; c < kStCols; c += 2) *reinterpret_cast<float2*>(&sm.scale[stage][st_head(c, quad)]) = make_float2(alpha[c], alpha[c + 1]);
      }
      fence_proxy_async();  // P is read by wgmma
      named_barrier(kStPBarrier, kWarpgroupThreads);
      named_barrier_arrive(kStReadyBarrier + stage, kM16ConsumerThreads);
    } else {
      named_barrier(kStReadyBarrier + stage, kM16ConsumerThreads);
#pragma unroll
      for (int c = 0; c < kStCols; c += 2) {
        const float2 f = *reinterpret_cast<const float2*>(&sm.scale[stage][st_head(c, quad)]);
        alpha[c] = f.x, alpha[c + 1] = f.y;
      }
    }

    if (wg == 0) {
      st_add_pv<kStATiles>(o, alpha, 0, kv_base, p_base);
    } else {
      st_add_pv<kStBTiles>(o, alpha, kStATiles, kv_base, p_base);
    }
    __syncwarp();
    if (lane == 0) mbarrier_arrive(&sm.empty[stage]);
  }

  // The heads' sums of P: A's over the rows of the quad, then over its warps; the maxima from warp 0.
  if (wg == 0) {
#pragma unroll
    for (int x = 4; x < kWarpSize; x *= 2)
#pragma unroll
      for (int c = 0; c < kStCols; ++c) l_part[c] += __shfl_xor_sync(0xffffffffu, l_part[c], x);
    if (lane < 4) {
#pragma unroll
      for (int c = 0; c < kStCols; ++c) {
        sm.row_sum[wi][st_head(c, quad)] = l_part[c];
        if (wi == 0) sm.final_max[st_head(c, quad)] = m_run[c];
      }
    }
  }
  // Every consumer's last P V has completed: the stages are free for the staging tile.
  named_barrier(kMathBarrier, kM16ConsumerThreads);
  float* staged = reinterpret_cast<float*>(tiles.kv[0]);
  if (wg == 0) {
    st_stage_out<kStATiles>(o, 0, staged, r0, quad);
  } else {
    st_stage_out<kStBTiles>(o, kStATiles, staged, r0, quad);
  }
  named_barrier(kMathBarrier, kM16ConsumerThreads);

  if (row.splits == 1) {
    // Thread ct: head ct / 8, dims 64 (ct % 8) .. + 63, eight 16-byte stores.
    constexpr int kThreadsPerHead = kM16ConsumerThreads / kStHeads;
    constexpr int kDims = kDv / kThreadsPerHead;
    const int h = ct / kThreadsPerHead, d0 = kDims * (ct % kThreadsPerHead);
    float l = 0.0f;
#pragma unroll
    for (int x = 0; x < kStWarps; ++x) l += sm.row_sum[x][h];
    const bool empty = l == 0.0f;
    const float lse = (sm.final_max[h] + fast_log2(empty ? 1.0f : l)) * kLn2;
    const float f = a.sink != nullptr ? 1.0f / (1.0f + expf(__ldg(a.sink + h) - lse)) : 1.0f;
    const float inv = empty ? 0.0f : f / l;
    uint16_t* out = a.out + row.bi * a.out_stride_b + row.si * a.out_stride_s + h * a.out_stride_h + d0;
    const float* src = staged + h * kStStageRow + d0;
#pragma unroll
    for (int k = 0; k < kDims; k += 8) {
      const float4 x0 = *reinterpret_cast<const float4*>(src + k), x1 = *reinterpret_cast<const float4*>(src + k + 4);
      const __nv_bfloat162 v0 = __floats2bfloat162_rn(x0.x * inv, x0.y * inv), v1 = __floats2bfloat162_rn(x0.z * inv, x0.w * inv);
      const __nv_bfloat162 v2 = __floats2bfloat162_rn(x1.x * inv, x1.y * inv), v3 = __floats2bfloat162_rn(x1.z * inv, x1.w * inv);
      *reinterpret_cast<uint4*>(out + k) =
          make_uint4(*reinterpret_cast<const uint32_t*>(&v0), *reinterpret_cast<const uint32_t*>(&v1),
                     *reinterpret_cast<const uint32_t*>(&v2), *reinterpret_cast<const uint32_t*>(&v3));
    }
    if (ct % kThreadsPerHead == 0) a.lse[row.bi * a.lse_stride_b + row.si * a.lse_stride_s + h * a.lse_stride_h] = empty ? pos_inf() : lse;
  } else {
    // The partial in PartialsM16<2>'s order: this thread is owners mi * 256 + ct (mi = 0, 1), each
    // fp16 with its largest |O / l| at 2^14 (consumer_m16.cuh).
    const int64_t part = row.part;
    const int w = ct / kWarpSize, g = lane / 4;
#pragma unroll
    for (int mi = 0; mi < 2; ++mi) {
      const int head0 = kMmaM * mi + g, head1 = head0 + 8;
      float l0 = 0.0f, l1 = 0.0f;
#pragma unroll
      for (int x = 0; x < kStWarps; ++x) l0 += sm.row_sum[x][head0], l1 += sm.row_sum[x][head1];
      const bool empty0 = l0 == 0.0f, empty1 = l1 == 0.0f;
      const float inv0 = empty0 ? 0.0f : 1.0f / l0, inv1 = empty1 ? 0.0f : 1.0f / l1;
      float2 v0[kM16ColsPerWarp / 8], v1[kM16ColsPerWarp / 8];
      float top = 0.0f;
#pragma unroll
      for (int j = 0; j < kM16ColsPerWarp / 8; ++j) {
        const int col = kM16ColsPerWarp * w + 8 * j + 2 * quad;
        v0[j] = *reinterpret_cast<const float2*>(staged + head0 * kStStageRow + col);
        v1[j] = *reinterpret_cast<const float2*>(staged + head1 * kStStageRow + col);
        top = fmaxf(top, fmaxf(fmaxf(fabsf(v0[j].x), fabsf(v0[j].y)) * inv0, fmaxf(fabsf(v1[j].x), fabsf(v1[j].y)) * inv1));
      }
      const float up = top > 0.0f ? kPartialTop / top : 0.0f;
      const float up0 = inv0 * up, up1 = inv1 * up;
      const int owner = mi * kM16ConsumerThreads + ct;
      uint2* frags = reinterpret_cast<uint2*>(a.part_out) + part * P::kFragments + owner;
#pragma unroll
      for (int j = 0; j < kM16ColsPerWarp / 8; ++j)
        frags[j * P::kOwners] = make_uint2(half2_bits(v0[j].x * up0, v0[j].y * up0), half2_bits(v1[j].x * up1, v1[j].y * up1));
      a.part_scale[part * P::kOwners + owner] = top * (1.0f / kPartialTop);
      if (w == 0 && quad == 0) {
        a.part_lse[part * kStHeads + head0] = empty0 ? neg_inf() : sm.final_max[head0] + fast_log2(l0);
        a.part_lse[part * kStHeads + head1] = empty1 ? neg_inf() : sm.final_max[head1] + fast_log2(l1);
      }
    }
  }
}

}  // namespace
}  // namespace dsa_decode
