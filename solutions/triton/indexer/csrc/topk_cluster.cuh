// Cluster top-k of the lightning indexer: one thread-block cluster per row, the row in registers.
//
// The long-row top-k (topk_long.cuh) splits a row over many blocks that meet through global
// memory: four dependent launches, each ending on a last-block counter, and the row's scores
// read twice. Its cost at small batches is that chain (about 20 us whatever the row length on
// the H100), not the scores. Here one launch does a whole row: a cluster of kClusterBlocks
// blocks of kClusterThreads threads caches kClusterSlots scores per thread (8192 per block,
// 131072 for a 16-block cluster: a 128K-token row) and selects in the same three levels of the
// 32-bit order key (bits 31..20, 19..8, 7..0), the blocks meeting through each other's shared
// memory (distributed shared memory) and cluster barriers:
//
//   per level  each block builds a shared histogram of its candidates' bins and adds its
//              non-empty bins to the bins' owner block (block r owns the r-th 1/kClusterBlocks of
//              the bins; one remote atomic per non-empty bin); cluster barrier; every block
//              gathers the complete histogram from the owners and finds the same threshold bin t;
//              keys above t are written as physical ids at slots taken from a counter in block
//              0 (one remote atomic per block, offsets from a block scan); keys in t stay
//              candidates. The selection ends at the first level whose threshold bin is needed
//              whole.
//   ties       after the last level the candidates left have equal keys (equal fp32 scores):
//              tickets from a second counter in block 0 hand out the remaining slots.
//
// Exact, like the other top-k kernels: every choice is made on the full 32-bit key. No global
// scratch: every counter lives in shared memory for one launch, so calls need no zeroing and
// several may run at once. A row of L <= topk is passed through by its block 0 without scores.
//
// With DSA_TOPK_HOST_EMULATION the file compiles as host C++ for tests/solutions/topk_cluster_emulator.cpp,
// which runs a cluster's blocks as fibers of one scheduler (cluster barriers included).
#pragma once

#ifndef DSA_TOPK_HOST_EMULATION
#include <cooperative_groups.h>
#endif

#include "topk_long.cuh"

namespace dsa_topk {

constexpr int kClusterTablePages = kClusterChunk / kPageSize;  // a block's slice of the block table
static_assert(kClusterSlots % kScoresPerVector == 0 && kClusterSlots <= 32, "whole float4 per thread, one bit per slot");
static_assert(kClusterChunk % kPageSize == 0, "a block's slice is whole pages");
static_assert(kLongBins % kClusterMaxBlocks == 0 && kLongLastBins % kClusterMaxBlocks == 0, "every block owns whole, equal runs of bins");
static_assert(kClusterThreads >= kLongLastBins && kLongBins % kClusterThreads == 0, "the threshold scans give each bin an owner");

// Block-shared state of one block of a row's cluster. Dynamic shared memory (the emulator gives
// each block of a cluster its own). `owned` holds, per level, the cluster's counts of the bins this
// block owns (bins [rank * per, (rank + 1) * per) with per = bins / cluster size); it is sized for
// the smallest cluster.
struct ClusterShared {
  alignas(16) int hist[kLongBins];  // this block's histogram of a level, then the cluster's, gathered
  alignas(16) int owned[2 * kLongBins / kClusterMinBlocks + kLongLastBins / kClusterMinBlocks];
  int table[kClusterTablePages];  // the block table entries of this block's slice of the row
  int warp_totals[kMaxWarps];
  Threshold threshold;
  int out_base;
  int out_count;  // block 0's: output slots taken by keys above a threshold, cluster-wide
  int tickets;    // block 0's: tickets handed to the keys equal to the last threshold
};
constexpr int kClusterOwnedInts = 2 * kLongBins / kClusterMinBlocks + kLongLastBins / kClusterMinBlocks;


// The cluster's spellings: its barrier, this block's rank, a pointer into another block's shared memory.
#ifdef DSA_TOPK_HOST_EMULATION
__device__ __forceinline__ void cluster_sync() { simt::sync_cluster(); }
__device__ __forceinline__ int cluster_rank() { return simt::cluster_rank(); }
template <typename T>
__device__ __forceinline__ T* cluster_peer(T* local, int rank) {
  return simt::cluster_peer(local, rank);
}
#else
__device__ __forceinline__ void cluster_sync() { cooperative_groups::this_cluster().sync(); }
__device__ __forceinline__ int cluster_rank() { return static_cast<int>(cooperative_groups::this_cluster().block_rank()); }
template <typename T>
__device__ __forceinline__ T* cluster_peer(T* local, int rank) {
  return cooperative_groups::this_cluster().map_shared_rank(local, rank);
}
#endif

// Offset of level kLevel's owned counts in ClusterShared::owned, for a cluster of kBlocks.
template <int kLevel, int kBlocks>
__device__ __forceinline__ int owned_offset() {
  return kLevel * (kLongBins / kBlocks);
}

// One level of a row's selection over the candidate slots `candidates` of `keys`: the cluster's
// histogram of the level's bins, its threshold bin t for `need` slots, keys above t written out.
// Returns t; `candidates` becomes the keys in t. Cluster-wide (every thread of every block).
template <int kLevel, int kBlocks>
__device__ __forceinline__ Threshold cluster_level(const uint32_t (&keys)[kClusterSlots], uint32_t& candidates, int need, int start,
                                                   int32_t* out_row, ClusterShared& s) {
  constexpr int kBins = kLevel == kLongLevels - 1 ? kLongLastBins : kLongBins;
  constexpr int kPer = kBins / kBlocks;  // bins each block owns
  const int tid = threadIdx.x;
  zero_bins<kClusterThreads, kBins>(s.hist);
  __syncthreads();
#pragma unroll
  for (int i = 0; i < kClusterSlots; ++i) histogram_add(s.hist, level_bin<kLevel>(keys[i]), (candidates >> i) & 1u);
  __syncthreads();
  // Each non-empty bin to its owner; then every block gathers the whole histogram. The same thread
  // pushes and gathers bin b, so s.hist needs no barrier in between.
  for (int b = tid; b < kBins; b += kClusterThreads) {
    const int c = s.hist[b];
    if (c != 0) atomicAdd(cluster_peer(s.owned + owned_offset<kLevel, kBlocks>() + b % kPer, b / kPer), c);
  }
  cluster_sync();
  for (int b = tid; b < kBins; b += kClusterThreads) s.hist[b] = *cluster_peer(s.owned + owned_offset<kLevel, kBlocks>() + b % kPer, b / kPer);
  __syncthreads();
  const Threshold t = find_threshold<kClusterThreads, kBins, false>(s.hist, need, s.warp_totals, &s.threshold);
  uint32_t above = 0u, tie = 0u;
#pragma unroll
  for (int i = 0; i < kClusterSlots; ++i) {
    const bool member = (candidates >> i) & 1u;
    const int bin = level_bin<kLevel>(keys[i]);
    if (member && bin > t.bin) above |= 1u << i;
    if (member && bin == t.bin) tie |= 1u << i;
  }
  // The whole threshold bin is needed: its keys go out with the ones above it.
  if (t.in_bin == need - t.above) above |= tie;
  const int lane = tid % kWarpSize, warp = tid / kWarpSize;
  const int mine = __popc(above);
  const int inclusive = block_inclusive_sum<kClusterThreads>(mine, lane, warp, s.warp_totals);
  if (tid == kClusterThreads - 1) s.out_base = inclusive != 0 ? atomicAdd(cluster_peer(&s.out_count, 0), inclusive) : 0;
  __syncthreads();
  int at = s.out_base + inclusive - mine;
#pragma unroll
  for (int i = 0; i < kClusterSlots; ++i) {
    if (above & (1u << i)) {
      const int pos = start + ((i / kScoresPerVector) * kClusterThreads + tid) * kScoresPerVector + i % kScoresPerVector;
      out_row[at++] = s.table[(pos - start) / kPageSize] * kPageSize + pos % kPageSize;
    }
  }
  candidates = tie;
  __syncthreads();  // s.out_base and the scan's scratch may be reused after
  return t;
}

// Grid (kBlocks, batch) in clusters of (kBlocks, 1, 1): cluster y selects row y. Asks for one block per SM
// (1024 threads; the registers the cached keys need).
template <int kBlocks>
__global__ void __launch_bounds__(kClusterThreads, 1) cluster_topk_kernel(ClusterTopkArgs a) {
  static_assert(kBlocks >= kClusterMinBlocks && kBlocks <= kClusterMaxBlocks && (kBlocks & (kBlocks - 1)) == 0, "a power-of-two cluster");
  launch_dependents();
  ClusterShared& s = *dynamic_shared<ClusterShared>();
  const int tid = threadIdx.x;
  const int rank = cluster_rank();
  const int row = blockIdx.y;
  const int len = a.seq_lens[row];
  const int32_t* table_row = a.block_table + row * a.bt_stride;
  int32_t* out_row = a.out + row * a.out_stride;
  if (len <= a.topk) {  // passthrough: every token is selected, no scores needed (cluster-uniform: no barrier follows)
    if (rank != 0) return;
    for (int i = tid; i < a.topk; i += kClusterThreads) out_row[i] = i < len ? __ldg(table_row + i / kPageSize) * kPageSize + i % kPageSize : -1;
    return;
  }
  if (len > a.max_len || a.max_len > kBlocks * kClusterChunk) __trap();  // breaks the contract: fail loudly
  const int start = rank * kClusterChunk;
  for (int i = tid; i < kClusterOwnedInts; i += kClusterThreads) s.owned[i] = 0;
  if (tid == 0) {
    s.out_count = 0;
    s.tickets = 0;
  }
  const int pages = (len - start + kPageSize - 1) / kPageSize;  // of this block's slice (<= 0: none)
  for (int p = tid; p < kClusterTablePages && p < pages; p += kClusterThreads) s.table[p] = __ldg(table_row + start / kPageSize + p);
  wait_for_preceding_grid();  // the scores are the previous kernel's
  uint32_t keys[kClusterSlots];
  uint32_t candidates = 0u;
  {
    constexpr int kVectors = kClusterSlots / kScoresPerVector;
    const float* score_row = a.scores + row * a.score_stride;
    float4 x[kVectors];
#pragma unroll
    for (int c = 0; c < kVectors; ++c) {
      const int p = start + (c * kClusterThreads + tid) * kScoresPerVector;
      // Rows are 16-byte aligned and padded to whole pages, so a vector starting below len is in bounds.
      x[c] = p < len ? __ldg(reinterpret_cast<const float4*>(score_row + p)) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
#pragma unroll
    for (int c = 0; c < kVectors; ++c) {
      const float values[kScoresPerVector] = {x[c].x, x[c].y, x[c].z, x[c].w};
#pragma unroll
      for (int e = 0; e < kScoresPerVector; ++e) {
        const int i = c * kScoresPerVector + e;
        keys[i] = order_key(values[e]);
        if (start + (c * kClusterThreads + tid) * kScoresPerVector + e < len) candidates |= 1u << i;
      }
    }
  }
  cluster_sync();  // every block runs and has zeroed its owned bins and counters before any remote add
  int need = a.topk;
  Threshold t = cluster_level<0, kBlocks>(keys, candidates, need, start, out_row, s);
  bool done = t.in_bin == need - t.above;  // cluster-uniform: every block found the same t
  need -= t.above;
  if (!done) {
    t = cluster_level<1, kBlocks>(keys, candidates, need, start, out_row, s);
    done = t.in_bin == need - t.above;
    need -= t.above;
  }
  if (!done) {
    t = cluster_level<2, kBlocks>(keys, candidates, need, start, out_row, s);
    done = t.in_bin == need - t.above;
    need -= t.above;
  }
  if (!done) {
    // The candidates left have equal keys (equal fp32 scores), any of which will do: the first
    // `need` tickets in cluster order fill the row's last slots.
    const int lane = tid % kWarpSize, warp = tid / kWarpSize;
    const int mine = __popc(candidates);
    const int inclusive = block_inclusive_sum<kClusterThreads>(mine, lane, warp, s.warp_totals);
    if (tid == kClusterThreads - 1) s.out_base = inclusive != 0 ? atomicAdd(cluster_peer(&s.tickets, 0), inclusive) : 0;
    __syncthreads();
    int ticket = s.out_base + inclusive - mine;
#pragma unroll
    for (int i = 0; i < kClusterSlots; ++i) {
      if (candidates & (1u << i)) {
        if (ticket < need) {
          const int pos = start + ((i / kScoresPerVector) * kClusterThreads + tid) * kScoresPerVector + i % kScoresPerVector;
          out_row[a.topk - need + ticket] = s.table[(pos - start) / kPageSize] * kPageSize + pos % kPageSize;
        }
        ++ticket;
      }
    }
  }
  cluster_sync();  // no block leaves while another may still read or add to its shared memory
}

}  // namespace dsa_topk
