// The consumer side of a program: a tile's logits (mma.sync), its online softmax step and P.V, and
// attend_split, the program's loop over its split's tiles (issuing their gathers, consuming them).
#pragma once

#include "producer.cuh"

namespace dsa_attention {
namespace {

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

}  // namespace
}  // namespace dsa_attention
