// Sparse MLA attention for Hopper, hand-written: split-K over the 2048 selected slots, the
// combine in the same launch. Pure CUDA (no torch); nvcc links it with attention_capi.cpp, the
// C ABI, into one shared library (common/cuda_build.py).
//
// Grid (S splits, T tokens), 8 warps per program. Program (s, t) owns the slots s, s + S,
// s + 2S, ... of token t (strided: valid slots cluster at the front of a row) and walks them in
// tiles of kGatherTileSlots (64) slots:
//   gather  bulk copies (TMA) bring each slot's ckv row (1024 B) and kpe row (128 B) into one
//           shared row, completing on the stage's mbarrier; padding slots are zeroed without a
//           read. kGatherStages stages: a tile is requested once the one before it has landed or
//           `gather_lag` cycles after that one was requested (0: all at once).
//   logits  each warp scores one 8-slot n-tile of the tile against the 16 heads with mma.sync
//           m16n8k16 (bf16 in, fp32 accumulate): q_nope.ckv and q_pe.kpe in separate
//           accumulators (32-slot tiles: two warps per n-tile, each over half the k-steps), and
//           writes the logits to shared memory. One block barrier per tile, here.
//   softmax every warp reads the logits at its P fragments' positions and computes the tile's
//           online softmax step itself (log2 domain, scale pre-multiplied by log2 e): row maxima
//           and sums are quad shuffles, so every warp holds the same running (m, l) per head and
//           P stays in registers.
//   P.V     P (bf16, registers) times the tile's ckv rows; warp w owns value columns
//           64w..64w+63 (8 accumulator tiles), so the 16 x 512 output is spread over the block.
// Then the program writes its partial (output / l in bf16, lse = m + log2 l), and program s
// combines its 1/S share of the token's 16 x 512 outputs from all S partials, in one of three ways:
//   split_kernel, fused    partials in global memory, then a per-token ticket barrier; needs every
//                          program of the grid resident at once (the host checks with the occupancy
//                          calculator)
//   split_kernel + combine_kernel   the same partials, the combine in a second launch
//   cluster_kernel         the token's S <= 16 programs form one thread-block cluster: partials are
//                          bulk-copied into their owners' shared memory and combined there (see
//                          "cluster combine" below).
#include "attention_sm90.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cooperative_groups.h>

#include <cstdint>

#include "../../common/csrc/fast_math.cuh"
#include "../../common/csrc/sm90_sync.cuh"

namespace dsa_attention {
namespace {

using dsa_fast_math::fast_exp2;
using dsa_fast_math::fast_log2;
using dsa_fast_math::fast_rcp;
using dsa_fast_math::neg_inf;
using dsa_sm90::fence_mbarrier_init;
using dsa_sm90::fence_proxy_async;
using dsa_sm90::mbarrier_arrive;
using dsa_sm90::mbarrier_arrive_expect_tx;
using dsa_sm90::mbarrier_done;
using dsa_sm90::mbarrier_init;
using dsa_sm90::mbarrier_wait;
using dsa_sm90::smem_addr;

constexpr int kWarpSize = 32;
constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kWarps = 8;
constexpr int kThreads = kWarps * kWarpSize;
constexpr int kDQk = kDCkv + kDKpe;                      // 576: one gathered slot row
constexpr int kTileSlots = kGatherTileSlots;             // slots gathered and scored together
constexpr int kStages = kGatherStages;
constexpr int kMaxTiles = kTopK / kMinSplits / kTileSlots;  // tiles of the longest split
// 16 bytes of padding per shared row: rows 1168 B apart put the 8 rows of one ldmatrix in 8
// different 16-byte bank groups (unpadded, 1152 B = 9 x 128 B would make it an 8-way conflict).
constexpr int kRowPad = 8;
constexpr int kRowStride = kDQk + kRowPad;               // bf16 per shared slot row
constexpr int kChunk = 8;                                // bf16 per 16-byte cp.async
constexpr int kCkvChunks = kDCkv / kChunk;
constexpr int kRowChunks = kDQk / kChunk;
constexpr int kThreadsPerRow = kThreads / kTileSlots;    // threads sharing one slot row's gather
constexpr uint32_t kRowBytes = kDQk * 2;                 // bytes bulk-copied per valid slot
constexpr int kSlotsPerGroup = 8;                        // slots of one mma n-tile of logits
constexpr int kSlotGroups = kTileSlots / kSlotsPerGroup;  // logit n-tiles per tile
constexpr int kKSplits = kWarps / kSlotGroups;           // warps sharing one n-tile, each a k-range
constexpr int kPSteps = kTileSlots / 16;                 // P.V k-steps of a tile
// Shared logits rows (fp32) padded by 8 floats: the float2 reads of rows g = 0..3 of a
// half-warp then hit 32 distinct banks.
constexpr int kLogitStride = kTileSlots + 8;
constexpr int kColsPerWarp = kDCkv / kWarps;             // value columns per warp
constexpr int kColTiles = kColsPerWarp / 8;              // mma n-tiles of output per warp
constexpr int kQSteps = kDQk / 16;                       // mma k-steps of a logit row
constexpr int kQStepsPerWarp = kQSteps / kKSplits;       // k-steps of the logit k-range one warp scores
constexpr int kNopeSteps = kDCkv / 16;                   // k-steps < kNopeSteps are q_nope . ckv, the rest q_pe . kpe
// Partials are stored in the accumulators' own order (see store_partial): one 8-byte unit per
// (warp, output n-tile, lane) holds a bf16 pair of head g and one of head g + 8.
constexpr int kUnits = kWarps * kColTiles * kWarpSize;   // units per token
constexpr int kCombineSplitsPerThread = 8;               // partials one combining thread reads
constexpr int kUnitsLog2 = 11;

static_assert(kHeads == 16, "the heads are the M = 16 rows of every mma");
static_assert(kTileSlots % kSlotsPerGroup == 0 && kWarps % kSlotGroups == 0, "every warp scores one n-tile over one k-range");
static_assert(kQSteps % (2 * kKSplits) == 0 && kNopeSteps % 2 == 0, "k-ranges of whole step pairs, none straddling q_nope / q_pe");
static_assert(kTileSlots % 16 == 0 && kPSteps >= 1, "P.V k-steps of 16 slots");
static_assert(kDCkv % 32 == 0 && kDKpe % 32 == 0, "logit k-loops take two 16-wide k-steps at a time");
static_assert(kThreads % kTileSlots == 0 && kCkvChunks % kThreadsPerRow == 0, "whole rows per thread group");
static_assert((kDCkv * 2) % 16 == 0 && (kDKpe * 2) % 16 == 0, "bulk copies move multiples of 16 bytes");
static_assert(kColTiles % 2 == 0, "ldmatrix.x4.trans loads two value n-tiles");
static_assert((kRowStride * 2) % 16 == 0 && kLogitStride % 2 == 0, "16-byte aligned slot rows, 8-byte aligned logit pairs");
static_assert(kTopK % kMaxSplits == 0 && (kTopK / kMaxSplits) % kSlotsPerGroup == 0, "splits hold whole n-tiles");
static_assert(kUnits * 4 == kHeads * kDCkv, "a unit holds 4 outputs");
static_assert(kUnits == 1 << kUnitsLog2, "units per token are a power of two");
static_assert(kUnits / kMaxSplits * (kMaxSplits / kCombineSplitsPerThread) == kThreads &&
              kUnits / kMinSplits * (kMinSplits / kCombineSplitsPerThread) == kThreads,
              "every split count gives each combining thread one unit and kCombineSplitsPerThread splits");
constexpr int kLsePairs = kHeads / 2;                    // a split's lse as (head g, head g + 8) pairs

// A split's partial of one program's share (cluster inbox): its kUnits / S units, then
// its lse as kLsePairs (head g, head g + 8) pairs, one 8-byte unit each: one contiguous slice.
constexpr int kInboxUnits = kUnits + kMaxClusterSplits * kLsePairs;

struct Shared {
  uint16_t q[kHeads][kRowStride];
  uint16_t kv[kStages][kTileSlots][kRowStride];
  // A tile's logits (unscaled, -inf at padding), one plane per k-range; two buffers, by tile parity.
  float logits[2][kKSplits][kHeads][kLogitStride];
  int32_t slot_ids[kStages][kTileSlots];
  int32_t warp_active[kWarps];  // per warp: its threads' last tile holding a valid slot, + 1
  uint64_t full[kStages];  // mbarrier per gather stage
  alignas(16) uint32_t ticket[4];  // split_kernel, fused: the token's ticket word at entry (a 16-byte cp.async)
  // Cluster combine only: every program of the cluster copies in its partial of this
  // program's share (see ClusterInbox), and the copies complete their bytes on inbox_full.
  // Apart from the gather buffers: a fast program pushes while a slow one still gathers.
  uint2 inbox[kInboxUnits];
  uint64_t inbox_full;
};


// log2 of the units each program combines, kUnits / S (S is a power of two known only at run
// time: the share arithmetic uses shifts and masks instead of integer divisions).
__device__ __forceinline__ int share_shift(int splits) { return kUnitsLog2 - (__ffs(splits) - 1); }

__device__ __forceinline__ int64_t global_ns() {
  uint64_t ns;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
  return static_cast<int64_t>(ns);
}

// Profiling stamp (see PhaseSlot): thread 0 of the program, only when the caller asked.
__device__ __forceinline__ void stamp(const AttentionArgs& a, int t, int s, PhaseSlot slot) {
  if (a.phase_clocks == nullptr || threadIdx.x != 0) return;
  const bool wall = slot == kPhaseEntryNs || slot == kPhaseExitNs;
  a.phase_clocks[(static_cast<int64_t>(t) * a.splits + s) * kPhaseSlots + slot] = wall ? global_ns() : static_cast<int64_t>(clock64());
}

// 16-byte global -> shared copy; `bytes` 0 zero-fills the destination without reading.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, int bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

// The gather stages' mbarriers (common/csrc/sm90_sync.cuh): every thread arrives once per tile,
// and the tile's bulk copies complete their bytes on them (expect_tx), so a completed phase
// means every row has landed.

// Bulk (TMA) copy of `bytes` (a multiple of 16, both addresses 16-byte aligned) from global to
// this program's shared memory, completing its bytes on `bar`.
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(smem_addr(dst)),
               "l"(src), "r"(bytes), "r"(smem_addr(bar))
               : "memory");
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// d += a (16 x 16, row-major bf16) * b (16 x 8, column-major bf16), fp32 accumulators.
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

__device__ __forceinline__ float2 unpack_bf16x2(uint32_t bits) {
  return make_float2(__uint_as_float(bits << 16), __uint_as_float(bits & 0xffff0000u));
}


// Max over the 4 lanes of a quad (the lanes holding one accumulator row).
__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(kFullMask, v, 1));
  return fmaxf(v, __shfl_xor_sync(kFullMask, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(kFullMask, v, 1);
  return v + __shfl_xor_sync(kFullMask, v, 2);
}

// Issues one tile's gather into stage `stage`. The kThreadsPerRow threads of row tid / 4 share
// it: for a valid slot the first one bulk-copies the ckv row (1024 B) and the kpe row (128 B)
// (bulk copies keep far more bytes in flight per SM than 16-byte cp.async, which capped the
// random gather well below the copy bandwidth); for padding they zero the row's value part instead (P is 0
// there, but 0 * NaN from stale bits would not be; the key part only feeds masked logits).
// Every thread then arrives on the stage's mbarrier, so its phase completes when all rows,
// zeroed or copied, are in place.
__device__ __forceinline__ void issue_tile(Shared& sh, const AttentionArgs& a, int id, int stage) {
  const int row = threadIdx.x / kThreadsPerRow;
  const int part = threadIdx.x % kThreadsPerRow;
  uint16_t* dst = sh.kv[stage][row];
  uint64_t* bar = &sh.full[stage];
  if (part == 0) sh.slot_ids[stage][row] = id;
  if (id >= 0) {
    if (part == 0) {
      const uint16_t* ckv_row = a.ckv + static_cast<int64_t>(id / kPageSize) * a.ckv_page + static_cast<int64_t>(id % kPageSize) * a.ckv_slot;
      const uint16_t* kpe_row = a.kpe + static_cast<int64_t>(id / kPageSize) * a.kpe_page + static_cast<int64_t>(id % kPageSize) * a.kpe_slot;
      fence_proxy_async();
      mbarrier_arrive_expect_tx(bar, kRowBytes);
      bulk_copy(dst, ckv_row, kDCkv * 2, bar);
      bulk_copy(dst + kDCkv, kpe_row, kDKpe * 2, bar);
      return;
    }
  } else {
    uint4* value = reinterpret_cast<uint4*>(dst);
#pragma unroll
    for (int c = part; c < kCkvChunks; c += kThreadsPerRow) value[c] = make_uint4(0, 0, 0, 0);
  }
  mbarrier_arrive(bar);
}

// Running softmax state of the two heads (rows g and g + 8) this thread's accumulators hold.
struct RowState {
  float m[2];  // running max of the log2-domain logits
  float l[2];  // running sum of 2^(logit - m)
};

// Logits of k-steps [kFirst, kLast) for this warp's n-tile: A = this thread's Q fragments of
// those steps (registers, loaded once per program), B = slot rows (lane -> slot lane % 8, k offset
// 8 * (lane / 8): four k-chunks = two k-steps per ldmatrix). q_nope . ckv runs in two independent
// chains (half the mma latency), q_pe . kpe in its own accumulator.
template <int kFirst, int kLast>
__device__ __forceinline__ void score_steps(uint32_t k_addr, const uint32_t (&q)[kQStepsPerWarp][4], float (&nope)[2][4], float (&pe)[4]) {
  static_assert(kLast - kFirst == kQStepsPerWarp, "one warp's k-range");
#pragma unroll
  for (int i = kFirst; i < kLast; i += 2) {
    uint32_t b[4];
    ldmatrix_x4(b, k_addr + i * 16 * 2);
    if (i < kNopeSteps) {
      mma_bf16(nope[0], q[i - kFirst], b[0], b[1]);
      mma_bf16(nope[1], q[i + 1 - kFirst], b[2], b[3]);
    } else {
      mma_bf16(pe, q[i - kFirst], b[0], b[1]);
      mma_bf16(pe, q[i + 1 - kFirst], b[2], b[3]);
    }
  }
}

// Warp w scores the slots of n-tile w % kSlotGroups over k-range w / kSlotGroups and writes
// its unscaled partial logits into plane w / kSlotGroups of `logits` (-inf at padding slots:
// their key rows hold stale bytes, so they are selected away, never multiplied).
__device__ __forceinline__ void score_tile(Shared& sh, int stage, float (&logits)[kKSplits][kHeads][kLogitStride],
                                           const uint32_t (&q)[kQStepsPerWarp][4]) {
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  const int group = warp % kSlotGroups;
  const int range = warp / kSlotGroups;
  const int g = lane / 4;
  const int tig = lane % 4;
  const uint32_t k_addr = smem_addr(&sh.kv[stage][group * kSlotsPerGroup + lane % 8][(lane / 8) * 8]);
  float nope[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}}, pe[4] = {0.f, 0.f, 0.f, 0.f};
  static_assert(kKSplits == 1 || kKSplits == 2, "one or two k-ranges (the dispatch below)");
  if constexpr (kKSplits == 1) {
    score_steps<0, kQSteps>(k_addr, q, nope, pe);
  } else if (range == 0) {
    score_steps<0, kQStepsPerWarp>(k_addr, q, nope, pe);
  } else {
    score_steps<kQStepsPerWarp, kQSteps>(k_addr, q, nope, pe);
  }
  const int slot = group * kSlotsPerGroup + 2 * tig;
  const bool valid0 = sh.slot_ids[stage][slot] >= 0;
  const bool valid1 = sh.slot_ids[stage][slot + 1] >= 0;
  float x[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) x[i] = ((i % 2 == 0) ? valid0 : valid1) ? (nope[0][i] + nope[1][i]) + pe[i] : neg_inf();
  *reinterpret_cast<float2*>(&logits[range][g][slot]) = make_float2(x[0], x[1]);
  *reinterpret_cast<float2*>(&logits[range][g + 8][slot]) = make_float2(x[2], x[3]);
}

// The online softmax step and P.V of a scored tile (its logits complete in `logits`). Every
// warp computes the whole tile's softmax itself: each thread reads the logits at the positions
// of its P fragments (heads g and g + 8; slots 16 kk + 2 tig + {0, 1, 8, 9}), so a quad covers
// the tile's slots, the row maxima and sums are quad shuffles, and P never leaves registers.
// All warps compute identical (m, l) from the same values in the same order.
__device__ __forceinline__ void fold_tile(const Shared& sh, int stage, const float (&logits)[kKSplits][kHeads][kLogitStride], float qk_scale_log2,
                                          RowState& st, float (&o)[kColTiles][4]) {
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  const int g = lane / 4;
  const int tig = lane % 4;
  // s[kk][f]: fragment register f of P.V k-step kk (head g + 8 (f % 2), slots 16 kk + 2 tig + 8 (f / 2) + {0, 1}).
  float2 s[kPSteps][4];
  float tile_max[2] = {neg_inf(), neg_inf()};
#pragma unroll
  for (int kk = 0; kk < kPSteps; ++kk) {
#pragma unroll
    for (int f = 0; f < 4; ++f) {
      const int head = g + 8 * (f % 2);
      const int slot = 16 * kk + 2 * tig + 8 * (f / 2);
      float2 x = *reinterpret_cast<const float2*>(&logits[0][head][slot]);
#pragma unroll
      for (int r = 1; r < kKSplits; ++r) {
        const float2 y = *reinterpret_cast<const float2*>(&logits[r][head][slot]);
        x.x += y.x;
        x.y += y.y;
      }
      s[kk][f] = make_float2(x.x * qk_scale_log2, x.y * qk_scale_log2);
      tile_max[f % 2] = fmaxf(tile_max[f % 2], fmaxf(s[kk][f].x, s[kk][f].y));
    }
  }
  // A head with no valid slot yet keeps max -inf; 0 as its reference avoids -inf - -inf.
  float alpha[2], ref[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float m_new = fmaxf(st.m[r], quad_max(tile_max[r]));
    ref[r] = m_new == neg_inf() ? 0.f : m_new;
    alpha[r] = fast_exp2(st.m[r] - ref[r]);
    st.m[r] = m_new;
  }
  uint32_t p[kPSteps][4];  // A fragments of P (bf16)
  float sum[2] = {0.f, 0.f};
#pragma unroll
  for (int kk = 0; kk < kPSteps; ++kk) {
#pragma unroll
    for (int f = 0; f < 4; ++f) {
      const float lo = fast_exp2(s[kk][f].x - ref[f % 2]);
      const float hi = fast_exp2(s[kk][f].y - ref[f % 2]);
      sum[f % 2] += lo + hi;
      p[kk][f] = pack_bf16x2(lo, hi);
    }
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) st.l[r] = st.l[r] * alpha[r] + quad_sum(sum[r]);
#pragma unroll
  for (int j = 0; j < kColTiles; ++j) {
    o[j][0] *= alpha[0];
    o[j][1] *= alpha[0];
    o[j][2] *= alpha[1];
    o[j][3] *= alpha[1];
  }

  // P.V: B = the tile's ckv rows transposed by ldmatrix.trans (lane -> slot lane % 8 + 8 *
  // ((lane / 8) % 2), column offset 8 * (lane / 16): two n-tiles per load).
  const uint32_t v_addr = smem_addr(&sh.kv[stage][lane % 8 + ((lane / 8) % 2) * 8][warp * kColsPerWarp + (lane / 16) * 8]);
#pragma unroll
  for (int kk = 0; kk < kPSteps; ++kk) {
#pragma unroll
    for (int j = 0; j < kColTiles; j += 2) {
      uint32_t b[4];
      ldmatrix_x4_trans(b, v_addr + (16 * kk * kRowStride + j * 8) * 2);
      mma_bf16(o[j], p[kk], b[0], b[1]);
      mma_bf16(o[j + 1], p[kk], b[2], b[3]);
    }
  }
}

// The id of tile `tile` from the per-tile ids (a register array: unrolled select, no local memory).
__device__ __forceinline__ int tile_id(const int (&ids)[kMaxTiles], int tile) {
  int id = -1;
#pragma unroll
  for (int i = 0; i < kMaxTiles; ++i) id = i == tile ? ids[i] : id;
  return id;
}

__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory"); }

// Program (s, t): token t over slots s, s + S, ...; leaves the split's softmax state in `st` and
// its unnormalised output in `o` (this warp's 16 x 64 columns, accumulator layout).
// `cluster_handshake`: finish the cluster barrier phase the caller arrived at while the first
// tiles are in flight (its wait is hidden behind their round trip).
__device__ __forceinline__ void attend_split(Shared& sh, const AttentionArgs& a, int t, int s, RowState& st, float (&o)[kColTiles][4],
                                             bool cluster_handshake) {
  const int splits = a.splits;
  const int split_slots = kTopK / splits;
  const int tiles = (split_slots + kTileSlots - 1) / kTileSlots;
  const int row = threadIdx.x / kThreadsPerRow;
  const int32_t* idx_row = a.indices + t * a.indices_t;

  // This thread's slot id in every tile, all loads issued together and first: they are the
  // head of the longest dependent chain (ids -> row addresses -> gather).
  int ids[kMaxTiles];
#pragma unroll
  for (int i = 0; i < kMaxTiles; ++i) {
    const int j = i * kTileSlots + row;
    ids[i] = i < tiles && j < split_slots ? __ldg(idx_row + static_cast<int64_t>(j) * splits + s) : -1;
  }
  // Q does not depend on the ids: its copy (one cp.async group) is issued while they are in flight.
  for (int c = threadIdx.x; c < kHeads * kRowChunks; c += kThreads) {
    const int h = c / kRowChunks;
    const int chunk = c % kRowChunks;
    const uint16_t* src = chunk < kCkvChunks ? a.q_nope + t * a.q_nope_t + h * a.q_nope_h + chunk * kChunk
                                             : a.q_pe + t * a.q_pe_t + h * a.q_pe_h + (chunk - kCkvChunks) * kChunk;
    cp_async16(&sh.q[h][chunk * kChunk], src, 16);
  }
  cp_async_commit();
  if (threadIdx.x == 0) {
    for (int i = 0; i < kStages; ++i) mbarrier_init(&sh.full[i], kThreads);
    fence_mbarrier_init();
  }
  // Tiles after the last one holding a valid slot are skipped: `active` is the block's maximum
  // of each thread's last valid tile + 1, by warp reductions and one block barrier (which also
  // publishes the mbarrier initialisation).
  int active = 0;
#pragma unroll
  for (int i = 0; i < kMaxTiles; ++i) active = ids[i] >= 0 ? i + 1 : active;
  active = static_cast<int>(__reduce_max_sync(kFullMask, static_cast<unsigned>(active)));
  if (threadIdx.x % kWarpSize == 0) sh.warp_active[threadIdx.x / kWarpSize] = active;
  __syncthreads();
#pragma unroll
  for (int w = 0; w < kWarps; ++w) active = max(active, sh.warp_active[w]);
  stamp(a, t, s, kPhaseIdsCycles);

  // Tile k is requested once its stage is free (every warp past tile k - kStages) and either
  // tile k - 1 has landed or gather_lag cycles have passed since tile k - 1 was requested. Lag 0
  // puts up to kStages tiles in flight at once (latency-bound calls: they land after one round
  // trip). On a bandwidth-bound call every program's tiles land together at the end of the
  // whole gather, and their math follows it; a lag lets the earlier tiles take the bandwidth
  // first, so their math overlaps the later tiles' gather and only the last tile's math follows
  // the gather. Each thread decides by its own clock: requesting is per-thread work (its row's
  // copy and its arrival), so no block barrier is needed.
  int requested = 0;           // tiles this thread has requested
  int done = 0;                // tiles every warp is finished with (their stages are free)
  long long last_request = 0;  // when it requested the latest one (SM cycles)
  auto request_due = [&]() {
    while (requested < active && requested < done + kStages) {
      if (requested > 0) {
        const int prev = requested - 1;
        const bool landed = mbarrier_done(&sh.full[prev % kStages], (prev / kStages) % 2);
        if (!landed && clock64() - last_request < a.gather_lag) return;
      }
      issue_tile(sh, a, tile_id(ids, requested), requested % kStages);
      last_request = clock64();
      ++requested;
    }
  };
  request_due();
  if (cluster_handshake) cluster_wait();

  st = RowState{{neg_inf(), neg_inf()}, {0.f, 0.f}};
#pragma unroll
  for (int j = 0; j < kColTiles; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
  // A fragments of Q over this warp's logit k-range: lane -> row lane % 16, column half lane / 16.
  uint32_t q[kQStepsPerWarp][4];

  // Q's fragments move to registers while the first tile is still on its way (the 8 warps'
  // shared-memory reads would otherwise follow its arrival).
  cp_async_wait<0>();
  __syncthreads();  // every thread's Q chunks visible to every warp
  if (active > 0) {
    const int first_step = threadIdx.x / kWarpSize / kSlotGroups * kQStepsPerWarp;
    const uint32_t q_addr = smem_addr(&sh.q[threadIdx.x % kWarpSize % 16][first_step * 16 + (threadIdx.x % kWarpSize / 16) * 8]);
#pragma unroll
    for (int i = 0; i < kQStepsPerWarp; ++i) ldmatrix_x4(q[i], q_addr + i * 16 * 2);
  }
  // Tile i is the (i / kStages)-th use of its stage: that use's mbarrier phase has parity
  // (i / kStages) % 2. One block barrier per tile, between its scoring and its folding: past
  // it the tile's logits are complete and every warp has folded tile i - 1, so that tile's
  // stage may be requested again. The logits are double-buffered by tile parity: a warp
  // writes tile i + 2's only past tile i + 1's barrier, when every warp has folded tile i.
  for (int tile = 0; tile < active; ++tile) {
    const int stage = tile % kStages;
    const uint32_t parity = (tile / kStages) % 2;
    while (requested < active && requested < done + kStages && !mbarrier_done(&sh.full[stage], parity)) request_due();
    mbarrier_wait(&sh.full[stage], parity);
    if (tile == 0) stamp(a, t, s, kPhaseFirstTileCycles);
    float(&logits)[kKSplits][kHeads][kLogitStride] = sh.logits[tile % 2];
    score_tile(sh, stage, logits, q);
    __syncthreads();
    done = tile;
    request_due();
    fold_tile(sh, stage, logits, a.qk_scale_log2, st, o);
  }
  stamp(a, t, s, kPhaseAttendedCycles);
}

// Accumulator position of this thread: warp, row g (heads g and g + 8), column pair tig.
struct Fragment {
  int lane, warp, g, tig;
  __device__ Fragment()
      : lane(threadIdx.x % kWarpSize), warp(threadIdx.x / kWarpSize), g(threadIdx.x % kWarpSize / 4), tig(threadIdx.x % 4) {}
  // Index of this thread's n-tile j among the token's kUnits accumulator units.
  __device__ int unit(int j) const { return (warp * kColTiles + j) * kWarpSize + lane; }
};

// ---------------------------------------------------------------- partials and the combine
// A split's partial: unit (warp, n-tile j, lane) = {bf16 pair of head g, bf16 pair of head g + 8}
// at value columns 64 * warp + 8 * j + 2 * tig, divided by l (0 without a valid slot), and per
// head pair g its lse = m + log2 l (-inf without a valid slot). Sinks take them to where the
// combine reads them; every tig == 0 lane of every warp holds its pair's lse (the running (m, l)
// are block-wide), so `warp` lets a sink spread lse copies over the warps.

// Global memory, read back by the combine through L2 (the ticket barrier and the second launch).
struct GlobalSink {
  uint2* units;      // this split's kUnits units
  float2* lse_pairs;  // this split's kLsePairs lse pairs
  __device__ GlobalSink(const AttentionArgs& a, int t, int s)
      : units(reinterpret_cast<uint2*>(a.part_out) + (static_cast<int64_t>(t) * a.splits + s) * kUnits),
        lse_pairs(reinterpret_cast<float2*>(a.part_lse) + (static_cast<int64_t>(t) * a.splits + s) * kLsePairs) {}
  __device__ void put_unit(int unit, uint2 bits) const { units[unit] = bits; }
  __device__ void put_lse_pair(int g, float2 pair, int warp) const {
    if (warp == 0) lse_pairs[g] = pair;
  }
};

// Slices of one owner's share, split by split: kUnits / S units, then kLsePairs lse pairs.
struct Slices {
  uint2* base;      // slice 0
  int shift;        // log2 of per_program
  int per_program;  // units each program combines
  __device__ Slices(uint2* b, int S) : base(b), shift(share_shift(S)), per_program(1 << share_shift(S)) {}
  __device__ int slice_units() const { return per_program + kLsePairs; }
  __device__ uint2* slice(int i) const { return base + i * slice_units(); }
  __device__ uint2* lse_pair(int i, int g) const { return slice(i) + per_program + g; }
};

template <class Sink>
__device__ __forceinline__ void store_partial(const Sink& sink, const RowState& st, const float (&o)[kColTiles][4]) {
  const Fragment f;
  float inv_l[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) inv_l[r] = st.l[r] > 0.f ? fast_rcp(st.l[r]) : 0.f;
#pragma unroll
  for (int j = 0; j < kColTiles; ++j) {
    sink.put_unit(f.unit(j), make_uint2(pack_bf16x2(o[j][0] * inv_l[0], o[j][1] * inv_l[0]), pack_bf16x2(o[j][2] * inv_l[1], o[j][3] * inv_l[1])));
  }
  if (f.tig == 0) {
    const float lse_lo = st.l[0] > 0.f ? st.m[0] + fast_log2(st.l[0]) : neg_inf();
    const float lse_hi = st.l[1] > 0.f ? st.m[1] + fast_log2(st.l[1]) : neg_inf();
    sink.put_lse_pair(f.g, make_float2(lse_lo, lse_hi), f.warp);
  }
}

// What one combining thread reads: one unit and one lse pair of each of its splits.
struct SplitPartials {
  uint2 bits[kCombineSplitsPerThread];
  float2 lse[kCombineSplitsPerThread];  // (head g, head g + 8)
};

// A combining thread's place in program s's share of a token (S splits): units
// [s * kUnits / S, (s + 1) * kUnits / S), each merged from the S partials by S / 8 threads in
// adjacent lanes (`block`: which 8 splits), so the blocks merge by warp shuffles.
template <int S>
struct Share {
  static_assert(S >= kMinSplits && S <= kMaxSplits && (S & (S - 1)) == 0, "power-of-two split counts");
  static constexpr int kPerProgram = kUnits / S;
  static constexpr int kBlocks = S / kCombineSplitsPerThread;
  static_assert(kPerProgram * kBlocks == kThreads, "one unit and kCombineSplitsPerThread splits per thread");
  static_assert(kBlocks <= kWarpSize && kPerProgram >= kLsePairs, "a unit's blocks share a warp; a slice's lse pairs have readers");
  int local;  // unit within the share
  int block;  // splits 8 * block .. 8 * block + 7
  int unit;   // unit within the token
  int g;      // heads g and g + 8
  int d;      // the unit's first value column
  __device__ explicit Share(int s)
      : local(static_cast<int>(threadIdx.x) / kBlocks), block(static_cast<int>(threadIdx.x) % kBlocks), unit(s * kPerProgram + local) {
    const int lane = unit % kWarpSize;
    g = lane / 4;
    d = unit / (kWarpSize * kColTiles) * kColsPerWarp + unit / kWarpSize % kColTiles * 8 + 2 * (lane % 4);
  }
  __device__ int first_split() const { return block * kCombineSplitsPerThread; }
};

// The weighted mean of the S partials (weights 2^(lse_split - lse_max) per head) of this
// thread's unit: the blocks of a unit merge by shuffles, block 0 stores the output (and, for
// the unit at column 0, the lse).
template <int S>
__device__ __forceinline__ void merge_and_store(const AttentionArgs& a, int t, const Share<S>& share, const SplitPartials& p) {
  float top_lo = neg_inf(), top_hi = neg_inf();
#pragma unroll
  for (int k = 0; k < kCombineSplitsPerThread; ++k) {
    top_lo = fmaxf(top_lo, p.lse[k].x);
    top_hi = fmaxf(top_hi, p.lse[k].y);
  }
#pragma unroll
  for (int m = 1; m < Share<S>::kBlocks; m *= 2) {
    top_lo = fmaxf(top_lo, __shfl_xor_sync(kFullMask, top_lo, m));
    top_hi = fmaxf(top_hi, __shfl_xor_sync(kFullMask, top_hi, m));
  }
  // A head without any valid slot has max -inf: 0 as the reference keeps every weight 0, not NaN.
  const float ref_lo = top_lo == neg_inf() ? 0.f : top_lo;
  const float ref_hi = top_hi == neg_inf() ? 0.f : top_hi;
  float sums[6] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f};  // outputs lo.x, lo.y, hi.x, hi.y; totals lo, hi
#pragma unroll
  for (int k = 0; k < kCombineSplitsPerThread; ++k) {
    const float w_lo = fast_exp2(p.lse[k].x - ref_lo);
    const float w_hi = fast_exp2(p.lse[k].y - ref_hi);
    const float2 lo = unpack_bf16x2(p.bits[k].x);
    const float2 hi = unpack_bf16x2(p.bits[k].y);
    sums[0] += w_lo * lo.x;
    sums[1] += w_lo * lo.y;
    sums[2] += w_hi * hi.x;
    sums[3] += w_hi * hi.y;
    sums[4] += w_lo;
    sums[5] += w_hi;
  }
#pragma unroll
  for (int m = 1; m < Share<S>::kBlocks; m *= 2) {
#pragma unroll
    for (int i = 0; i < 6; ++i) sums[i] += __shfl_xor_sync(kFullMask, sums[i], m);
  }
  if (share.block != 0) return;
  const float scale_lo = sums[4] > 0.f ? fast_rcp(sums[4]) : 0.f;
  const float scale_hi = sums[5] > 0.f ? fast_rcp(sums[5]) : 0.f;
  uint16_t* out_lo = a.out + t * a.out_t + share.g * a.out_h + share.d;
  *reinterpret_cast<uint32_t*>(out_lo) = pack_bf16x2(sums[0] * scale_lo, sums[1] * scale_lo);
  *reinterpret_cast<uint32_t*>(out_lo + 8 * a.out_h) = pack_bf16x2(sums[2] * scale_hi, sums[3] * scale_hi);
  if (share.d == 0) {
    a.lse[t * a.lse_t + share.g] = sums[4] > 0.f ? ref_lo + fast_log2(sums[4]) : neg_inf();
    a.lse[t * a.lse_t + share.g + 8] = sums[5] > 0.f ? ref_hi + fast_log2(sums[5]) : neg_inf();
  }
}

// The token's partials in global memory, written by other SMs of this launch or of the previous
// one, so read through L2 (ld.cg), never a stale L1 line.
struct GlobalSource {
  const uint2* units;      // the token's S x kUnits units
  const float2* lse_pairs;  // the token's S x kLsePairs lse pairs
  __device__ GlobalSource(const AttentionArgs& a, int t)
      : units(reinterpret_cast<const uint2*>(a.part_out) + static_cast<int64_t>(t) * a.splits * kUnits),
        lse_pairs(reinterpret_cast<const float2*>(a.part_lse) + static_cast<int64_t>(t) * a.splits * kLsePairs) {}
  template <int S>
  __device__ void load(const Share<S>& share, SplitPartials& p) const {
    const uint2* u = units + share.first_split() * kUnits + share.unit;
    const float2* l = lse_pairs + share.first_split() * kLsePairs + share.g;
#pragma unroll
    for (int k = 0; k < kCombineSplitsPerThread; ++k) {
      p.bits[k] = __ldcg(u + k * kUnits);
      p.lse[k] = __ldcg(l + k * kLsePairs);
    }
  }
};

// Program s's share of token t, from `source` (S a template argument: the share arithmetic is
// shifts and immediates).
template <int S, class Source>
__device__ __forceinline__ void combine_share(const AttentionArgs& a, int t, int s, const Source& source) {
  const Share<S> share(s);
  SplitPartials p;
  source.load(share, p);
  stamp(a, t, s, kPhaseReleasedCycles);
  merge_and_store(a, t, share, p);
  stamp(a, t, s, kPhaseCombinedCycles);
}

template <class Source>
__device__ __forceinline__ void combine_share(const AttentionArgs& a, int t, int s, const Source& source) {
  switch (a.splits) {
    case 8: combine_share<8>(a, t, s, source); break;
    case 16: combine_share<16>(a, t, s, source); break;
    case 32: combine_share<32>(a, t, s, source); break;
    default: combine_share<64>(a, t, s, source); break;
  }
  static_assert(kMinSplits == 8 && kMaxSplits == 64, "the split counts dispatched above");
}

__device__ __forceinline__ unsigned load_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void add_release(unsigned* p, unsigned v) {
  asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__global__ void __launch_bounds__(kThreads, 1) split_kernel(AttentionArgs a, bool fused) {
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  Shared& sh = *reinterpret_cast<Shared*>(shared_bytes);
  const int s = blockIdx.x;
  const int t = blockIdx.y;
  unsigned* ticket_word = reinterpret_cast<unsigned*>(a.sync) + static_cast<int64_t>(t) * kSyncStride;
  stamp(a, t, s, kPhaseEntryNs);
  stamp(a, t, s, kPhaseEntryCycles);
  // Ticket barrier per token: one word that only grows (modulo 2^32), never reset. Every call
  // advances it by kTicketsPerCall in all, each of its S programs by kTicketsPerCall / S, so a
  // call starts on a multiple of kTicketsPerCall whatever the split counts of earlier calls,
  // and its episode ends at the next multiple. Read here, before this program's arrival, the
  // word holds the call's start plus fewer than kTicketsPerCall arrivals, so rounding it down
  // gives the start. The word is copied into shared memory with Q's copies (cp.async, through
  // L2) and read only at the barrier: no thread waits for this cold load before its gathers
  // (a register load's first use was scheduled right after it, stalling warp 0 for a round trip).
  // kTicketsPerCall divides 2^32, so wrapping around keeps episodes aligned; calls on a stream
  // run one after another, so episodes never interleave.
  if (fused && threadIdx.x == 0) cp_async16(sh.ticket, ticket_word, 16);  // joins Q's copy group (attend_split waits for it)

  RowState st;
  float o[kColTiles][4];
  attend_split(sh, a, t, s, st, o, false);
  store_partial(GlobalSink(a, t, s), st, o);
  stamp(a, t, s, kPhasePartialCycles);
  if (!fused) {
    stamp(a, t, s, kPhaseExitNs);
    return;
  }

  // Arrival: a release reduction (no reply to wait for), then loads until the episode ends. The
  // block barrier orders every thread's partial stores before thread 0's release, which makes
  // them visible before its arrival; the acquire load that sees the episode end, then the block
  // barrier, order the combine's loads after everyone's arrival.
  __syncthreads();
  if (threadIdx.x == 0) {
    add_release(ticket_word, kTicketsPerCall / static_cast<unsigned>(a.splits));
    const unsigned episode_end = (sh.ticket[0] / kTicketsPerCall + 1u) * kTicketsPerCall;
    while (static_cast<int>(load_acquire(ticket_word) - episode_end) < 0) {
    }
  }
  __syncthreads();
  combine_share(a, t, s, GlobalSource(a, t));
  stamp(a, t, s, kPhaseExitNs);
}

__global__ void __launch_bounds__(kThreads) combine_kernel(AttentionArgs a) { combine_share(a, blockIdx.y, blockIdx.x, GlobalSource(a, blockIdx.y)); }

// ---------------------------------------------------------------- cluster combine
// The token's S programs are one thread-block cluster (S <= kMaxClusterSplits). A program that
// has attended its slots writes its partial into its own shared memory as the owners' slices
// (Slices layout) and bulk-copies each into its owner's inbox (distributed shared memory, one
// TMA copy per owner). Each owner's inbox mbarrier expects all S slices' bytes, so waiting on it
// replaces the global-memory barrier; the combine then reads only local shared memory. Copies
// from fast programs land while slow ones still gather.

__device__ __forceinline__ uint32_t cluster_addr(const void* p, int rank) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(smem_addr(p)), "r"(rank));
  return remote;
}
// Bulk copy of `bytes` from this program's shared memory into program `rank`'s (dst and bar are
// this program's addresses of the same objects, mapped to `rank`).
__device__ __forceinline__ void bulk_copy_to_peer(const void* dst, const void* src, uint32_t bytes, const uint64_t* bar, int rank) {
  asm volatile("cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(cluster_addr(dst, rank)),
               "r"(smem_addr(src)), "r"(bytes), "r"(cluster_addr(bar, rank))
               : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void bulk_wait_read() { asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory"); }

// Writes the partial into the outgoing slices (slice i: owner i's units and this split's lse).
struct StagingSink {
  Slices out;
  int splits;
  __device__ StagingSink(uint2* staging, int S) : out(staging, S), splits(S) {}
  __device__ void put_unit(int unit, uint2 bits) const { out.slice(unit >> out.shift)[unit & (out.per_program - 1)] = bits; }
  __device__ void put_lse_pair(int g, float2 pair, int warp) const {
    for (int owner = warp; owner < splits; owner += kWarps) *reinterpret_cast<float2*>(out.lse_pair(owner, g)) = pair;
  }
};

// Reads this program's share from its inbox (slice i: split i's partial), once it is complete.
struct ClusterInbox {
  Slices in;
  uint64_t* full;  // the inbox mbarrier
  template <int S>
  __device__ void load(const Share<S>& share, SplitPartials& p) const {
    mbarrier_wait(full, 0);
#pragma unroll
    for (int k = 0; k < kCombineSplitsPerThread; ++k) {
      p.bits[k] = in.slice(share.first_split() + k)[share.local];
      p.lse[k] = *reinterpret_cast<const float2*>(in.lse_pair(share.first_split() + k, share.g));
    }
  }
};

static_assert((kUnits / kMaxClusterSplits + kLsePairs) * 8 % 16 == 0 && (kUnits / kMinSplits + kLsePairs) * 8 % 16 == 0,
              "slices are whole 16-byte bulk-copy units");
static_assert(kInboxUnits * sizeof(uint2) <= sizeof(Shared::kv), "the outgoing slices fit the gather buffers");

// Hardware cluster barrier, split in its two halves (every thread of every program takes part).
__device__ __forceinline__ void cluster_arrive_relaxed() { asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory"); }

// Grid (S, T) in clusters of (S, 1): cluster t is token t, its rank s the split.
__global__ void __launch_bounds__(kThreads, 1) cluster_kernel(AttentionArgs a) {
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  Shared& sh = *reinterpret_cast<Shared*>(shared_bytes);
  const int s = blockIdx.x;
  const int t = blockIdx.y;
  const int splits = a.splits;
  stamp(a, t, s, kPhaseEntryNs);
  stamp(a, t, s, kPhaseEntryCycles);
  const Slices inbox(sh.inbox, splits);
  if (threadIdx.x == 0) {  // the inbox completes when all S slices have landed
    mbarrier_init(&sh.inbox_full, 1);
    mbarrier_arrive_expect_tx(&sh.inbox_full, splits * inbox.slice_units() * sizeof(uint2));
    fence_mbarrier_init();
  }
  // Peers may copy into this program only once it runs and its inbox barrier is initialised:
  // the cluster barrier's phase says so (arrived now, waited for inside attend_split, behind
  // the first tiles' round trip).
  cluster_arrive_relaxed();
  RowState st;
  float o[kColTiles][4];
  attend_split(sh, a, t, s, st, o, true);

  // The gather buffers are free once every warp has folded its last tile: the outgoing slices go there.
  __syncthreads();
  uint2* staging = reinterpret_cast<uint2*>(&sh.kv[0][0][0]);
  const Slices out(staging, splits);
  store_partial(StagingSink(staging, splits), st, o);
  fence_proxy_async();  // the slices' generic writes, before the bulk copies read them
  __syncthreads();
  if (threadIdx.x < splits) {
    const int owner = threadIdx.x;
    bulk_copy_to_peer(inbox.slice(s), out.slice(owner), out.slice_units() * sizeof(uint2), &sh.inbox_full, owner);
    bulk_commit();
  }
  stamp(a, t, s, kPhasePartialCycles);
  const ClusterInbox source{inbox, &sh.inbox_full};
  if (splits == 8) {
    combine_share<8>(a, t, s, source);
  } else {
    combine_share<16>(a, t, s, source);
  }
  static_assert(kMaxClusterSplits == 16, "the cluster split counts dispatched above");
  if (threadIdx.x < splits) bulk_wait_read();  // the slices stay until the copies have read them
  stamp(a, t, s, kPhaseExitNs);
}

constexpr int kMaxDevices = 64;

// Opts the kernels in to their dynamic shared memory and the cluster kernel to clusters of 16
// (beyond the portable 8), once per device.
cudaError_t prepare(int device) {
  static bool done[kMaxDevices] = {false};
  if (device >= 0 && device < kMaxDevices && done[device]) return cudaSuccess;
  const int bytes = static_cast<int>(sizeof(Shared));
  cudaError_t err = cudaFuncSetAttribute(split_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (err == cudaSuccess) err = cudaFuncSetAttribute(cluster_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (err == cudaSuccess) err = cudaFuncSetAttribute(cluster_kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  if (err == cudaSuccess && device >= 0 && device < kMaxDevices) done[device] = true;
  return err;
}

cudaError_t current_device_prepared(int* device) {
  cudaError_t err = cudaGetDevice(device);
  return err == cudaSuccess ? prepare(*device) : err;
}

// Launch configuration of the cluster kernel (`attribute` must outlive `config`).
cudaLaunchConfig_t cluster_config(int splits, int tokens, cudaStream_t stream, cudaLaunchAttribute* attribute) {
  attribute->id = cudaLaunchAttributeClusterDimension;
  attribute->val.clusterDim.x = static_cast<unsigned>(splits);
  attribute->val.clusterDim.y = 1;
  attribute->val.clusterDim.z = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(splits, tokens);
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = sizeof(Shared);
  config.stream = stream;
  config.attrs = attribute;
  config.numAttrs = 1;
  return config;
}

bool valid_splits(int splits, int most) { return splits >= kMinSplits && splits <= most && (splits & (splits - 1)) == 0; }

}  // namespace

cudaError_t resident_programs(int* programs) {
  int device = 0;
  cudaError_t err = current_device_prepared(&device);
  if (err != cudaSuccess) return err;
  int sms = 0;
  err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (err != cudaSuccess) return err;
  int per_sm = 0;
  err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, split_kernel, kThreads, sizeof(Shared));
  if (err != cudaSuccess) return err;
  *programs = per_sm * sms;
  return cudaSuccess;
}

cudaError_t resident_clusters(int splits, int* clusters) {
  if (!valid_splits(splits, kMaxClusterSplits)) return cudaErrorInvalidValue;
  int device = 0;
  const cudaError_t err = current_device_prepared(&device);
  if (err != cudaSuccess) return err;
  cudaLaunchAttribute attribute;
  const cudaLaunchConfig_t config = cluster_config(splits, 1, nullptr, &attribute);
  return cudaOccupancyMaxActiveClusters(clusters, cluster_kernel, &config);
}

cudaError_t launch_sparse_attention(const AttentionArgs& args, Combine combine, cudaStream_t stream, Launch* used) {
  const int most = combine == Combine::kCluster ? kMaxClusterSplits : kMaxSplits;
  if (!valid_splits(args.splits, most) || args.gather_lag < 0) return cudaErrorInvalidValue;
  if (args.tokens <= 0) return cudaSuccess;
  if (combine == Combine::kCluster) {
    int device = 0;
    const cudaError_t err = current_device_prepared(&device);
    if (err != cudaSuccess) return err;
    cudaLaunchAttribute attribute;
    const cudaLaunchConfig_t config = cluster_config(args.splits, args.tokens, stream, &attribute);
    *used = Launch::kCluster;
    return cudaLaunchKernelEx(&config, cluster_kernel, args);
  }
  int resident = 0;
  const cudaError_t err = resident_programs(&resident);
  if (err != cudaSuccess) return err;
  const bool fused = combine == Combine::kBarrier && static_cast<long long>(args.tokens) * args.splits <= resident;
  const dim3 grid(args.splits, args.tokens);
  split_kernel<<<grid, kThreads, sizeof(Shared), stream>>>(args, fused);
  if (!fused) combine_kernel<<<grid, kThreads, 0, stream>>>(args);
  *used = fused ? Launch::kFused : Launch::kTwoLaunch;
  return cudaGetLastError();
}

}  // namespace dsa_attention
