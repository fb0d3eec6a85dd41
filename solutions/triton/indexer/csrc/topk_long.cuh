// Long-row top-k of the lightning indexer: one row's selection split across many blocks.
//
// topk_filtered.cuh gives each row one block; past its register cache (8192 scores) that block
// runs a radix select that re-reads the row from global memory digit by digit, and a 128K-token
// row then takes over 100 µs in one SM. Here the selection of a row of L > topk scores is three
// launches, chained as programmatic dependent launches:
//
//   1. histogram (grid chunks x rows, kLongChunk scores per block): a shared histogram of the top
//      kLongBinBits bits of each score's 32-bit order key, added to the row's global level-1
//      histogram (one atomic per non-empty bin and block).
//   2. select (the same grid): every block finds the row's level-1 threshold bin t1 from the
//      global histogram (the same answer in every block), then classifies its chunk: keys above
//      t1 are written as physical ids at slots taken from the row's output counter (one atomic
//      per block, offsets from a block scan); keys in t1 are appended to the row's candidate
//      buffer when t1 holds at most `candidate_capacity` keys, and always counted in the row's
//      level-2 histogram of their next 12 bits (bits 19..8).
//   3. final (one block per row): rows of L <= topk are passed through. Otherwise the block finds
//      the level-2 threshold bin tA from the level-2 histogram, walks the candidates (the buffer,
//      or the row filtered by t1 when t1 was too large for it), writes keys above tA, collects the
//      keys in tA (in shared memory when they fit) with a histogram of their last 8 bits, and
//      finishes with that last digit: keys above its threshold are written, keys equal to it
//      (identical fp32 scores) fill the remaining slots in any order. Then it zeroes the row's
//      scratch for the next call.
//
// Exact: every choice is made on the full 32-bit key (ties only among equal fp32 scores), and
// no candidate set is ever truncated: a level-1 bin larger than the buffer (a near-constant row)
// is refined from the score row itself. With DSA_TOPK_HOST_EMULATION the file compiles as host
// C++ for tests/solutions/topk_long_emulator.cpp.
#pragma once

#include "topk_filtered.cuh"
#include "topk_long.h"

namespace dsa_topk {

constexpr int kLevel1Shift = kKeyBits - kLongBinBits;  // bits 31..20
constexpr int kLevel2Bits = 12;                         // bits 19..8
constexpr int kLevel2Shift = kLevel1Shift - kLevel2Bits;
constexpr int kLevel3Bits = kLevel2Shift;               // bits 7..0
constexpr int kLevel2Bins = 1 << kLevel2Bits;
constexpr int kLevel3Bins = 1 << kLevel3Bits;
constexpr int kLongChunkVectors = kLongChunk / (kLongChunkThreads * kScoresPerVector);
static_assert(kLongChunkVectors * kLongChunkThreads * kScoresPerVector == kLongChunk, "a chunk is whole float4 per thread");
static_assert(kLevel2Bins == kLongBins, "the scratch holds two histograms of kLongBins");
static_assert(kLongChunkVectors * kScoresPerVector <= 32, "a thread's slot classes fit one 32-bit mask");
static_assert(kLongChunk < (1 << 15), "per-block counts travel packed in 16 bits");

__device__ __forceinline__ int level1_bin(uint32_t key) { return static_cast<int>(key >> kLevel1Shift); }
__device__ __forceinline__ int level2_bin(uint32_t key) { return static_cast<int>((key >> kLevel2Shift) & (kLevel2Bins - 1)); }
__device__ __forceinline__ int level3_bin(uint32_t key) { return static_cast<int>(key & (kLevel3Bins - 1)); }

// Programmatic dependent launch: lets the next kernel of the stream launch now (it waits for
// this grid's completion itself before it reads what this grid writes).
__device__ __forceinline__ void launch_dependents() {
#if !defined(DSA_TOPK_HOST_EMULATION) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

struct Threshold {
  int bin;     // t: count(bins > t) < need <= count(bins >= t)
  int above;   // count(bins > t)
  int in_bin;  // count(t)
};

// Finds the threshold bin of kBins counts in `hist` (shared or global memory) for `need`
// (1 <= need <= the total). Thread i owns bins [kBins - (i + 1) * per, kBins - i * per), so an
// inclusive prefix sum over threads counts from the top bin down; the one thread whose run
// holds t walks it. Block-wide; the histogram must be complete (a barrier or a grid dependency
// before); barriers at its end, so `warp_totals` and `result` (block-shared) may be reused after.
template <int kThreads, int kBins>
__device__ __forceinline__ Threshold find_threshold(const int* hist, int need, int* warp_totals, Threshold* result) {
  constexpr int kPer = kBins >= kThreads ? kBins / kThreads : 1;
  constexpr int kOwners = kBins / kPer;
  static_assert(kBins % kPer == 0 && kOwners <= kThreads, "threads own whole, equal runs of bins");
  const int tid = threadIdx.x;
  const int lane = tid % kWarpSize;
  const int warp = tid / kWarpSize;
  const bool owner = tid < kOwners;
  const int first = kBins - (tid + 1) * kPer;
  int counts[kPer];
  int mine = 0;
#pragma unroll
  for (int b = 0; b < kPer; ++b) {
    counts[b] = owner ? hist[first + b] : 0;  // independent loads
    mine += counts[b];
  }
  const int inclusive = block_inclusive_sum<kThreads>(mine, lane, warp, warp_totals);
  const int above_run = inclusive - mine;
  if (owner && above_run < need && inclusive >= need) {  // exactly one thread
    int running = above_run;
    int at = 0, above_at = 0, in_at = 0;
#pragma unroll
    for (int b = kPer - 1; b >= 0; --b) {  // branch-free walk from the run's highest bin down
      const int next = running + counts[b];
      const bool here = running < need && next >= need;
      at = here ? b : at;
      above_at = here ? running : above_at;
      in_at = here ? counts[b] : in_at;
      running = next;
    }
    *result = Threshold{first + at, above_at, in_at};
  }
  __syncthreads();
  const Threshold r = *result;
  __syncthreads();
  return r;
}

// One chunk of a score row as order keys in registers: thread t holds float4 vectors t and
// t + kLongChunkThreads of the chunk. Slots at or past `len` are not members.
struct ChunkKeys {
  static constexpr int kSlots = kLongChunkVectors * kScoresPerVector;
  uint32_t keys[kSlots];

  __device__ __forceinline__ static int position(int start, int i) {
    return start + ((i / kScoresPerVector) * kLongChunkThreads + static_cast<int>(threadIdx.x)) * kScoresPerVector + i % kScoresPerVector;
  }
  __device__ __forceinline__ void load(const float* __restrict__ row, int start, int len) {
    float4 x[kLongChunkVectors];
#pragma unroll
    for (int c = 0; c < kLongChunkVectors; ++c) {
      const int p = position(start, c * kScoresPerVector);
      // Rows are 16-byte aligned and padded to whole pages, so a vector starting below len is in bounds.
      x[c] = p < len ? __ldg(reinterpret_cast<const float4*>(row + p)) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
#pragma unroll
    for (int c = 0; c < kLongChunkVectors; ++c) {
      keys[c * 4 + 0] = order_key(x[c].x);
      keys[c * 4 + 1] = order_key(x[c].y);
      keys[c * 4 + 2] = order_key(x[c].z);
      keys[c * 4 + 3] = order_key(x[c].w);
    }
  }
};

// Which chunk and row a multi-block pass works on; false (block-uniform) when there is nothing to do.
__device__ __forceinline__ bool chunk_of(const LongTopkArgs& a, int* row, int* start, int* len) {
  *row = blockIdx.y;
  *start = blockIdx.x * kLongChunk;
  int n = a.seq_lens[*row];
  if (n <= a.topk) return false;      // passed through by the final kernel
  if (n > a.max_len) n = a.max_len;   // a contract breach: the final kernel traps on it
  *len = n;
  return *start < n;
}

struct LongHistogramShared {
  alignas(16) int hist[kLongBins];
};

// Pass 1: the level-1 histogram of every row longer than topk.
template <int kThreads>
__global__ void __launch_bounds__(kThreads) long_histogram_kernel(LongTopkArgs a) {
  static_assert(kThreads == kLongChunkThreads, "ChunkKeys assumes kLongChunkThreads");
  launch_dependents();
  int row = 0, start = 0, len = 0;
  if (!chunk_of(a, &row, &start, &len)) return;
  __shared__ LongHistogramShared h;
  int* hist = h.hist;
  zero_bins<kThreads, kLongBins>(hist);
  wait_for_preceding_grid();  // the scores are the previous kernel's
  ChunkKeys chunk;
  chunk.load(a.scores + row * a.score_stride, start, len);
  __syncthreads();
#pragma unroll
  for (int i = 0; i < ChunkKeys::kSlots; ++i) histogram_add(hist, level1_bin(chunk.keys[i]), ChunkKeys::position(start, i) < len);
  __syncthreads();
  int* global_hist = a.scratch + row * static_cast<int64_t>(kLongScratchInts) + kLongHist1;
  for (int b = threadIdx.x; b < kLongBins; b += kThreads) {
    const int c = hist[b];
    if (c != 0) atomicAdd(global_hist + b, c);
  }
}

struct LongSelectShared {
  alignas(16) int hist[kLevel2Bins];  // level-2 histogram of this chunk's keys in the threshold bin
  int warp_totals[kMaxWarps];
  Threshold threshold;
  int out_base;
  int candidate_base;
};

// Pass 2: keys above the level-1 threshold bin are written, keys in it become candidates.
template <int kThreads>
__global__ void __launch_bounds__(kThreads) long_select_kernel(LongTopkArgs a) {
  launch_dependents();
  int row = 0, start = 0, len = 0;
  if (!chunk_of(a, &row, &start, &len)) return;
  __shared__ LongSelectShared s;
  zero_bins<kThreads, kLevel2Bins>(s.hist);
  const int tid = threadIdx.x;
  const int lane = tid % kWarpSize;
  const int warp = tid / kWarpSize;
  wait_for_preceding_grid();  // the level-1 histogram is complete (and the scores, one grid earlier)
  ChunkKeys chunk;
  chunk.load(a.scores + row * a.score_stride, start, len);  // in flight during the threshold scan
  int* scratch = a.scratch + row * static_cast<int64_t>(kLongScratchInts);
  const Threshold t1 = find_threshold<kThreads, kLongBins>(scratch + kLongHist1, a.topk, s.warp_totals, &s.threshold);
  const bool collect = t1.in_bin <= a.candidate_capacity;  // the same answer in every block of the row

  uint32_t above_mask = 0u, tie_mask = 0u;
#pragma unroll
  for (int i = 0; i < ChunkKeys::kSlots; ++i) {
    const bool member = ChunkKeys::position(start, i) < len;
    const int bin = level1_bin(chunk.keys[i]);
    if (member && bin > t1.bin) above_mask |= 1u << i;
    if (member && bin == t1.bin) tie_mask |= 1u << i;
  }
  // Both counts packed in one int (a chunk's counts fit 16 bits): one block scan gives every
  // thread its offsets, the last thread takes the block's runs from the row's counters.
  const int packed = __popc(above_mask) | (__popc(tie_mask) << 16);
  const int inclusive = block_inclusive_sum<kThreads>(packed, lane, warp, s.warp_totals);
  if (tid == kThreads - 1) {
    s.out_base = (inclusive & 0xffff) != 0 ? atomicAdd(scratch + kLongOutCount, inclusive & 0xffff) : 0;
    s.candidate_base = collect && (inclusive >> 16) != 0 ? atomicAdd(scratch + kLongCandidateCount, inclusive >> 16) : 0;
  }
  __syncthreads();
  const int exclusive = inclusive - packed;
  const int32_t* table_row = a.block_table + row * a.bt_stride;
  int32_t* out_row = a.out + row * a.out_stride;
  int out_at = s.out_base + (exclusive & 0xffff);
#pragma unroll
  for (int i = 0; i < ChunkKeys::kSlots; ++i) {
    if (above_mask & (1u << i)) out_row[out_at++] = physical_id(table_row, ChunkKeys::position(start, i));
  }
  if (collect && tie_mask != 0u) {
    uint2* candidates = reinterpret_cast<uint2*>(a.candidates) + row * static_cast<int64_t>(a.candidate_capacity);
    int at = s.candidate_base + (exclusive >> 16);
#pragma unroll
    for (int i = 0; i < ChunkKeys::kSlots; ++i) {
      if (tie_mask & (1u << i)) candidates[at++] = make_uint2(chunk.keys[i], static_cast<uint32_t>(ChunkKeys::position(start, i)));
    }
  }
  // The level-2 histogram of the chunk's threshold-bin keys, added to the row's.
#pragma unroll
  for (int i = 0; i < ChunkKeys::kSlots; ++i) histogram_add(s.hist, level2_bin(chunk.keys[i]), (tie_mask >> i) & 1u);
  __syncthreads();
  for (int b = tid; b < kLevel2Bins; b += kThreads) {
    const int c = s.hist[b];
    if (c != 0) atomicAdd(scratch + kLongHist2 + b, c);
  }
}

struct LongFinalShared {
  int hist[kLevel3Bins];  // level-3 histogram (the keys' last 8 bits) of the level-2 threshold bin
  int warp_totals[kMaxWarps];
  Threshold threshold;
  int emitted;            // output slots taken
  int collected;          // entries of `keys`
  int ties;               // tickets of keys equal to the last threshold
  uint2 keys[kLongSharedCandidates];  // the level-2 threshold bin's (key, position) pairs
};

// Pass 3: one block per row finishes the selection (see the top of this file).
template <int kThreads>
__global__ void __launch_bounds__(kThreads, 1) long_final_kernel(LongTopkArgs a) {
  __shared__ LongFinalShared f;
  const int row = blockIdx.x;
  const int tid = threadIdx.x;
  const int len = a.seq_lens[row];
  const int topk = a.topk;
  const int32_t* table_row = a.block_table + row * a.bt_stride;
  int32_t* __restrict__ out_row = a.out + row * a.out_stride;
  if (len <= topk) {  // passthrough: every token is selected, no scores needed
    for (int i = tid; i < topk; i += kThreads) out_row[i] = i < len ? __ldg(table_row + i / kPageSize) * kPageSize + i % kPageSize : -1;
    return;
  }
  if (len > a.max_len) __trap();  // seq_len beyond max_num_pages * 64 breaks the contract: fail loudly
  wait_for_preceding_grid();       // both histograms, the counters and the candidates are complete
  int* scratch = a.scratch + row * static_cast<int64_t>(kLongScratchInts);
  const float* __restrict__ scores = a.scores + row * a.score_stride;
  const uint2* candidates = reinterpret_cast<const uint2*>(a.candidates) + row * static_cast<int64_t>(a.candidate_capacity);

  const Threshold t1 = find_threshold<kThreads, kLongBins>(scratch + kLongHist1, topk, f.warp_totals, &f.threshold);
  const bool from_buffer = t1.in_bin <= a.candidate_capacity;  // as the select kernel decided
  const int need = topk - t1.above;  // slots left for the level-1 threshold bin's keys, >= 1
  const Threshold t2 = find_threshold<kThreads, kLevel2Bins>(scratch + kLongHist2, need, f.warp_totals, &f.threshold);
  // The candidates: the buffer, or the row's keys in the level-1 threshold bin.
  auto visit_candidates = [&](auto&& visit) {
    if (from_buffer) {
      for_each_candidate<kThreads>(candidates, t1.in_bin, visit);
    } else {
      for_each_score<kThreads>(scores, len, [&](uint32_t key, int pos, bool member) { visit(key, pos, member && level1_bin(key) == t1.bin); });
    }
  };
  const bool keep = t2.in_bin <= a.shared_candidates;  // block-uniform
  for (int i = tid; i < kLevel3Bins; i += kThreads) f.hist[i] = 0;
  if (tid == 0) {
    f.emitted = t1.above;  // the select kernel wrote slots [0, t1.above)
    f.collected = 0;
    f.ties = 0;
  }
  __syncthreads();
  visit_candidates([&](uint32_t key, int pos, bool member) {
    const int bin = level2_bin(key);
    const bool take = member && bin > t2.bin;
    const bool tie = member && bin == t2.bin;
    const int slot = warp_reserve(take, &f.emitted);
    if (take) out_row[slot] = physical_id(table_row, pos);
    histogram_add(f.hist, level3_bin(key), tie);
    if (keep) {
      const int at = warp_reserve(tie, &f.collected);
      if (tie) f.keys[at] = make_uint2(key, static_cast<uint32_t>(pos));
    }
  });
  __syncthreads();
  const int need3 = need - t2.above;  // >= 1
  const Threshold t3 = find_threshold<kThreads, kLevel3Bins>(f.hist, need3, f.warp_totals, &f.threshold);
  const int tie_slots = need3 - t3.above;  // keys equal to the full threshold key that are kept
  const int first_tie_slot = topk - tie_slots;
  auto finish = [&](uint32_t key, int pos, bool member) {
    const int bin = level3_bin(key);
    const bool take = member && bin > t3.bin;
    const bool tie = member && bin == t3.bin;
    const int slot = warp_reserve(take, &f.emitted);
    if (take) out_row[slot] = physical_id(table_row, pos);
    const int ticket = warp_reserve(tie, &f.ties);
    if (tie && ticket < tie_slots) out_row[first_tie_slot + ticket] = physical_id(table_row, pos);
  };
  if (keep) {
    for_each_candidate<kThreads>(f.keys, t2.in_bin, finish);
  } else {
    visit_candidates([&](uint32_t key, int pos, bool member) { finish(key, pos, member && level2_bin(key) == t2.bin); });
  }
  // Leave the row's scratch zeroed for the next call (every block of the earlier passes has ended).
  __syncthreads();
  int4* zero = reinterpret_cast<int4*>(scratch);
  for (int i = tid; i < kLongScratchInts / 4; i += kThreads) zero[i] = make_int4(0, 0, 0, 0);
}

}  // namespace dsa_topk
