// Cluster top-k of the lightning indexer: one thread-block cluster per row, the row in registers.
//
// The long-row top-k (topk_long.cuh) splits a row over many blocks that meet through global
// memory. Here one launch selects a whole row: a cluster of 2..16 blocks of kClusterThreads threads
// caches kClusterSlots scores per thread (8192 per block, 131072 for a 16-block cluster: a
// 128K-token row), and the blocks meet through each other's shared memory (distributed shared
// memory) at cluster barriers. A row's selection, on the 32-bit order key of each score:
//
//   range      each block's smallest and largest key; after the first cluster barrier every block
//              has the row's, so the first level's bins cover exactly the row's key range (the
//              fixed top bits of a key put most scores of a row in a few bins: their exponent).
//   level      kClusterBins bins of (key - lo) >> shift over the candidates: each block's
//              shared histogram goes to the bins' owner blocks (block r owns the r-th
//              1/cluster-size of the bins; one remote atomic per non-empty bin); cluster barrier;
//              every block gathers the whole histogram from the owners and finds the same threshold
//              bin t; keys above t are written as physical ids at slots taken from a counter in
//              block 0 (one remote atomic per block); keys in t stay candidates, their range
//              narrowed to bin t, the next level's bins 11 bits finer.
//   gather     once the candidates fit block 0's buffer (kClusterGather, the usual case after the
//              first level), every block appends its (key, physical id) pairs there; cluster
//              barrier; block 0 finishes alone, the candidates in its registers (2 per thread),
//              with levels on a block-local histogram; the other blocks are done.
//   ties       when a level's bins are single keys (shift 0), the candidates left are equal fp32
//              scores: tickets hand out the remaining slots, any of them will do.
//
// Exact, like the other top-k kernels: every choice is made on the full 32-bit key. No global
// scratch: every counter lives in shared memory for one launch, so calls need no zeroing and
// several may run at once. A row of L <= topk is passed through by its block 0 without scores.
//
// With DSA_TOPK_HOST_EMULATION the file compiles as host C++ for tests/solutions/topk_long_emulator.cpp,
// which runs a cluster's blocks as fibers of one scheduler (cluster barriers included).
#pragma once

#ifndef DSA_TOPK_HOST_EMULATION
#include <cooperative_groups.h>
#endif

#include "topk_long.cuh"

namespace dsa_topk {

constexpr int kClusterBinBits = 11;
constexpr int kClusterBins = 1 << kClusterBinBits;  // bins of every level, cluster-wide or in block 0
constexpr int kClusterLevels = 3;  // cluster-wide levels at most: shifts <= 21, <= 10, 0
constexpr int kClusterGatherSlots = 2;  // candidates per thread of block 0's finish
constexpr int kClusterGather = kClusterThreads * kClusterGatherSlots;  // block 0's candidate buffer
constexpr int kClusterTablePages = kClusterChunk / kPageSize;  // a block's slice of the block table
static_assert(kClusterSlots % kScoresPerVector == 0 && kClusterSlots <= 32, "whole float4 per thread, one bit per slot");
static_assert(kClusterChunk % kPageSize == 0, "a block's slice is whole pages");
static_assert(kClusterBins % kClusterMaxBlocks == 0, "every block owns whole, equal runs of bins");
static_assert(kClusterBins % kClusterThreads == 0 && kClusterBins >= kClusterThreads, "the threshold scans give each thread whole runs");
static_assert(kKeyBits - kClusterBinBits * (kClusterLevels - 1) <= kClusterBinBits, "kClusterLevels levels reach single keys");
static_assert(kClusterMaxBlocks <= kWarpSize, "one lane per block of the cluster");

// Block-shared state of one block of a row's cluster. Dynamic shared memory (the emulator gives
// each block of a cluster its own).
struct ClusterShared {
  alignas(16) int hist[kClusterBins];  // this block's histogram of a level, then the cluster's, gathered
  // Per cluster-wide level, the cluster's counts of the bins this block owns (bins [rank * per,
  // (rank + 1) * per), per = kClusterBins / cluster size), sized for the smallest cluster.
  alignas(16) int owned[kClusterLevels][kClusterBins / kClusterMinBlocks];
  uint2 gathered[kClusterGather];  // block 0's: (key, physical id) of the candidates it finishes
  int table[kClusterTablePages];   // the block table entries of this block's slice of the row
  int warp_totals[kMaxWarps];
  uint32_t warp_lo[kMaxWarps];
  uint32_t warp_hi[kMaxWarps];
  uint32_t lo;  // this block's smallest and largest key
  uint32_t hi;
  uint32_t row_lo;  // the row's, from every block's
  uint32_t row_hi;
  Threshold threshold;
  int out_base;
  int out_count;       // block 0's: output slots taken by keys above a threshold, cluster-wide
  int tickets;         // block 0's: tickets handed to the keys equal to the last threshold
  int gathered_count;  // block 0's: entries of `gathered`
};

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

// The shift of a level's bins over keys k with k - lo < 2^range_bits: kClusterBins bins of (k - lo) >> shift.
__device__ __forceinline__ int level_shift(int range_bits) { return range_bits > kClusterBinBits ? range_bits - kClusterBinBits : 0; }

// The bin (key - lo) >> shift of a candidate, -1 for a slot that is not one.
__device__ __forceinline__ int range_bin(uint32_t key, bool candidate, uint32_t lo, int shift) {
  return candidate ? static_cast<int>((key - lo) >> shift) : -1;
}

// Writes the physical ids of `mask`'s slots (`id_of(i)`) at slots taken from `*counter` (one atomic
// per block, offsets from a block scan; `counter` may be another block's). With kTickets the counter
// hands out tickets among keys equal to the last threshold (equal scores, any of which will do): the
// first `need` fill the row's last `need` slots of `topk`. Block-wide.
template <int kSlots, bool kTickets, typename Id>
__device__ __forceinline__ void emit_ids(uint32_t mask, Id id_of, int* counter, int32_t* out_row, ClusterShared& s, int need = 0,
                                         int topk = 0) {
  const int tid = threadIdx.x, lane = tid % kWarpSize, warp = tid / kWarpSize;
  const int mine = __popc(mask);
  const int inclusive = block_inclusive_sum<kClusterThreads>(mine, lane, warp, s.warp_totals);
  if (tid == kClusterThreads - 1) s.out_base = inclusive != 0 ? atomicAdd(counter, inclusive) : 0;
  __syncthreads();
  int at = s.out_base + inclusive - mine;
#pragma unroll
  for (int i = 0; i < kSlots; ++i) {
    if (mask & (1u << i)) {
      if (!kTickets) out_row[at] = id_of(i);
      if (kTickets && at < need) out_row[topk - need + at] = id_of(i);
      ++at;
    }
  }
  __syncthreads();  // s.out_base and the scan's scratch may be reused after
}

// After a level's threshold t over the bins (key - lo) >> shift of the `candidates` slots: the
// keys above t go out, and the whole bin t too when all of it is needed; returns the slots to
// write and leaves the keys of bin t in `candidates` (none when the bin went out).
template <int kSlots>
__device__ __forceinline__ uint32_t split_at(const uint32_t (&keys)[kSlots], uint32_t lo, int shift, const Threshold& t, int need,
                                             uint32_t& candidates) {
  uint32_t above = 0u, tie = 0u;
#pragma unroll
  for (int i = 0; i < kSlots; ++i) {
    const int bin = range_bin(keys[i], (candidates >> i) & 1u, lo, shift);
    if (bin > t.bin) above |= 1u << i;
    if (bin == t.bin) tie |= 1u << i;
  }
  if (t.in_bin == need - t.above) {  // the whole bin is needed
    above |= tie;
    tie = 0u;
  }
  candidates = tie;
  return above;
}

// A block's histogram of the bins (key - lo) >> shift of the `candidates` slots, in s.hist. Block-wide.
template <int kSlots>
__device__ __forceinline__ void block_histogram(const uint32_t (&keys)[kSlots], uint32_t candidates, uint32_t lo, int shift, ClusterShared& s) {
  zero_bins<kClusterThreads, kClusterBins>(s.hist);
  __syncthreads();
#pragma unroll
  for (int i = 0; i < kSlots; ++i) {
    const bool candidate = (candidates >> i) & 1u;
    histogram_add_spread(s.hist, range_bin(keys[i], candidate, lo, shift), candidate);
  }
  __syncthreads();
}

// One cluster-wide level of level `level` over the candidate slots of `keys`: the cluster's
// histogram of the bins (key - lo) >> shift, its threshold bin for `need`, the keys above it
// written out. Returns the threshold; `candidates` becomes the keys in its bin. Cluster-wide.
template <int kBlocks, typename Id>
__device__ __forceinline__ Threshold cluster_level(int level, const uint32_t (&keys)[kClusterSlots], uint32_t& candidates, uint32_t lo,
                                                   int shift, int need, Id id_of, int32_t* out_row, ClusterShared& s) {
  constexpr int kPer = kClusterBins / kBlocks;  // bins each block owns
  const int tid = threadIdx.x;
  block_histogram<kClusterSlots>(keys, candidates, lo, shift, s);
  // Each non-empty bin to its owner; then every block gathers the whole histogram. The same thread
  // pushes and gathers bin b, so s.hist needs no barrier in between.
  int* owned = s.owned[level];
  for (int b = tid; b < kClusterBins; b += kClusterThreads) {
    const int c = s.hist[b];
    if (c != 0) atomicAdd(cluster_peer(owned + b % kPer, b / kPer), c);
  }
  cluster_sync();
  for (int b = tid; b < kClusterBins; b += kClusterThreads) s.hist[b] = *cluster_peer(owned + b % kPer, b / kPer);
  __syncthreads();
  const Threshold t = find_threshold<kClusterThreads, kClusterBins, false>(s.hist, need, s.warp_totals, &s.threshold);
  const uint32_t above = split_at<kClusterSlots>(keys, lo, shift, t, need, candidates);
  emit_ids<kClusterSlots, false>(above, id_of, cluster_peer(&s.out_count, 0), out_row, s);
  return t;
}

// Block 0's finish: the `count` gathered candidates (every key k with k - lo < 2^range_bits),
// `need` slots left, levels on a block-local histogram until the threshold bin is needed whole
// or holds equal keys. Block-wide.
__device__ void finish_gathered(int count, uint32_t lo, int range_bits, int need, int topk, int32_t* out_row, ClusterShared& s) {
  const int tid = threadIdx.x;
  uint32_t keys[kClusterGatherSlots];
  int ids[kClusterGatherSlots];
  uint32_t candidates = 0u;
#pragma unroll
  for (int i = 0; i < kClusterGatherSlots; ++i) {
    const int at = i * kClusterThreads + tid;
    const uint2 e = at < count ? s.gathered[at] : make_uint2(0u, 0u);
    keys[i] = e.x;
    ids[i] = static_cast<int>(e.y);
    if (at < count) candidates |= 1u << i;
  }
  const auto id_of = [&](int i) { return ids[i]; };
  while (true) {
    if (range_bits == 0) {  // equal keys: any of them will do
      emit_ids<kClusterGatherSlots, true>(candidates, id_of, &s.tickets, out_row, s, need, topk);
      return;
    }
    const int shift = level_shift(range_bits);
    block_histogram<kClusterGatherSlots>(keys, candidates, lo, shift, s);
    const Threshold t = find_threshold<kClusterThreads, kClusterBins, false>(s.hist, need, s.warp_totals, &s.threshold);
    const uint32_t above = split_at<kClusterGatherSlots>(keys, lo, shift, t, need, candidates);
    emit_ids<kClusterGatherSlots, false>(above, id_of, &s.out_count, out_row, s);
    if (t.in_bin == need - t.above) return;
    need -= t.above;
    lo += static_cast<uint32_t>(t.bin) << shift;
    range_bits = shift;
  }
}

// Grid (kBlocks, batch) in clusters of (kBlocks, 1, 1): cluster y selects row y. Asks for one block per SM
// (1024 threads; the registers the cached keys need).
template <int kBlocks>
__global__ void __launch_bounds__(kClusterThreads, 1) cluster_topk_kernel(LongTopkArgs a) {
  static_assert(kBlocks >= kClusterMinBlocks && kBlocks <= kClusterMaxBlocks && (kBlocks & (kBlocks - 1)) == 0, "a power-of-two cluster");
  launch_dependents();
  ClusterShared& s = *dynamic_shared<ClusterShared>();
  const int tid = threadIdx.x, lane = tid % kWarpSize, warp = tid / kWarpSize;
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
  for (int i = tid; i < kClusterLevels * (kClusterBins / kClusterMinBlocks); i += kClusterThreads) (&s.owned[0][0])[i] = 0;
  if (tid == 0) {
    s.out_count = 0;
    s.tickets = 0;
    s.gathered_count = 0;
  }
  const int pages = (len - start + kPageSize - 1) / kPageSize;  // of this block's slice (<= 0: none)
  for (int p = tid; p < kClusterTablePages && p < pages; p += kClusterThreads) s.table[p] = __ldg(table_row + start / kPageSize + p);
  wait_for_preceding_grid();  // the scores are the previous kernel's
  uint32_t keys[kClusterSlots];
  uint32_t candidates = load_score_keys<kClusterThreads, kClusterSlots>(a.scores + row * a.score_stride, start, len, keys);
  uint32_t lo = 0xffffffffu, hi = 0u;
#pragma unroll
  for (int i = 0; i < kClusterSlots; ++i) {
    if ((candidates >> i) & 1u) {
      lo = keys[i] < lo ? keys[i] : lo;
      hi = keys[i] > hi ? keys[i] : hi;
    }
  }
  // This block's key range, then the row's: every block reads every block's after the first
  // cluster barrier (which also orders every block's zeroed state before any remote access).
  block_min_max<kClusterThreads>(lo, hi, s.warp_lo, s.warp_hi);
  if (tid == 0) {
    s.lo = lo;
    s.hi = hi;
  }
  cluster_sync();
  if (warp == 0) {
    lo = lane < kBlocks ? *cluster_peer(&s.lo, lane) : 0xffffffffu;
    hi = lane < kBlocks ? *cluster_peer(&s.hi, lane) : 0u;
    lo = warp_reduce(lo, false);
    hi = warp_reduce(hi, true);
    if (lane == 0) {
      s.row_lo = lo;
      s.row_hi = hi;
    }
  }
  __syncthreads();
  lo = s.row_lo;
  hi = s.row_hi;
  int range_bits = hi == lo ? 0 : kKeyBits - __clz(hi - lo);  // every candidate key k has k - lo < 2^range_bits
  int need = a.topk;
  const auto id_of = [&](int i) {
    const int pos = score_position<kClusterThreads>(start, i);
    return s.table[(pos - start) / kPageSize] * kPageSize + pos % kPageSize;
  };
  // Cluster-wide levels (every decision below is cluster-uniform: every block found the same t).
  for (int level = 0; level < kClusterLevels; ++level) {
    const int shift = level_shift(range_bits);
    const Threshold t = cluster_level<kBlocks>(level, keys, candidates, lo, shift, need, id_of, out_row, s);
    if (t.in_bin == need - t.above) break;  // done: the whole bin went out
    need -= t.above;
    lo += static_cast<uint32_t>(t.bin) << shift;
    range_bits = shift;
    if (t.in_bin <= kClusterGather) {
      // Block 0 finishes: every block appends its candidates (key, physical id) to block 0's buffer.
      const int mine = __popc(candidates);
      const int inclusive = block_inclusive_sum<kClusterThreads>(mine, lane, warp, s.warp_totals);
      if (tid == kClusterThreads - 1) s.out_base = inclusive != 0 ? atomicAdd(cluster_peer(&s.gathered_count, 0), inclusive) : 0;
      __syncthreads();
      uint2* gathered = cluster_peer(s.gathered, 0);
      int at = s.out_base + inclusive - mine;
#pragma unroll
      for (int i = 0; i < kClusterSlots; ++i) {
        if (candidates & (1u << i)) gathered[at++] = make_uint2(keys[i], static_cast<uint32_t>(id_of(i)));
      }
      cluster_sync();  // the buffer and block 0's counters are complete; no block touches another's memory after
      if (rank == 0) finish_gathered(t.in_bin, lo, range_bits, need, a.topk, out_row, s);
      return;
    }
    if (shift == 0) {  // equal keys, more than block 0's buffer holds: tickets, cluster-wide
      emit_ids<kClusterSlots, true>(candidates, id_of, cluster_peer(&s.tickets, 0), out_row, s, need, a.topk);
      break;
    }
  }
  cluster_sync();  // no block leaves while another may still add to its shared memory
}

}  // namespace dsa_topk
