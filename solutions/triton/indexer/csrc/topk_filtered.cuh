// Filtered radix top-k of the lightning indexer, with the page-table emit fused in.
//
// One thread block per batch row; k = TopkArgs::topk (at most kTopK). A row with seq_len <= k keeps every token: the block
// writes the physical ids of positions 0..seq_len-1 and -1 after them, without reading scores.
// A longer row selects exactly k positions by radix select on a 32-bit order-preserving key
// of each fp32 score (so the result is exact: ties are only between equal fp32 scores):
//
//   digit 0 (bits 31..24): histogram over the whole row -> threshold bin t0. Keys above t0 are
//            selected; keys in t0 are candidates. If they fit in shared memory they are
//            compacted there (with the digit-1 histogram built on the way), else the block
//            keeps re-reading the row and filters it by the digits fixed so far.
//   digits 1..3 (bits 23..0): the same on the candidates only: select keys above the new
//            threshold, keep the ones equal to it.
//   A digit stops the search early when its whole threshold bin is needed. After digit 3 the
//   remaining candidates have identical keys, i.e. identical scores: any of them will do.
//
// Fast path, tried first on every long row: bin the keys linearly between the row's smallest
// and largest key (8192 bins, each a narrow key range, unlike the 8-bit digits whose first one
// holds little more than the exponent), find the threshold bin with one block-wide scan, emit
// every key above it and collect the keys inside it in shared memory; bin those once more
// (8192 sub-bins of the bin's range) when there are many, and rank the few keys of the last
// threshold bin against each other (ties broken by position; a few threads per key). The row
// is read from global memory once, into registers (8 to 16 keys per thread; rows of 8193-36864
// scores into shared memory, 16 to 36 keys per thread: SharedRow); four passes over those keys
// (range, histogram, per-thread counts, writes at scanned offsets), none of them with a per-key
// vote or atomic on the critical path, and about ten barriers; the digit-by-digit select needs
// about twenty, re-reads the row, and votes for every key. When the row is longer than the
// cache, or its threshold bin holds more than `fast_candidates` keys (e.g. a row of equal
// scores), the block runs the radix select instead; a shared row instead bins that bin again over
// the row, level by level, and hands out a one-key bin's equal scores as ties (fast_select).
//
// Selected positions are turned into physical ids (block_table[row][pos / 64] * 64 + pos % 64)
// and written straight to the output row; order inside the row is free. Pure CUDA: nvcc can
// compile it alone (topk_filtered.cu); topk_capi.cpp is the C ABI Python calls through ctypes.
//
// With DSA_TOPK_HOST_EMULATION defined, topk_emulator.cpp compiles this same file as host C++
// on top of a small SIMT emulation (fibers for threads), so CPU-only machines can test it.
#pragma once

#include <cstdint>
#include <type_traits>

#ifndef DSA_TOPK_HOST_EMULATION
#include <cuda_runtime.h>
#endif

#include "topk_filtered.h"

namespace dsa_topk {

constexpr int kWarpSize = 32;
constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kDigitBits = 8;
constexpr int kRadix = 1 << kDigitBits;         // bins per digit
constexpr int kKeyBits = 32;                    // fp32 scores -> 32-bit keys
constexpr int kDigits = kKeyBits / kDigitBits;  // most significant first
constexpr int kScoresPerVector = 4;             // float4 loads of a score row

// Threads per block by the longest row: short rows favour more blocks per SM, long rows more
// threads per row (each thread visits about max_len / threads scores per pass).
constexpr int kSmallRowThreads = 512;
constexpr int kLargeRowThreads = 1024;
constexpr int kSmallRowMaxLen = 4096;
// Rows up to these lengths also get a kSmallRowThreads block, caching kMidRowCachedVectors (12
// keys) or kLongRowCachedVectors (16) float4 per thread: fewer warps per barrier than a
// kLargeRowThreads block. Every pass visits every cached slot, so the block caches no more
// slots than its longest row needs (the contest's longest rows, 5248-5824 tokens, fill 12).
constexpr int kMidRowMaxLen = 6144;
constexpr int kLongRowMaxLen = 8192;

// Fast path: bins over [min key, max key]; a threshold bin of up to kFastDirectRank keys is
// ranked directly (each key compared with all, c^2 / threads comparisons per thread), a larger
// one (up to kFastCandidates) is binned once more first. A row's few largest scores stretch its
// key range, so with 2048 bins the threshold bin of most contest rows held more keys than the
// direct rank takes and the sub-binning (five more barriers) ran on nearly every row; 8192 bins
// leave few enough for the direct rank.
constexpr int kFastBinBits = 13;
constexpr int kFastDirectRank = 128;
constexpr int kFastBins = 1 << kFastBinBits;
// Sub-bins of a level-1 threshold bin (at most kFastCandidates keys): about one key each.
constexpr int kFastSubBinBits = 11;
constexpr int kFastSubBins = 1 << kFastSubBinBits;
constexpr int kMaxWarps = 1024 / kWarpSize;
// The fast path keeps its row in registers: kCachedVectors float4 per thread, so a row of up to
// kThreads * 4 * kCachedVectors scores (8192 at 1024 threads, 4096 at 512; the mid- and long-row
// blocks cache 3 and 4 float4) is read from global memory once; the four passes then cost no
// loads. Longer rows go to shared memory (below) or the radix select.
constexpr int kCachedVectors = 2;
constexpr int kMidRowCachedVectors = 3;
constexpr int kLongRowCachedVectors = 4;
// Rows longer than kLongRowMaxLen and up to kMtpSharedRowMaxLen scores take a kLargeRowThreads
// block that keeps the row's keys in shared memory instead of registers (SharedRow: 4, 8 or 9 float4
// of keys per thread, 64, 128 or 144 KiB), so the fast path's four passes read shared memory, not
// the row again from global memory digit by digit as the radix select does. The 9-vector block
// takes an MTP batch's rows of 32K + 1 tokens (block tables of 32832). Longer rows take the radix select.
constexpr int kHalfSharedRowMaxLen = 16384;
constexpr int kHalfSharedRowVectors = 4;
constexpr int kSharedRowMaxLen = 32768;
constexpr int kSharedRowVectors = 8;
constexpr int kMtpSharedRowMaxLen = 36864;
constexpr int kMtpSharedRowVectors = 9;
// float4 a thread loads before converting and storing them (registers: 1024-thread blocks have 64).
constexpr int kSharedRowLoadBatch = 4;
// Block-table entries a block copies to shared memory (every page of a shared row; longer rows read
// the table from global memory).
constexpr int kSharedTablePages = kMtpSharedRowMaxLen / kPageSize;

static_assert(kTopK % kPageSize == 0, "rows are whole pages");
static_assert(kSmallRowThreads * kCachedVectors * kScoresPerVector >= kSmallRowMaxLen, "the small-row block caches its longest row");
static_assert(kSmallRowThreads * kMidRowCachedVectors * kScoresPerVector >= kMidRowMaxLen, "the mid-row block caches its longest row");
static_assert(kSmallRowThreads * kLongRowCachedVectors * kScoresPerVector >= kLongRowMaxLen, "the long-row block caches its longest row");
static_assert(kLargeRowThreads * kHalfSharedRowVectors * kScoresPerVector == kHalfSharedRowMaxLen, "the half shared row holds its longest row");
static_assert(kLargeRowThreads * kSharedRowVectors * kScoresPerVector == kSharedRowMaxLen, "the shared row holds its longest row");
static_assert(kLargeRowThreads * kMtpSharedRowVectors * kScoresPerVector == kMtpSharedRowMaxLen, "the MTP shared row holds its longest row");
static_assert(kSharedTablePages * kPageSize >= kMtpSharedRowMaxLen, "a shared row's block table fits shared memory");
static_assert(kFastCandidates * 2 <= kFastBins, "the level-2 ties (uint2) fit in the histogram's storage");
static_assert(kFastCandidates <= kFastSubBins && kFastSubBinBits <= kFastBinBits, "level 2 needs no third level of bins");
static_assert(kRadix % kWarpSize == 0, "the threshold scan gives each warp whole bins");
static_assert(kKeyBits % kDigitBits == 0, "digits tile the key");
static_assert(kSmallRowThreads >= kRadix && kSmallRowThreads % kWarpSize == 0, "one thread per bin, whole warps");
static_assert(kLargeRowThreads >= kRadix && kLargeRowThreads % kWarpSize == 0, "one thread per bin, whole warps");

// Block-shared bookkeeping of one row's selection.
struct SelectState {
  int hist[2][kRadix];                   // histograms of the current and the next digit
  int warp_sums[kRadix / kWarpSize];     // per-warp totals of the threshold scan
  int emitted;                           // output slots taken by keys above a threshold
  int candidates[2];                     // entries in each shared candidate buffer
  int ties;                              // tickets handed to keys equal to the last threshold
  int threshold;                         // threshold bin of the current digit
  int above;                             // keys of the current set in bins above it
};

// Block-shared bookkeeping of the fast path.
struct FastState {
  alignas(16) int hist[kFastBins];    // keys per bin (level 1: the row; level 2: the candidates);
                                      // finally the level-2 threshold bin's keys as uint2
  uint2 candidates[kFastCandidates];  // (key, position) of the level-1 threshold bin's keys
  int selected[kTopK];                // the selected positions, copied out as physical ids at the end
  unsigned warp_lo[kMaxWarps];        // per-warp smallest / largest key
  unsigned warp_hi[kMaxWarps];
  int warp_totals[kMaxWarps];         // per-warp bin totals of the threshold scan
  int emitted;                        // output slots taken by keys above a threshold
  int candidate_count;
  int pass3_offsets;                  // pass 3's packed (above | in-bin << 16) counts, handed out per warp
  int threshold;                      // threshold bin of the last scan
  int above;                          // keys in bins above it
  int in_bin;                         // keys in it
};

// Larger float -> larger unsigned key (negative floats flip all bits, positive ones the sign).
__device__ __forceinline__ uint32_t order_key(float x) {
  const uint32_t bits = __float_as_uint(x);
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

__device__ __forceinline__ int digit_of(uint32_t key, int d) {
  return static_cast<int>((key >> (kKeyBits - kDigitBits * (d + 1))) & (kRadix - 1));
}

// Whether digits 0..d-1 of `key` are `prefix` (d >= 1).
__device__ __forceinline__ bool has_prefix(uint32_t key, int d, uint32_t prefix) {
  return (key >> (kKeyBits - kDigitBits * d)) == prefix;
}

// `table` is the row's block table, in shared memory when it fits (kSharedTablePages) so that
// an emitted id costs no dependent global load.
__device__ __forceinline__ int32_t physical_id(const int32_t* table, int pos) {
  return table[pos / kPageSize] * kPageSize + pos % kPageSize;
}

// Data an earlier grid of the same call wrote (the split stages' `partial`, the long top-k's scratch
// and candidates): read through L2, never from a possibly stale L1 line.
// (int, uint2, int4: the types __ldcg takes that these kernels read.)
template <typename T>
__device__ __forceinline__ T load_l2(const T* p) {
#ifdef DSA_TOPK_HOST_EMULATION
  return *p;
#else
  return __ldcg(p);
#endif
}

// What a block of filtered_topk_kernel selects from (its kKind): `vector(v)` the scores of its
// entries 4v..4v+3 (asked only for vectors that start below the block's length), `id(i)` what
// its entry i becomes in the output.
enum RowKind : int {
  kWholeRows = 0,     // a batch row; ids through the block table
  kChunkRows = 1,     // split stage 1: one chunk of a batch row; ids are row positions
  kMergedChunks = 2,  // split stage 2: the row's chunks' selections; ids through the block table
};

template <int kKind>
struct RowSource;

template <>
struct RowSource<kWholeRows> {
  const float* __restrict__ scores;  // the row's position 0; rows are 16-byte aligned
  const int32_t* table;              // its block table (moved to shared memory when it fits)
  __device__ __forceinline__ float4 vector(int v) const { return __ldg(reinterpret_cast<const float4*>(scores) + v); }
  __device__ __forceinline__ int32_t id(int pos) const { return physical_id(table, pos); }
};

template <>
struct RowSource<kChunkRows> {
  const float* __restrict__ scores;  // the chunk's first score (16-byte aligned: split_len % 4 == 0)
  int first;                         // its position in the row
  __device__ __forceinline__ float4 vector(int v) const { return __ldg(reinterpret_cast<const float4*>(scores) + v); }
  __device__ __forceinline__ int32_t id(int pos) const { return first + pos; }
};

template <>
struct RowSource<kMergedChunks> {
  const float* __restrict__ scores;  // the batch row's position 0
  const int32_t* positions;          // its candidates' row positions: the row's `partial` entries (16-byte aligned)
  int count;                         // candidates
  const int32_t* table;              // the batch row's block table
  __device__ __forceinline__ float4 vector(int v) const {
    int4 p = load_l2(reinterpret_cast<const int4*>(positions) + v);
    // The last vector's entries past `count` are not candidates: read position 0 for them (their
    // keys are dropped by the length test, and the entries may hold anything).
    const int at = v * kScoresPerVector;
    p.y = at + 1 < count ? p.y : 0;
    p.z = at + 2 < count ? p.z : 0;
    p.w = at + 3 < count ? p.w : 0;
    return make_float4(__ldg(scores + p.x), __ldg(scores + p.y), __ldg(scores + p.z), __ldg(scores + p.w));
  }
  __device__ __forceinline__ int32_t id(int i) const { return physical_id(table, load_l2(positions + i)); }
};

// Warp-collective: reserves one slot of `*counter` per lane with `take`, with one shared-memory
// atomic per warp. Returns the lane's slot, or -1. Every lane of the warp must call it.
__device__ __forceinline__ int warp_reserve(bool take, int* counter) {
  const unsigned takers = __ballot_sync(kFullMask, take);
  if (takers == 0) return -1;
  const int lane = threadIdx.x % kWarpSize;
  const int leader = __ffs(takers) - 1;
  int base = 0;
  if (lane == leader) base = atomicAdd(counter, __popc(takers));
  base = __shfl_sync(kFullMask, base, leader);
  return take ? base + __popc(takers & ((1u << lane) - 1u)) : -1;
}

// Warp-collective histogram update: lanes that hit the same bin add once, together. Scores
// cluster, so a plain per-lane atomic would serialise on a few hot bins. Every lane of the warp
// must call it; non-members match among themselves under a bin value no member can have.
__device__ __forceinline__ void histogram_add(int* hist, int bin, bool member) {
  const unsigned peers = __match_any_sync(kFullMask, member ? bin : -1);
  if (member && static_cast<int>(threadIdx.x % kWarpSize) == __ffs(peers) - 1) atomicAdd(&hist[bin], __popc(peers));
}

// A warp whose lanes hold at most this many candidates equal to their left neighbour's bin adds
// them with one shared atomic per lane; a more crowded warp aggregates equal bins (histogram_add).
constexpr int kCrowdedNeighbours = 4;

// Histogram update for bins a warp's lanes rarely share (the cluster top-k's range bins; the
// multi-pass top-k's fixed 12-bit bins, which still spread a plain row's keys over several), where one
// plain atomic per lane is cheapest: match.any's aggregation cost the cluster top-k about 8 of its
// 19 µs at B = 1 x 128K on an H100, the multi-pass one a third of its time at B = 64 x 128K
// (docs/kernels/indexer.md). Warps of
// near-constant or outlier-stretched rows, where many neighbouring lanes share a bin, still
// aggregate, so a hot bin never serialises a warp's atomics. Warp-collective.
__device__ __forceinline__ void histogram_add_spread(int* hist, int bin, bool member) {
  const int key = member ? bin : -1;
  const int left = __shfl_up_sync(kFullMask, key, 1);  // lane 0 compares with itself
  const int crowded = __popc(__ballot_sync(kFullMask, member && key == left));
  if (crowded > kCrowdedNeighbours) {
    histogram_add(hist, bin, member);
  } else if (member) {
    atomicAdd(&hist[bin], 1);
  }
}

// The block's dynamic shared memory (the candidate buffers).
template <typename T>
__device__ __forceinline__ T* dynamic_shared() {
#ifdef DSA_TOPK_HOST_EMULATION
  return reinterpret_cast<T*>(simt::dynamic_shared_memory());
#else
  extern __shared__ __align__(16) unsigned char dynamic_smem[];
  return reinterpret_cast<T*>(dynamic_smem);
#endif
}

// Inclusive prefix sum of `value` over the lanes of a warp (`lane` is the caller's). Warp-collective.
__device__ __forceinline__ int warp_inclusive_sum(int value, int lane) {
  for (int offset = 1; offset < kWarpSize; offset <<= 1) {
    const int v = __shfl_up_sync(kFullMask, value, offset);
    if (lane >= offset) value += v;
  }
  return value;
}

// Finds the bin t of `hist` with count(bins > t) < need <= count(bins >= t); stores t and
// count(bins > t) in `s`. Needs 1 <= need <= the histogram's total, so t exists. Block-wide.
__device__ __forceinline__ void select_threshold(const int* hist, int need, SelectState& s) {
  const int tid = threadIdx.x;
  const int lane = tid % kWarpSize;
  const int warp = tid / kWarpSize;
  int count = 0;
  int at_or_above = 0;
  if (tid < kRadix) {  // warp-uniform: whole warps own bins
    // Thread i owns bin kRadix-1-i, so an inclusive prefix sum over threads counts bins >= it.
    count = hist[kRadix - 1 - tid];
    at_or_above = warp_inclusive_sum(count, lane);
    if (lane == kWarpSize - 1) s.warp_sums[warp] = at_or_above;
  }
  __syncthreads();
  if (tid < kRadix) {
    for (int w = 0; w < warp; ++w) at_or_above += s.warp_sums[w];
    const int above = at_or_above - count;
    if (above < need && at_or_above >= need) {  // exactly one bin satisfies this
      s.threshold = kRadix - 1 - tid;
      s.above = above;
    }
  }
  __syncthreads();
}

// Calls visit(key, position, member) for each entry of a block's row (a RowSource) in float4 steps;
// `member` is false past `len`. Every thread makes the same number of calls, so `visit` may use
// warp-collective operations.
template <int kThreads, typename Source, typename Visit>
__device__ __forceinline__ void for_each_score(const Source& src, int len, Visit&& visit) {
  const int vectors = (len + kScoresPerVector - 1) / kScoresPerVector;
  for (int first = 0; first < vectors; first += kThreads) {
    const int v = first + static_cast<int>(threadIdx.x);
    // Rows are 16-byte aligned and padded to whole pages, so a vector starting below len is in bounds.
    float4 x = make_float4(0.f, 0.f, 0.f, 0.f);
    if (v < vectors) x = src.vector(v);
    const int pos = v * kScoresPerVector;
    visit(order_key(x.x), pos + 0, pos + 0 < len);
    visit(order_key(x.y), pos + 1, pos + 1 < len);
    visit(order_key(x.z), pos + 2, pos + 2 < len);
    visit(order_key(x.w), pos + 3, pos + 3 < len);
  }
}

// One row of scores as order-preserving keys in the registers of a block: thread t holds the
// float4 vectors t, t + kThreads, ... of the row. Rows are 16-byte aligned and padded to whole
// pages, so a vector starting below len is in bounds. A cached slot past len holds kNoKey, below
// every member's key, so the passes need no position test: a member's key is at least
// kNoKey + 1 (only a NaN score has key 0, and it merges with its neighbour).
constexpr uint32_t kNoKey = 0u;

// Position in its row of slot i of this thread's entries of the chunk at `start`, in float4 vectors:
// thread t holds vectors t, t + kThreads, ... of the chunk.
template <int kThreads>
__device__ __forceinline__ int score_position(int start, int i) {
  return start + ((i / kScoresPerVector) * kThreads + static_cast<int>(threadIdx.x)) * kScoresPerVector + i % kScoresPerVector;
}

// The order keys of this thread's kSlots scores of the chunk at `start` of a score `row` (slot i at
// score_position); returns the bit mask of the slots below `len`.
template <int kThreads, int kSlots>
__device__ __forceinline__ uint32_t load_score_keys(const float* __restrict__ row, int start, int len, uint32_t (&keys)[kSlots]) {
  constexpr int kVectors = kSlots / kScoresPerVector;
  static_assert(kVectors * kScoresPerVector == kSlots && kSlots <= 32, "whole float4 per thread, one bit per slot");
  float4 x[kVectors];
#pragma unroll
  for (int c = 0; c < kVectors; ++c) {
    const int p = score_position<kThreads>(start, c * kScoresPerVector);
    // Rows are 16-byte aligned and padded to whole pages, so a vector starting below len is in bounds.
    x[c] = p < len ? __ldg(reinterpret_cast<const float4*>(row + p)) : make_float4(0.f, 0.f, 0.f, 0.f);
  }
  uint32_t below_len = 0u;
#pragma unroll
  for (int c = 0; c < kVectors; ++c) {
    const float values[kScoresPerVector] = {x[c].x, x[c].y, x[c].z, x[c].w};
#pragma unroll
    for (int e = 0; e < kScoresPerVector; ++e) {
      const int i = c * kScoresPerVector + e;
      keys[i] = order_key(values[e]);
      if (score_position<kThreads>(start, i) < len) below_len |= 1u << i;
    }
  }
  return below_len;
}

template <int kThreads, int kVectors = kCachedVectors>
struct CachedRow {
  static constexpr int kCachedKeys = kVectors * kScoresPerVector;
  static constexpr int kCapacity = kThreads * kCachedKeys;
  static constexpr bool kOneKeyBins = false;  // fast_select: a large one-key threshold bin gives up

  uint32_t keys[kCachedKeys];

  // Row position of cached slot i of the calling thread.
  static __device__ __forceinline__ int position(int i) { return score_position<kThreads>(0, i); }

  // The keys of the calling thread's slots 4c..4c+3 (free: they are registers).
  __device__ __forceinline__ uint4 vector(int c) const { return make_uint4(keys[4 * c], keys[4 * c + 1], keys[4 * c + 2], keys[4 * c + 3]); }

  // Issues every load first (they overlap); the caller needs len <= kCapacity. (Not load_score_keys:
  // this form is the one measured on the contest's rows; it keeps the row's length test per vector.)
  template <typename Source>
  __device__ __forceinline__ void load(const Source& src, int len) {
    const int vectors = (len + kScoresPerVector - 1) / kScoresPerVector;
    float4 x[kVectors];
#pragma unroll
    for (int c = 0; c < kVectors; ++c) {
      const int v = c * kThreads + static_cast<int>(threadIdx.x);
      x[c] = v < vectors ? src.vector(v) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
#pragma unroll
    for (int c = 0; c < kVectors; ++c) {
      const float values[kScoresPerVector] = {x[c].x, x[c].y, x[c].z, x[c].w};
#pragma unroll
      for (int e = 0; e < kScoresPerVector; ++e) {
        const int i = c * kScoresPerVector + e;
        const uint32_t key = order_key(values[e]);
        keys[i] = position(i) < len ? (key > kNoKey ? key : kNoKey + 1u) : kNoKey;
      }
    }
  }
};

// One row of scores as order keys in the block's dynamic shared memory, for rows too long for
// registers (kLongRowMaxLen < len <= kSharedRowMaxLen). The slots are CachedRow's (thread t's slot i
// is row position score_position(0, i)) and the keys lie in row order, so a thread's slots 4c..4c+3
// are one 16-byte vector: the passes read a warp's vectors without bank conflicts. Each thread
// reads only the slots it stored, so no barrier separates the load from the passes. Slots past
// len hold kNoKey, as in CachedRow. The radix select's candidate buffers reuse this memory: they
// are written only after the fast path has given up on the row, past a barrier.
template <int kThreads, int kVectors>
struct SharedRow {
  static constexpr int kCachedKeys = kVectors * kScoresPerVector;
  static constexpr int kCapacity = kThreads * kCachedKeys;
  static constexpr int kBytes = kCapacity * static_cast<int>(sizeof(uint32_t));
  static constexpr bool kOneKeyBins = true;  // fast_select hands a one-key threshold bin's keys out itself

  uint4* vectors = dynamic_shared<uint4>();  // vector v: the keys of row positions 4v..4v+3

  static __device__ __forceinline__ int position(int i) { return score_position<kThreads>(0, i); }

  __device__ __forceinline__ uint4 vector(int c) const { return vectors[c * kThreads + static_cast<int>(threadIdx.x)]; }

  // The caller needs len <= kCapacity. Loads kSharedRowLoadBatch float4 at a time, then stores their keys.
  template <typename Source>
  __device__ __forceinline__ void load(const Source& src, int len) {
    const int row_vectors = (len + kScoresPerVector - 1) / kScoresPerVector;
#pragma unroll
    for (int c0 = 0; c0 < kVectors; c0 += kSharedRowLoadBatch) {
      constexpr int kBatch = kSharedRowLoadBatch;
      float4 x[kBatch];
#pragma unroll
      for (int b = 0; b < kBatch && c0 + b < kVectors; ++b) {
        const int v = (c0 + b) * kThreads + static_cast<int>(threadIdx.x);
        x[b] = v < row_vectors ? src.vector(v) : make_float4(0.f, 0.f, 0.f, 0.f);
      }
#pragma unroll
      for (int b = 0; b < kBatch && c0 + b < kVectors; ++b) {
        const int v = (c0 + b) * kThreads + static_cast<int>(threadIdx.x);
        const float values[kScoresPerVector] = {x[b].x, x[b].y, x[b].z, x[b].w};
        uint32_t keys[kScoresPerVector];
#pragma unroll
        for (int e = 0; e < kScoresPerVector; ++e) {
          const uint32_t key = order_key(values[e]);
          keys[e] = v * kScoresPerVector + e < len ? (key > kNoKey ? key : kNoKey + 1u) : kNoKey;
        }
        vectors[v] = make_uint4(keys[0], keys[1], keys[2], keys[3]);
      }
    }
  }
};

__device__ __forceinline__ int bit_count(uint32_t mask) { return __popc(mask); }
__device__ __forceinline__ int bit_count(unsigned long long mask) { return __popcll(mask); }

// The fast path's threshold bin as keys: [bin_lo, bin_end), its end clamped to hi + 1 (a bin past the
// range holds no key; hi < 0xffffffff, so hi + 1 does not wrap). A member key is above the bin iff
// key >= bin_end and in it iff key - bin_lo < bin_end - bin_lo; kNoKey is neither.
__device__ __forceinline__ uint32_t threshold_bin_lo(uint32_t lo, int threshold, int shift) {
  return lo + (static_cast<uint32_t>(threshold) << shift);
}
__device__ __forceinline__ uint32_t threshold_bin_end(uint32_t lo, uint32_t range, int threshold, int shift) {
  const uint64_t bin_span = static_cast<uint64_t>(range) + 1u - (static_cast<uint64_t>(threshold) << shift);
  const uint64_t bin_width = static_cast<uint64_t>(1) << shift;
  return threshold_bin_lo(lo, threshold, shift) + static_cast<uint32_t>(bin_width < bin_span ? bin_width : bin_span);
}

// Calls visit(slot, key) for each of the calling thread's slots of a cached row (CachedRow or
// SharedRow), a 16-byte vector at a time; fully unrolled, so `slot` is a constant in each call.
template <typename Row, typename Visit>
__device__ __forceinline__ void for_each_slot(const Row& row, Visit&& visit) {
#pragma unroll
  for (int c = 0; c < Row::kCachedKeys / kScoresPerVector; ++c) {
    const uint4 v = row.vector(c);
    visit(4 * c + 0, v.x);
    visit(4 * c + 1, v.y);
    visit(4 * c + 2, v.z);
    visit(4 * c + 3, v.w);
  }
}

// Calls visit(key, position, member) for each entry of a shared candidate buffer, with the
// same all-threads-call guarantee as for_each_score.
template <int kThreads, typename Visit>
__device__ __forceinline__ void for_each_candidate(const uint2* buffer, int count, Visit&& visit) {
  for (int first = 0; first < count; first += kThreads) {
    const int i = first + static_cast<int>(threadIdx.x);
    const bool member = i < count;
    const uint2 entry = member ? buffer[i] : make_uint2(0u, 0u);
    visit(entry.x, static_cast<int>(entry.y), member);
  }
}

// Warp reductions are single redux.sync instructions (sm_80 and later), not chains of five shuffles.
__device__ __forceinline__ unsigned warp_reduce(unsigned v, bool take_max) {
  return take_max ? __reduce_max_sync(kFullMask, v) : __reduce_min_sync(kFullMask, v);
}

// Block-wide smallest `lo` and largest `hi` over the threads' values; every thread gets both.
// `warp_lo` and `warp_hi` are block-shared scratch of kMaxWarps; one barrier inside, so every thread
// must call it and the scratch may be reused only after the caller's next barrier.
template <int kThreads>
__device__ __forceinline__ void block_min_max(unsigned& lo, unsigned& hi, unsigned* warp_lo, unsigned* warp_hi) {
  constexpr int kWarps = kThreads / kWarpSize;
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  lo = warp_reduce(lo, false);
  hi = warp_reduce(hi, true);
  if (lane == 0) {
    warp_lo[warp] = lo;
    warp_hi[warp] = hi;
  }
  __syncthreads();
  // Lane w reads warp w's extremes, then a warp reduction (no chain of kWarps shared loads).
  lo = warp_reduce(lane < kWarps ? warp_lo[lane] : 0xffffffffu, false);
  hi = warp_reduce(lane < kWarps ? warp_hi[lane] : 0u, true);
}

// Block-wide inclusive prefix sum of `value` over threads in index order (`lane` and `warp` are
// the calling thread's). `warp_totals` is block-shared scratch of kMaxWarps ints; one barrier
// inside, so every thread must call it and the scratch may be reused only after the caller's
// next barrier.
template <int kThreads>
__device__ __forceinline__ int block_inclusive_sum(int value, int lane, int warp, int* warp_totals) {
  constexpr int kWarps = kThreads / kWarpSize;
  static_assert(kWarps <= kWarpSize, "one lane per warp total");
  const int inclusive = warp_inclusive_sum(value, lane);
  if (lane == kWarpSize - 1) warp_totals[warp] = inclusive;
  __syncthreads();
  // The earlier warps' totals: lane w reads warp w's (all lanes at once), then one warp sum,
  // instead of a chain of up to 31 dependent shared loads in the last warp.
  const int earlier = lane < warp ? warp_totals[lane] : 0;  // lane < warp < kWarps
  return inclusive + __reduce_add_sync(kFullMask, earlier);
}

// Zeroes a block-shared histogram of kBins counts (16-byte aligned), in int4 stores.
template <int kThreads, int kBins>
__device__ __forceinline__ void zero_bins(int* hist) {
  static_assert(kBins % 4 == 0, "whole int4 vectors");
  int4* vectors = reinterpret_cast<int4*>(hist);
  for (int i = threadIdx.x; i < kBins / 4; i += kThreads) vectors[i] = make_int4(0, 0, 0, 0);
}

// Finds the bin t of the kBins counts in f.hist with count(bins > t) < need <= count(bins >= t)
// and stores t and count(bins > t) in f.threshold / f.above (and count(t) in f.in_bin). Needs
// 1 <= need <= the histogram's total. Thread i owns bins [kBins - (i + 1) * per, kBins - i * per),
// so an inclusive prefix sum over threads counts keys from the top bin down; the one thread whose
// run holds t reads its run again and walks it. Block-wide; the caller's histogram must be
// complete (a barrier before), and a barrier ends it.
template <int kThreads, int kBins>
__device__ __forceinline__ void fast_threshold(FastState& f, int need) {
  constexpr int kBinsPerThread = kBins / kThreads;
  static_assert(kBins % kThreads == 0 && kBins <= kFastBins && kThreads / kWarpSize <= kMaxWarps, "threads own whole, equal runs of bins");
  const int tid = threadIdx.x;
  const int lane = tid % kWarpSize;
  const int warp = tid / kWarpSize;
  const int first = kBins - (tid + 1) * kBinsPerThread;  // this thread's lowest bin
  int mine = 0;
  if constexpr (kBinsPerThread % 4 == 0) {
    // int4 loads of the run, each thread starting at another of its vectors: consecutive
    // threads' runs lie kBinsPerThread words apart, so reading them in step would put most of a
    // warp's loads in the same few banks (16-way conflicts at 16 bins per thread).
    constexpr int kVectorsPerThread = kBinsPerThread / 4;
    const int4* own = reinterpret_cast<const int4*>(f.hist + first);
#pragma unroll
    for (int v = 0; v < kVectorsPerThread; ++v) {
      const int4 c = own[(v + tid) % kVectorsPerThread];
      mine += c.x + c.y + c.z + c.w;
    }
  } else {
#pragma unroll
    for (int b = 0; b < kBinsPerThread; ++b) mine += f.hist[first + b];
  }
  const int inclusive = block_inclusive_sum<kThreads>(mine, lane, warp, f.warp_totals);
  const int above_run = inclusive - mine;  // keys in bins above this thread's
  if (above_run < need && inclusive >= need) {  // exactly one thread: the threshold bin is here
    int counts[kBinsPerThread];
#pragma unroll
    for (int b = 0; b < kBinsPerThread; ++b) counts[b] = f.hist[first + b];  // independent loads
    // Branch-free walk from this thread's highest bin down: selects, then one store each. A walk
    // with a store per tested bin compiled to a branch per bin, and the other warps waited at the
    // barrier below for all of it.
    int running = above_run;
    int at = 0, above_at = 0, in_at = 0;
#pragma unroll
    for (int b = kBinsPerThread - 1; b >= 0; --b) {
      const int next = running + counts[b];
      const bool here = running < need && next >= need;  // exactly one bin of the run
      at = here ? b : at;
      above_at = here ? running : above_at;
      in_at = here ? counts[b] : in_at;
      running = next;
    }
    f.threshold = first + at;
    f.above = above_at;
    f.in_bin = in_at;
  }
  __syncthreads();
}

// The fast path (see the top of this file) for one cached row of more than kTopK scores. Returns false,
// having written nothing, when the row's threshold bin holds more than `max_candidates` keys.
// Block-wide: every thread calls it and all get the same result.
template <int kThreads, typename Row, typename Source>
__device__ bool fast_select(const Row& row, int max_candidates, const Source& src, int32_t* __restrict__ out_row,
                            FastState& f, const int topk) {
  constexpr int kWarps = kThreads / kWarpSize;
  const int tid = threadIdx.x;
  const int lane = tid % kWarpSize;
  const int warp = tid / kWarpSize;

  constexpr int kSlots = Row::kCachedKeys;
  static_assert(kSlots <= 64, "a thread's slot classes fit one mask");
  // One bit per slot: 32-bit masks where they suffice (every register row), 64-bit past 32 slots.
  using Mask = std::conditional_t<(kSlots > 32), unsigned long long, uint32_t>;

  // Pass 1 over the row: its key range (the histogram is zeroed meanwhile). kNoKey - 1 wraps to
  // the largest value, so slots past len drop out of the minimum without a test.
  zero_bins<kThreads, kFastBins>(f.hist);
  if (tid == 0) f.pass3_offsets = 0;
  unsigned lo_less_one = 0xffffffffu, hi = 0u;
  for_each_slot(row, [&](int, uint32_t key) {
    const uint32_t less_one = key - 1u;
    lo_less_one = less_one < lo_less_one ? less_one : lo_less_one;
    hi = key > hi ? key : hi;
  });
  // (Not block_min_max: this form, with the caller's lane and warp, is the one measured on the contest's rows.)
  lo_less_one = warp_reduce(lo_less_one, false);
  hi = warp_reduce(hi, true);
  if (lane == 0) {
    f.warp_lo[warp] = lo_less_one;
    f.warp_hi[warp] = hi;
  }
  __syncthreads();
  // Lane w reads warp w's extremes, then a warp reduction (no chain of kWarps shared loads).
  const unsigned lo = warp_reduce(lane < kWarps ? f.warp_lo[lane] : 0xffffffffu, false) + 1u;
  hi = warp_reduce(lane < kWarps ? f.warp_hi[lane] : 0u, true);
  // Level-1 bin = (key - lo) >> shift < kFastBins: the shift keeps the top kFastBinBits of the range.
  // The largest key (only a NaN score has it) would leave the threshold bin's end below
  // (fast_select's bin_end): such a row takes the radix select. Block-uniform; nothing written yet.
  if (hi == 0xffffffffu) return false;
  const unsigned range = hi - lo;
  const int range_bits = range == 0 ? 0 : kKeyBits - __clz(range);
  const int shift = range_bits > kFastBinBits ? range_bits - kFastBinBits : 0;

  // Pass 2: level-1 histogram, and its threshold bin for kTopK. Plain shared atomics: the
  // thread does not wait for them, and range bins seldom collide (a row of equal keys does,
  // and then falls back to the radix select anyway).
  for_each_slot(row, [&](int, uint32_t key) {
    if (key != kNoKey) atomicAdd(&f.hist[(key - lo) >> shift], 1);
  });
  __syncthreads();
  fast_threshold<kThreads, kFastBins>(f, topk);
  // The threshold bin: bin `threshold` of the level whose bins of 2^level_shift keys start at
  // level_lo and span level_range + 1 keys (level 1: the row's range).
  int threshold = f.threshold;
  int above = f.above;
  int in_bin = f.in_bin;  // read from f, not f.hist: other threads zero the bins after pass 4
  uint32_t level_lo = lo;
  uint32_t level_range = range;
  int level_shift = shift;
  // Shared rows only (the register rows' blocks, the contest's, keep their code and registers, and
  // their rare overfull bins take the radix select): a threshold bin with more keys than the
  // candidate buffer takes is binned again over the row itself, kFastBins sub-bins of its key range
  // (the next kFastBinBits bits), until its threshold sub-bin fits or is one key wide. Each level is
  // one pass over the thread's own slots, the scan and three barriers; a 32-bit key needs at most
  // three levels. Keys above a level's threshold bin count as `above`.
  if constexpr (Row::kOneKeyBins) {
    while (in_bin > max_candidates && level_shift > 0) {  // block-uniform
      const uint32_t bin_lo = threshold_bin_lo(level_lo, threshold, level_shift);
      const uint32_t bin_span = threshold_bin_end(level_lo, level_range, threshold, level_shift) - bin_lo;  // >= 1
      const int sub_shift = level_shift > kFastBinBits ? level_shift - kFastBinBits : 0;
      zero_bins<kThreads, kFastBins>(f.hist);  // the last scan's walk read the bins before its barrier
      __syncthreads();
      for_each_slot(row, [&](int, uint32_t key) {
        if (key - bin_lo < bin_span) atomicAdd(&f.hist[(key - bin_lo) >> sub_shift], 1);
      });
      __syncthreads();
      fast_threshold<kThreads, kFastBins>(f, topk - above);
      threshold = f.threshold;
      above += f.above;
      in_bin = f.in_bin;
      level_lo = bin_lo;
      level_range = bin_span - 1u;
      level_shift = sub_shift;
    }
  }
  // A threshold bin one key wide holds equal scores, any of which will do: pass 4 hands its keys the
  // slots left after the keys above it by their scanned offsets, however many there are.
  const bool one_key_bin = Row::kOneKeyBins && level_shift == 0;  // block-uniform
  if (in_bin > max_candidates && !one_key_bin) return false;   // block-uniform; nothing written yet
  const uint32_t bin_lo = threshold_bin_lo(level_lo, threshold, level_shift);
  const uint32_t bin_end = threshold_bin_end(level_lo, level_range, threshold, level_shift);

  // Pass 3: each thread classifies its slots into two bit masks (above the threshold bin, in it)
  // and counts them; a scan over the warp and one shared atomic per warp (its block of offsets,
  // in whatever order the warps come) turn the counts into the thread's own output and
  // candidate offsets, so pass 4 writes without per-key votes or atomics, and no barrier waits
  // for the other warps. Both counts travel packed in one int: the in-bin count in the low 16
  // bits (at most a row, 36864), `above` (< kTopK) above them.
  Mask above_mask = 0u;
  Mask tie_mask = 0u;
  for_each_slot(row, [&](int i, uint32_t key) {
    if (key >= bin_end) above_mask |= Mask{1} << i;
    if (key - bin_lo < bin_end - bin_lo) tie_mask |= Mask{1} << i;
  });
  const int packed = bit_count(tie_mask) | (bit_count(above_mask) << 16);
  const int inclusive = warp_inclusive_sum(packed, lane);
  int warp_base = 0;
  if (lane == kWarpSize - 1) warp_base = atomicAdd(&f.pass3_offsets, inclusive);
  const int exclusive = __shfl_sync(kFullMask, warp_base, kWarpSize - 1) + inclusive - packed;
  int out_at = exclusive >> 16;

  // Pass 4: emit the slots above the threshold bin, collect the ones in it (few threads have any).
#pragma unroll
  for (int i = 0; i < kSlots; ++i) {
    if (above_mask & (Mask{1} << i)) f.selected[out_at++] = Row::position(i);
  }
  // The row's ids in coalesced stores: the scattered per-thread runs went to shared memory.
  auto copy_out = [&] {
    __syncthreads();
    for (int i = tid; i < topk; i += kThreads) out_row[i] = src.id(f.selected[i]);
  };
  if constexpr (Row::kOneKeyBins) {
    if (one_key_bin) {
      int tie_at = exclusive & 0xffff;
#pragma unroll
      for (int i = 0; i < kSlots; ++i) {
        if (tie_mask & (Mask{1} << i)) {
          if (tie_at < topk - above) f.selected[above + tie_at] = Row::position(i);
          ++tie_at;
        }
      }
      copy_out();
      return true;
    }
  }
  if (tie_mask != 0u) {
    int tie_at = exclusive & 0xffff;
    for_each_slot(row, [&](int i, uint32_t key) {
      if (tie_mask & (Mask{1} << i)) f.candidates[tie_at++] = make_uint2(key, static_cast<uint32_t>(Row::position(i)));
    });
  }
  const bool subdivide = in_bin > kFastDirectRank;  // block-uniform
  if (subdivide) zero_bins<kThreads, kFastSubBins>(f.hist);
  if (tid == 0) f.emitted = above;  // level 2 hands out the slots after the keys above
  __syncthreads();

  // Level 2, on the candidates: sub-bins of the threshold bin's key range, the next
  // kFastSubBinBits bits below `shift` (just the remaining bits when fewer are left). Candidates
  // above the sub-threshold bin take slots after the level-1 keys; the sub-threshold bin's keys
  // are compacted into `ties` (the histogram's storage, free by then) and ranked against each
  // other (larger key first, then lower position) for the remaining slots. A small level-1 bin
  // skips the sub-binning: all its keys are ranked.
  const int need = topk - above;  // slots left for the threshold bin's keys, >= 1
  const int shift2 = level_shift > kFastSubBinBits ? level_shift - kFastSubBinBits : 0;
  const uint32_t base = bin_lo;  // smallest key of the bin
  auto sub_bin = [&](uint32_t key) { return subdivide ? static_cast<int>((key - base) >> shift2) : 0; };
  int sub_threshold = 0;
  int sub_above = 0;
  int tie_count = in_bin;
  const uint2* ties = f.candidates;
  if (subdivide) {
    for (int i = tid; i < in_bin; i += kThreads) atomicAdd(&f.hist[sub_bin(f.candidates[i].x)], 1);
    __syncthreads();
    fast_threshold<kThreads, kFastSubBins>(f, need);
    sub_threshold = f.threshold;
    sub_above = f.above;
    tie_count = f.in_bin;
    __syncthreads();  // every thread has its copies before the histogram's storage is reused
    uint2* sub_ties = reinterpret_cast<uint2*>(f.hist);
    if (tid == 0) f.candidate_count = 0;
    __syncthreads();
    for (int first = 0; first < in_bin; first += kThreads) {
      const int i = first + tid;
      const uint2 me = i < in_bin ? f.candidates[i] : make_uint2(0u, 0u);
      const int sub = i < in_bin ? sub_bin(me.x) : -1;
      const int slot = warp_reserve(sub > sub_threshold, &f.emitted);
      if (sub > sub_threshold) f.selected[slot] = static_cast<int>(me.y);
      const int at = warp_reserve(sub == sub_threshold, &f.candidate_count);
      if (sub == sub_threshold) sub_ties[at] = me;
    }
    __syncthreads();
    ties = sub_ties;
  }
  // Rank each tie against all the others (larger key first, then lower position): `lanes`
  // threads of one warp share a key, each comparing a strided share, and add up by shuffles, so
  // a bin of 64 keys costs 1024 threads four comparisons each instead of 64.
  const int first_tie_slot = above + sub_above;
  const int tie_need = need - sub_above;
  int lane_bits = 5;  // lanes = 2^lane_bits threads per key (shifts, not divisions by a runtime value)
  static_assert(kWarpSize == 1 << 5, "32 lanes");
  while (lane_bits > 0 && (tie_count << lane_bits) > kThreads) --lane_bits;
  const int lanes = 1 << lane_bits;
  const int groups = kThreads >> lane_bits;
  const int group = tid >> lane_bits;
  const int member_lane = tid & (lanes - 1);
  for (int first = 0; first < tie_count; first += groups) {  // the same trip count in every thread
    const int i = first + group;
    const bool member = i < tie_count;
    const uint2 me = member ? ties[i] : make_uint2(0u, 0u);
    int rank = 0;
    if (member) {
      for (int j = member_lane; j < tie_count; j += lanes) {
        const uint2 other = ties[j];
        rank += other.x > me.x || (other.x == me.x && other.y < me.y);
      }
    }
    for (int offset = lanes / 2; offset > 0; offset >>= 1) rank += __shfl_xor_sync(kFullMask, rank, offset);
    if (member && member_lane == 0 && rank < tie_need) f.selected[first_tie_slot + rank] = static_cast<int>(me.y);
  }
  copy_out();
  return true;
}

// Programmatic dependent launch: returns once the grid this one depends on has completed and its
// memory operations are visible (at once when the launch had no such dependency).
__device__ __forceinline__ void wait_for_preceding_grid() {
#if !defined(DSA_TOPK_HOST_EMULATION) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// kVectors: float4 of the row cached per thread, in registers (CachedRow) or, with kSharedRow, in
// the dynamic shared memory (SharedRow). Every block asks for one block per SM, so that ptxas may
// give it the registers it needs without spilling: left to itself it held the 8-key block to 40
// registers and spilled 16 bytes (more blocks still share an SM when they fit).
// kKind (RowKind): what a block selects from; kWholeRows is the top-k of a batch row, the other two
// are the stages of the split top-k (topk_filtered.h).
template <int kThreads, int kVectors = kCachedVectors, bool kSharedRow = false, int kKind = kWholeRows>
__global__ void __launch_bounds__(kThreads, 1) filtered_topk_kernel(TopkArgs args) {
  using Row = std::conditional_t<kSharedRow, SharedRow<kThreads, kVectors>, CachedRow<kThreads, kVectors>>;
  static_assert(kThreads % kWarpSize == 0 && kThreads >= kRadix, "whole warps, one thread per bin");
  __shared__ SelectState s;
  uint2* candidate_buffers = dynamic_shared<uint2>();  // [2][capacity] (key, position) pairs

  const int topk = args.topk;  // 1..kTopK (the C ABI checks)
  const int row = blockIdx.x;  // the batch row; with kChunkRows, batch row * split_chunks + chunk
  RowSource<kKind> src;
  int len;  // entries the block selects from
  int32_t* __restrict__ out_row;
  const int32_t* table_row = nullptr;
  int row_len;  // tokens of the batch row
  if constexpr (kKind == kChunkRows) {
    const int batch_row = row / args.split_chunks;
    const int first = (row - batch_row * args.split_chunks) * args.split_len;
    row_len = args.seq_lens[batch_row];
    const int rest = row_len - first;
    len = rest < 0 ? 0 : rest < args.split_len ? rest : args.split_len;
    src = RowSource<kChunkRows>{args.scores + batch_row * args.score_stride + first, first};
    out_row = args.partial + static_cast<int64_t>(row) * topk;
  } else {
    row_len = args.seq_lens[row];
    table_row = args.block_table + row * args.bt_stride;
    out_row = args.out + row * args.out_stride;
    if constexpr (kKind == kMergedChunks) {
      const int chunks = (row_len + args.split_len - 1) / args.split_len;
      const int last = row_len - (chunks - 1) * args.split_len;  // tokens of the last chunk
      len = chunks == 0 ? 0 : (chunks - 1) * topk + (last < topk ? last : topk);
      const int32_t* positions = args.partial + static_cast<int64_t>(row) * args.split_chunks * topk;
      src = RowSource<kMergedChunks>{args.scores + row * args.score_stride, positions, len, table_row};
      // Even a passthrough reads `partial`, which stage 1 writes.
      wait_for_preceding_grid();
    } else {
      len = row_len;
      src = RowSource<kWholeRows>{args.scores + row * args.score_stride, table_row};
    }
  }
  // seq_len beyond max_num_pages * 64 breaks the contract (and would lose a split row's chunks): fail loudly
  if (row_len > args.max_len) __trap();

  if (len <= topk) {  // passthrough: every entry is selected, no scores needed
    if constexpr (kKind == kWholeRows) {
      for (int i = threadIdx.x; i < topk; i += kThreads) out_row[i] = i < len ? __ldg(table_row + i / kPageSize) * kPageSize + i % kPageSize : -1;
    } else {
      for (int i = threadIdx.x; i < topk; i += kThreads) out_row[i] = i < len ? src.id(i) : -1;
    }
    return;
  }
  // The row's pages go to shared memory; every path below passes a barrier before its first emit.
  const bool try_fast = args.fast_candidates > 0 && len <= Row::kCapacity;  // block-uniform
  Row cached;
  __shared__ int32_t shared_table[kSharedTablePages];
  const int pages = (row_len + kPageSize - 1) / kPageSize;
  auto copy_table = [&] {
    if constexpr (kKind != kChunkRows) {  // a chunk's ids are row positions
      if (pages <= kSharedTablePages) {
        for (int i = threadIdx.x; i < pages; i += kThreads) shared_table[i] = __ldg(table_row + i);
        src.table = shared_table;
      }
    }
  };
  if (args.dependent_launch) {
    // The score kernel may still be running: copy the table (not written by it), then wait for
    // its completion and memory flush before the first score is read.
    copy_table();
    wait_for_preceding_grid();
    if (try_fast) cached.load(src, len);
  } else {
    // The fast path's row loads are issued first, so that they overlap the block-table copy.
    if (try_fast) cached.load(src, len);
    copy_table();
  }
  if (try_fast) {
    __shared__ FastState fast;
    if (fast_select<kThreads>(cached, args.fast_candidates, src, out_row, fast, topk)) return;
  }
  const int capacity = args.candidate_capacity;

  for (int i = threadIdx.x; i < kRadix; i += kThreads) s.hist[0][i] = 0;
  if (threadIdx.x == 0) {
    s.emitted = 0;
    s.candidates[0] = s.candidates[1] = 0;
  }
  __syncthreads();
  for_each_score<kThreads>(src, len, [&](uint32_t key, int, bool member) { histogram_add(s.hist[0], digit_of(key, 0), member); });
  __syncthreads();

  bool in_shared = false;  // block-uniform: candidates live in shared memory (else: filter the row)
  uint32_t prefix = 0;     // digits fixed so far
  for (int d = 0; d < kDigits; ++d) {
    const int* hist = s.hist[d & 1];
    int* next_hist = s.hist[(d + 1) & 1];
    const int need = topk - s.emitted;  // >= 1: a digit that would fill the row is the last one
    select_threshold(hist, need, s);
    const int threshold = s.threshold;
    const int above = s.above;
    const int in_bin = hist[threshold];
    const int first_tie_slot = topk - need + above;
    const bool last = d == kDigits - 1 || above + in_bin == need;  // the rest of the bin is all ties
    if (d == 0) in_shared = in_bin <= capacity;  // never truncate: too many candidates -> filter the row
    const uint2* source = candidate_buffers + ((d + 1) & 1) * capacity;  // written by digit d-1
    uint2* sink = candidate_buffers + (d & 1) * capacity;
    const int source_count = s.candidates[(d + 1) & 1];
    for (int i = threadIdx.x; i < kRadix; i += kThreads) next_hist[i] = 0;
    if (threadIdx.x == 0) {
      s.candidates[d & 1] = 0;
      s.ties = 0;
    }
    __syncthreads();

    auto classify = [&](uint32_t key, int pos, bool member) {
      const int digit = digit_of(key, d);
      const bool take = member && digit > threshold;
      const bool tie = member && digit == threshold;
      const int slot = warp_reserve(take, &s.emitted);
      if (take) out_row[slot] = src.id(pos);
      if (last) {
        const int ticket = warp_reserve(tie, &s.ties);
        if (tie && ticket < need - above) out_row[first_tie_slot + ticket] = src.id(pos);
      } else {
        histogram_add(next_hist, digit_of(key, d + 1), tie);
        if (in_shared) {
          const int at = warp_reserve(tie, &s.candidates[d & 1]);
          if (tie) sink[at] = make_uint2(key, static_cast<uint32_t>(pos));
        }
      }
    };
    if (d == 0) {
      for_each_score<kThreads>(src, len, classify);
    } else if (in_shared) {
      for_each_candidate<kThreads>(source, source_count, classify);
    } else {
      for_each_score<kThreads>(src, len, [&](uint32_t key, int pos, bool member) { classify(key, pos, member && has_prefix(key, d, prefix)); });
    }
    __syncthreads();
    if (last) break;
    prefix = (prefix << kDigitBits) | static_cast<uint32_t>(threshold);
  }
}

}  // namespace dsa_topk
