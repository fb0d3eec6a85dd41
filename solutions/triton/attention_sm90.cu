// Sparse MLA attention for Hopper, hand-written: split-K over the 2048 selected slots, the
// combine in the same launch. Pure CUDA (no torch): it builds alone with
//   nvcc -arch=sm_90a -c attention_sm90.cu
// and links into the torch extension next to attention_binding.cpp.
//
// Grid (S splits, T tokens), 8 warps per program. Program (s, t) owns the slots s, s + S,
// s + 2S, ... of token t (strided: valid slots cluster at the front of a row) and walks them in
// tiles of 64 slots:
//   gather  cp.async copies each slot's ckv row (1024 B) and kpe row (128 B) into one shared row;
//           two tiles are in flight at once, padding slots are zero-filled without a read.
//   logits  warp w scores slots 8w..8w+7 of the tile against the 16 heads with mma.sync
//           m16n8k16 (bf16 in, fp32 accumulate): q_nope.ckv and q_pe.kpe in separate accumulators.
//   softmax log2 domain (scale pre-multiplied by log2 e); the tile's row maxima and sums go
//           through shared memory, so every warp holds the same running (m, l) per head.
//   P.V     P (bf16) from shared memory times the tile's ckv rows; warp w owns value columns
//           64w..64w+63 (8 accumulator tiles), so the 16 x 512 output is spread over the block.
// Then the program writes its partial (output / l in bf16, lse = m + log2 l) and, in the fused
// launch, waits at the token's barrier; after it, program s combines its 1/S share of the token's
// 16 x 512 outputs from all S partials. The barrier needs every program of the grid resident at
// once (the host checks with the occupancy calculator; else it launches the combine separately).
#include "attention_sm90.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace dsa_attention {
namespace {

constexpr int kWarpSize = 32;
constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kWarps = 8;
constexpr int kThreads = kWarps * kWarpSize;
constexpr int kDQk = kDCkv + kDKpe;                      // 576: one gathered slot row
constexpr int kTileSlots = 64;                           // slots gathered and scored together
constexpr int kStages = 2;                               // tiles in flight
constexpr int kMaxTiles = kTopK / kMinSplits / kTileSlots;  // tiles of the longest split
// 16 bytes of padding per shared row: rows 1168 B apart put the 8 rows of one ldmatrix in 8
// different 16-byte bank groups (unpadded, 1152 B = 9 x 128 B would make it an 8-way conflict).
constexpr int kRowPad = 8;
constexpr int kRowStride = kDQk + kRowPad;               // bf16 per shared slot row
constexpr int kPStride = kTileSlots + kRowPad;           // bf16 per shared row of P
constexpr int kChunk = 8;                                // bf16 per 16-byte cp.async
constexpr int kCkvChunks = kDCkv / kChunk;
constexpr int kRowChunks = kDQk / kChunk;
constexpr int kThreadsPerRow = kThreads / kTileSlots;    // threads gathering one slot row
constexpr int kChunksPerThread = kRowChunks / kThreadsPerRow;
constexpr int kSlotsPerWarp = kTileSlots / kWarps;       // one mma n-tile of logits per warp
constexpr int kColsPerWarp = kDCkv / kWarps;             // value columns per warp
constexpr int kColTiles = kColsPerWarp / 8;              // mma n-tiles of output per warp
constexpr int kQSteps = kDQk / 16;                       // mma k-steps of a logit row
// Partials are stored in the accumulators' own order (see store_partial): one 8-byte unit per
// (warp, output n-tile, lane) holds a bf16 pair of head g and one of head g + 8.
constexpr int kUnits = kWarps * kColTiles * kWarpSize;   // units per token
constexpr int kCombineSplitsPerThread = 8;               // partials one combining thread reads

static_assert(kHeads == 16, "the heads are the M = 16 rows of every mma");
static_assert(kSlotsPerWarp == 8, "a warp scores one 8-slot n-tile");
static_assert(kDCkv % 32 == 0 && kDKpe % 32 == 0, "logit k-loops take two 16-wide k-steps at a time");
static_assert(kThreads % kTileSlots == 0 && kRowChunks % kThreadsPerRow == 0, "whole rows per thread group");
static_assert(kColTiles % 2 == 0, "ldmatrix.x4.trans loads two value n-tiles");
static_assert(kTileSlots % 16 == 0, "P.V k-steps of 16 slots");
static_assert((kRowStride * 2) % 16 == 0 && (kPStride * 2) % 16 == 0, "16-byte aligned shared rows");
static_assert(kTopK % kMaxSplits == 0 && (kTopK / kMaxSplits) % kSlotsPerWarp == 0, "splits hold whole n-tiles");
static_assert(kUnits * 4 == kHeads * kDCkv, "a unit holds 4 outputs");
static_assert(kUnits / kMaxSplits * (kMaxSplits / kCombineSplitsPerThread) == kThreads &&
              kUnits / kMinSplits * (kMinSplits / kCombineSplitsPerThread) == kThreads,
              "every split count gives each combining thread one unit and kCombineSplitsPerThread splits");
static_assert(kUnits / kMaxSplits >= kWarpSize, "a warp's combine loads cover consecutive units of one split");

struct Shared {
  uint16_t q[kHeads][kRowStride];
  uint16_t kv[kStages][kTileSlots][kRowStride];
  uint16_t p[kHeads][kPStride];
  float tile_max[kWarps][kHeads];
  float tile_sum[kWarps][kHeads];
  int32_t slot_ids[kStages][kTileSlots];
};

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }

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

__device__ __forceinline__ uint32_t smem_addr(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }

// 16-byte global -> shared copy; `bytes` 0 zero-fills the destination without reading.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, int bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
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

// Issues the copies of one tile's slot rows into stage `stage` (this thread: row tid / 4, every
// 4th 16-byte chunk of it) and records the row's id for the masks.
__device__ __forceinline__ void issue_tile(Shared& sh, const AttentionArgs& a, int id, int stage) {
  const int row = threadIdx.x / kThreadsPerRow;
  const int part = threadIdx.x % kThreadsPerRow;
  if (part == 0) sh.slot_ids[stage][row] = id;
  const bool valid = id >= 0;
  const int64_t page = valid ? id / kPageSize : 0;
  const int64_t slot = valid ? id % kPageSize : 0;
  const uint16_t* ckv_row = a.ckv + page * a.ckv_page + slot * a.ckv_slot;
  const uint16_t* kpe_row = a.kpe + page * a.kpe_page + slot * a.kpe_slot;
  uint16_t* dst = sh.kv[stage][row];
#pragma unroll
  for (int k = 0; k < kChunksPerThread; ++k) {
    const int c = part + k * kThreadsPerRow;
    const uint16_t* src = c < kCkvChunks ? ckv_row + c * kChunk : kpe_row + (c - kCkvChunks) * kChunk;
    cp_async16(dst + c * kChunk, src, valid ? 16 : 0);
  }
}

// Running softmax state of the two heads (rows g and g + 8) this thread's accumulators hold.
struct RowState {
  float m[2];  // running max of the log2-domain logits
  float l[2];  // running sum of 2^(logit - m)
};

// One tile: logits, online softmax step, P.V into `o` (this warp's 16 x 64 output columns).
__device__ __forceinline__ void attend_tile(Shared& sh, int stage, float qk_scale_log2, const uint32_t (&q)[kQSteps][4], RowState& st,
                                            float (&o)[kColTiles][4]) {
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  const int g = lane / 4;    // accumulator row (head g and g + 8)
  const int tig = lane % 4;  // accumulator column pair

  // Logits of slots 8w..8w+7: A = this thread's Q fragments (registers, loaded once per
  // program: re-reading Q from shared memory in every warp would move 8 x 18 KB per tile),
  // B = slot rows (lane -> slot lane % 8, k offset 8 * (lane / 8): four k-chunks = two k-steps).
  const uint32_t k_addr = smem_addr(&sh.kv[stage][warp * kSlotsPerWarp + lane % 8][(lane / 8) * 8]);
  float nope_even[4] = {0.f, 0.f, 0.f, 0.f}, nope_odd[4] = {0.f, 0.f, 0.f, 0.f}, pe[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
  for (int i = 0; i < kDCkv / 16; i += 2) {  // two independent chains: half the mma latency
    uint32_t b[4];
    ldmatrix_x4(b, k_addr + i * 16 * 2);
    mma_bf16(nope_even, q[i], b[0], b[1]);
    mma_bf16(nope_odd, q[i + 1], b[2], b[3]);
  }
#pragma unroll
  for (int i = kDCkv / 16; i < kQSteps; i += 2) {
    uint32_t b[4];
    ldmatrix_x4(b, k_addr + i * 16 * 2);
    mma_bf16(pe, q[i], b[0], b[1]);
    mma_bf16(pe, q[i + 1], b[2], b[3]);
  }
  const int slot = warp * kSlotsPerWarp + 2 * tig;
  const bool valid0 = sh.slot_ids[stage][slot] >= 0;
  const bool valid1 = sh.slot_ids[stage][slot + 1] >= 0;
  float s[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const bool valid = (i % 2 == 0) ? valid0 : valid1;
    s[i] = valid ? ((nope_even[i] + nope_odd[i]) + pe[i]) * qk_scale_log2 : neg_inf();
  }

  // Tile maxima per head across the warps.
  const float max_lo = quad_max(fmaxf(s[0], s[1]));
  const float max_hi = quad_max(fmaxf(s[2], s[3]));
  if (tig == 0) {
    sh.tile_max[warp][g] = max_lo;
    sh.tile_max[warp][g + 8] = max_hi;
  }
  __syncthreads();
  float m_new[2] = {st.m[0], st.m[1]};
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    m_new[0] = fmaxf(m_new[0], sh.tile_max[w][g]);
    m_new[1] = fmaxf(m_new[1], sh.tile_max[w][g + 8]);
  }
  // A head with no valid slot yet keeps max -inf; 0 as its reference avoids -inf - -inf.
  float alpha[2], ref[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    ref[r] = m_new[r] == neg_inf() ? 0.f : m_new[r];
    alpha[r] = exp2f(st.m[r] - ref[r]);
    st.m[r] = m_new[r];
  }
  float p[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) p[i] = exp2f(s[i] - ref[i / 2]);
  const float sum_lo = quad_sum(p[0] + p[1]);
  const float sum_hi = quad_sum(p[2] + p[3]);
  if (tig == 0) {
    sh.tile_sum[warp][g] = sum_lo;
    sh.tile_sum[warp][g + 8] = sum_hi;
  }
  *reinterpret_cast<uint32_t*>(&sh.p[g][slot]) = pack_bf16x2(p[0], p[1]);
  *reinterpret_cast<uint32_t*>(&sh.p[g + 8][slot]) = pack_bf16x2(p[2], p[3]);
  __syncthreads();
  float tile_sum[2] = {0.f, 0.f};
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    tile_sum[0] += sh.tile_sum[w][g];
    tile_sum[1] += sh.tile_sum[w][g + 8];
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) st.l[r] = st.l[r] * alpha[r] + tile_sum[r];
#pragma unroll
  for (int j = 0; j < kColTiles; ++j) {
    o[j][0] *= alpha[0];
    o[j][1] *= alpha[0];
    o[j][2] *= alpha[1];
    o[j][3] *= alpha[1];
  }

  // P.V: A = P rows (as Q above), B = the tile's ckv rows transposed by ldmatrix.trans (lane ->
  // slot lane % 8 + 8 * ((lane / 8) % 2), column offset 8 * (lane / 16): two n-tiles per load).
  const uint32_t p_addr = smem_addr(&sh.p[lane % 16][(lane / 16) * 8]);
  const uint32_t v_addr = smem_addr(&sh.kv[stage][lane % 8 + ((lane / 8) % 2) * 8][warp * kColsPerWarp + (lane / 16) * 8]);
#pragma unroll
  for (int k0 = 0; k0 < kTileSlots; k0 += 16) {
    uint32_t a[4];
    ldmatrix_x4(a, p_addr + k0 * 2);
#pragma unroll
    for (int j = 0; j < kColTiles; j += 2) {
      uint32_t b[4];
      ldmatrix_x4_trans(b, v_addr + (k0 * kRowStride + j * 8) * 2);
      mma_bf16(o[j], a, b[0], b[1]);
      mma_bf16(o[j + 1], a, b[2], b[3]);
    }
  }
  __syncthreads();  // the stage, P and the tile maxima are free for the next tile
}

// Program (s, t): token t over slots s, s + S, ...; writes the split's partial.
__device__ __forceinline__ void attend_split(Shared& sh, const AttentionArgs& a, int t, int s) {
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
  // Q does not depend on the ids: its copy (group 0) is issued while they are in flight.
  for (int c = threadIdx.x; c < kHeads * kRowChunks; c += kThreads) {
    const int h = c / kRowChunks;
    const int chunk = c % kRowChunks;
    const uint16_t* src = chunk < kCkvChunks ? a.q_nope + t * a.q_nope_t + h * a.q_nope_h + chunk * kChunk
                                             : a.q_pe + t * a.q_pe_t + h * a.q_pe_h + (chunk - kCkvChunks) * kChunk;
    cp_async16(&sh.q[h][chunk * kChunk], src, 16);
  }
  cp_async_commit();
  // Tiles after the last one holding a valid slot are skipped (block-uniform).
  int active = 0;
#pragma unroll
  for (int i = 0; i < kMaxTiles; ++i) {
    if (i < tiles && __syncthreads_or(ids[i] >= 0)) active = i + 1;
  }
  stamp(a, t, s, kPhaseIdsCycles);

  if (active > 0) issue_tile(sh, a, ids[0], 0);
  cp_async_commit();  // group 1: tile 0 (empty without active tiles)
  if (active > 1) issue_tile(sh, a, ids[1], 1);
  cp_async_commit();  // group 2: tile 1 (possibly empty)

  RowState st{{neg_inf(), neg_inf()}, {0.f, 0.f}};
  float o[kColTiles][4];
#pragma unroll
  for (int j = 0; j < kColTiles; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
  uint32_t q[kQSteps][4];  // A fragments of Q: lane -> row lane % 16, column half lane / 16

  // Before tile i, groups up to tile i + 1 are committed: waiting for all but one leaves
  // tile i (and everything older) complete.
  for (int tile = 0; tile < active; ++tile) {
    const int stage = tile % kStages;
    cp_async_wait<1>();
    __syncthreads();
    if (tile == 0) {
      stamp(a, t, s, kPhaseFirstTileCycles);
      const uint32_t q_addr = smem_addr(&sh.q[threadIdx.x % kWarpSize % 16][(threadIdx.x % kWarpSize / 16) * 8]);
#pragma unroll
      for (int i = 0; i < kQSteps; ++i) ldmatrix_x4(q[i], q_addr + i * 16 * 2);
    }
    attend_tile(sh, stage, a.qk_scale_log2, q, st, o);
    int id = -1;
#pragma unroll
    for (int i = 0; i < kMaxTiles; ++i) id = i == tile + kStages ? ids[i] : id;
    if (tile + kStages < active) issue_tile(sh, a, id, stage);
    cp_async_commit();  // always one group per tile, so the wait count above holds
  }
  cp_async_wait<0>();  // nothing may land in shared memory after this program moves on
  stamp(a, t, s, kPhaseAttendedCycles);

  // Partial, in the accumulators' own order so that every store is coalesced: unit
  // (warp, n-tile j, lane) = {bf16 pair of head g, bf16 pair of head g + 8} at columns
  // 64 * warp + 8 * j + 2 * tig, divided by l (0 without a valid slot); lse = m + log2 l
  // (-inf without a valid slot).
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  const int g = lane / 4;
  const int tig = lane % 4;
  const int64_t part = static_cast<int64_t>(t) * splits + s;
  float inv_l[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) inv_l[r] = st.l[r] > 0.f ? 1.f / st.l[r] : 0.f;
  uint2* units = reinterpret_cast<uint2*>(a.part_out) + part * kUnits + warp * kColTiles * kWarpSize + lane;
#pragma unroll
  for (int j = 0; j < kColTiles; ++j) {
    units[j * kWarpSize] = make_uint2(pack_bf16x2(o[j][0] * inv_l[0], o[j][1] * inv_l[0]), pack_bf16x2(o[j][2] * inv_l[1], o[j][3] * inv_l[1]));
  }
  if (warp == 0 && tig == 0) {
    a.part_lse[part * kHeads + g] = st.l[0] > 0.f ? st.m[0] + log2f(st.l[0]) : neg_inf();
    a.part_lse[part * kHeads + g + 8] = st.l[1] > 0.f ? st.m[1] + log2f(st.l[1]) : neg_inf();
  }
  stamp(a, t, s, kPhasePartialCycles);
}

// Scratch of the combine when several threads share a unit (fewer units than threads).
struct CombineScratch {
  float top[kThreads][2];        // each thread's largest lse of heads g and g + 8
  float sums[kThreads][6];       // each thread's weighted outputs (4) and weight totals (2)
};

// Program s's share of token t's combine: units [s * kUnits / S, (s + 1) * kUnits / S), each the
// weighted mean of the S partials (weights 2^(lse_split - lse_max) per head). Thread i takes
// unit i % (kUnits / S) over the kCombineSplitsPerThread splits of block i / (kUnits / S), so
// each warp-wide load reads 32 consecutive units of one split (coalesced); the blocks are
// merged through shared memory. Partials come from other SMs of this launch: read through L2
// (ld.cg), never a stale L1 line.
__device__ __forceinline__ void combine_share(CombineScratch& scratch, const AttentionArgs& a, int t, int s) {
  const int splits = a.splits;
  const int per_program = kUnits / splits;                // units this program combines
  const int blocks = kThreads / per_program;              // split blocks per unit (S / 8)
  const int local = static_cast<int>(threadIdx.x) % per_program;
  const int block = static_cast<int>(threadIdx.x) / per_program;
  const int unit = s * per_program + local;
  const int lane = unit % kWarpSize;  // the unit's accumulator lane, warp and n-tile
  const int col_tile = unit / kWarpSize % kColTiles;
  const int warp = unit / (kWarpSize * kColTiles);
  const int g = lane / 4;
  const int d = warp * kColsPerWarp + col_tile * 8 + 2 * (lane % 4);
  const int64_t first = static_cast<int64_t>(t) * splits + block * kCombineSplitsPerThread;
  const uint2* units = reinterpret_cast<const uint2*>(a.part_out);

  uint2 bits[kCombineSplitsPerThread];
  float lse_lo[kCombineSplitsPerThread], lse_hi[kCombineSplitsPerThread];
#pragma unroll
  for (int k = 0; k < kCombineSplitsPerThread; ++k) {
    const int64_t part = first + k;
    bits[k] = __ldcg(units + part * kUnits + unit);
    lse_lo[k] = __ldcg(a.part_lse + part * kHeads + g);
    lse_hi[k] = __ldcg(a.part_lse + part * kHeads + g + 8);
  }
  float top_lo = neg_inf(), top_hi = neg_inf();
#pragma unroll
  for (int k = 0; k < kCombineSplitsPerThread; ++k) {
    top_lo = fmaxf(top_lo, lse_lo[k]);
    top_hi = fmaxf(top_hi, lse_hi[k]);
  }
  if (blocks > 1) {  // block-uniform
    scratch.top[threadIdx.x][0] = top_lo;
    scratch.top[threadIdx.x][1] = top_hi;
    __syncthreads();
    for (int b = 0; b < blocks; ++b) {
      top_lo = fmaxf(top_lo, scratch.top[b * per_program + local][0]);
      top_hi = fmaxf(top_hi, scratch.top[b * per_program + local][1]);
    }
  }
  // A head without any valid slot has max -inf: 0 as the reference keeps every weight 0, not NaN.
  const float ref_lo = top_lo == neg_inf() ? 0.f : top_lo;
  const float ref_hi = top_hi == neg_inf() ? 0.f : top_hi;
  float sums[6] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f};  // outputs lo.x, lo.y, hi.x, hi.y; totals lo, hi
#pragma unroll
  for (int k = 0; k < kCombineSplitsPerThread; ++k) {
    const float w_lo = exp2f(lse_lo[k] - ref_lo);
    const float w_hi = exp2f(lse_hi[k] - ref_hi);
    const float2 lo = unpack_bf16x2(bits[k].x);
    const float2 hi = unpack_bf16x2(bits[k].y);
    sums[0] += w_lo * lo.x;
    sums[1] += w_lo * lo.y;
    sums[2] += w_hi * hi.x;
    sums[3] += w_hi * hi.y;
    sums[4] += w_lo;
    sums[5] += w_hi;
  }
  if (blocks > 1) {
#pragma unroll
    for (int i = 0; i < 6; ++i) scratch.sums[threadIdx.x][i] = sums[i];
    __syncthreads();
    if (block != 0) return;
    for (int b = 1; b < blocks; ++b) {
#pragma unroll
      for (int i = 0; i < 6; ++i) sums[i] += scratch.sums[b * per_program + local][i];
    }
  }
  const float scale_lo = sums[4] > 0.f ? 1.f / sums[4] : 0.f;
  const float scale_hi = sums[5] > 0.f ? 1.f / sums[5] : 0.f;
  uint16_t* out_lo = a.out + t * a.out_t + g * a.out_h + d;
  *reinterpret_cast<uint32_t*>(out_lo) = pack_bf16x2(sums[0] * scale_lo, sums[1] * scale_lo);
  *reinterpret_cast<uint32_t*>(out_lo + 8 * a.out_h) = pack_bf16x2(sums[2] * scale_hi, sums[3] * scale_hi);
  if (d == 0) {
    a.lse[t * a.lse_t + g] = sums[4] > 0.f ? ref_lo + log2f(sums[4]) : neg_inf();
    a.lse[t * a.lse_t + g + 8] = sums[5] > 0.f ? ref_hi + log2f(sums[5]) : neg_inf();
  }
}

__device__ __forceinline__ int load_acquire(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void fence_acq_rel() { asm volatile("fence.acq_rel.gpu;" ::: "memory"); }

__global__ void __launch_bounds__(kThreads, 1) split_kernel(AttentionArgs a, bool fused) {
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  Shared& sh = *reinterpret_cast<Shared*>(shared_bytes);
  const int s = blockIdx.x;
  const int t = blockIdx.y;
  int* count = a.sync + static_cast<int64_t>(t) * kSyncStride;
  int* sense_word = count + kSenseOffset;
  int sense = 0;
  // Read before arriving: nobody flips it until every split of this token has arrived.
  stamp(a, t, s, kPhaseEntryNs);
  stamp(a, t, s, kPhaseEntryCycles);
  if (fused && threadIdx.x == 0) sense = load_acquire(sense_word);

  attend_split(sh, a, t, s);
  if (!fused) {
    stamp(a, t, s, kPhaseExitNs);
    return;
  }

  // Sense-reversing barrier per token: the block's partial stores, then one gpu-scope arrival.
  // The last program to arrive resets the count (so the words need no memset between calls and
  // stay in [0, S] and {0, 1}) and flips the sense, which releases the others.
  // The fences are acq_rel at gpu scope: the block barrier orders every thread's partial
  // stores before thread 0's fence, which makes them visible before its arrival; the acquire
  // load that sees the flip, then the block barrier, order the combine's loads after it.
  __syncthreads();
  if (threadIdx.x == 0) {
    fence_acq_rel();
    const int ticket = atomicAdd(count, 1);
    if (ticket == a.splits - 1) {
      atomicExch(count, 0);
      fence_acq_rel();
      atomicExch(sense_word, 1 - sense);
    } else {
      while (load_acquire(sense_word) == sense) {
      }
    }
    fence_acq_rel();
  }
  __syncthreads();
  stamp(a, t, s, kPhaseReleasedCycles);
  combine_share(*reinterpret_cast<CombineScratch*>(&sh.kv[0][0][0]), a, t, s);  // the gather buffers are free now
  stamp(a, t, s, kPhaseCombinedCycles);
  stamp(a, t, s, kPhaseExitNs);
}

__global__ void __launch_bounds__(kThreads) combine_kernel(AttentionArgs a) {
  __shared__ CombineScratch scratch;
  combine_share(scratch, a, blockIdx.y, blockIdx.x);
}

static_assert(sizeof(CombineScratch) <= sizeof(Shared::kv), "the fused combine reuses the gather buffers");

constexpr int kMaxDevices = 64;

// Opts the split kernel in to its dynamic shared memory (once per device).
cudaError_t prepare(int device) {
  static bool done[kMaxDevices] = {false};
  if (device >= 0 && device < kMaxDevices && done[device]) return cudaSuccess;
  const cudaError_t err = cudaFuncSetAttribute(split_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(sizeof(Shared)));
  if (err == cudaSuccess && device >= 0 && device < kMaxDevices) done[device] = true;
  return err;
}

}  // namespace

cudaError_t resident_programs(int* programs) {
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  err = prepare(device);
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

cudaError_t launch_sparse_attention(const AttentionArgs& args, bool force_two_launch, cudaStream_t stream, Launch* used) {
  if (args.splits < kMinSplits || args.splits > kMaxSplits || (args.splits & (args.splits - 1)) != 0) return cudaErrorInvalidValue;
  if (args.tokens <= 0) return cudaSuccess;
  int resident = 0;
  const cudaError_t err = resident_programs(&resident);
  if (err != cudaSuccess) return err;
  const bool fused = !force_two_launch && static_cast<long long>(args.tokens) * args.splits <= resident;
  const dim3 grid(args.splits, args.tokens);
  split_kernel<<<grid, kThreads, sizeof(Shared), stream>>>(args, fused);
  if (!fused) combine_kernel<<<grid, kThreads, 0, stream>>>(args);
  *used = fused ? Launch::kFused : Launch::kTwoLaunch;
  return cudaGetLastError();
}

}  // namespace dsa_attention
