// Long-row top-k of the lightning indexer: each row's selection split across many blocks.
//
// topk_filtered.cuh gives each row one block; past its register cache (8192 scores) that block
// runs a radix select that re-reads the row from global memory digit by digit, and a 128K-token
// row then keeps one SM busy long after the others are done. Here a row of L > topk scores is selected in three levels
// of its 32-bit order keys (bits 31..20, 19..8, 7..0), four launches chained as programmatic
// dependent launches, every one a grid of (chunks of kLongChunk entries) x rows:
//
//   histogram  level 1's histogram: a shared histogram per block of the score row, added to the
//              row's global one (one atomic per non-empty bin and block); the row's last block to
//              finish (a counter between fences) finds the threshold bin t1 once and records it.
//              Block 0 of a row of L <= topk writes that row (positions 0..L-1 as ids, then -1).
//   level 1    every block classifies its chunks of scores against t1: keys above it are written
//              as physical ids at slots taken from the row's output counter (one atomic per
//              chunk, offsets from a block scan); keys in t1 are appended to the row's level-2
//              buffer (one atomic per chunk) and counted in level 2's histogram. The row's last
//              block then finishes the row itself when t1 held at most kLongChunk keys (the
//              usual case): levels 2 and 3 on those keys in registers, ties by block order.
//              Otherwise it records t2 for the next pass.
//   level 2    the same on the level-2 buffer (blocks past its fill return), with level 2's bins.
//   level 3    the same on the level-3 buffer with the last 8 bits: keys above t3 are written; keys
//              equal to t3 are equal fp32 scores, and the first tickets of a row-wide counter fill
//              the remaining slots.
// The block that finishes a row zeroes its scratch, so a later pass reads a zero count and
// returns, and the next call starts from zero. Large calls give each row fewer blocks, each
// looping over several chunks (topk_long.cu).
//
// Exact: every choice is made on the full 32-bit key (ties only among equal fp32 scores), and no
// candidate set is ever truncated: each buffer can hold a whole row, so a near-constant row (all
// its keys in one bin) costs three more passes over buffers as long as the row, all multi-block.
// With DSA_TOPK_HOST_EMULATION the file compiles as host C++ for tests/solutions/topk_long_emulator.cpp.
#pragma once

#include "topk_filtered.cuh"
#include "topk_long.h"

namespace dsa_topk {

constexpr int kLongSlots = kLongChunk / kLongThreads;  // entries per thread and pass
static_assert(kLongSlots * kLongThreads == kLongChunk && kLongSlots % kScoresPerVector == 0, "whole float4 per thread");
static_assert(kLongSlots <= 16, "a thread's slot classes fit 16-bit counts and 32-bit masks");
static_assert(kLongChunk < (1 << 15), "per-block counts travel packed in 16 bits");
static_assert(kLongThreads >= kLongLastBins, "the scans give each bin an owner");

// The bin of `key` at `level` (0: bits 31..20, 1: bits 19..8, 2: bits 7..0).
template <int kLevel>
__device__ __forceinline__ int level_bin(uint32_t key) {
  if (kLevel == 0) return static_cast<int>(key >> 20);
  if (kLevel == 1) return static_cast<int>((key >> 8) & (kLongBins - 1));
  return static_cast<int>(key & (kLongLastBins - 1));
}

template <int kLevel>
__device__ __forceinline__ int level_hist() {
  return kLevel == 0 ? kLongHist1 : kLevel == 1 ? kLongHist2 : kLongHist3;
}

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

// Finds the threshold bin of the kBins counts of a histogram (in global memory when kGlobal, else
// shared) for `need` (1 <= need <= the total). Thread i owns bins [kBins - (i + 1) * per, kBins - i * per), so an inclusive prefix sum
// over threads counts from the top bin down; the one thread whose run holds t walks it.
// Block-wide; barriers at its end, so `warp_totals` and `result` (block-shared) may be reused after.
template <int kThreads, int kBins, bool kGlobal>
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
    counts[b] = owner ? (kGlobal ? load_l2(hist + first + b) : hist[first + b]) : 0;  // independent loads
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

// A block's entries of one pass: thread t holds entries t, t + kLongThreads, ... of its chunk
// of the level-1 score row (float4 vectors: thread t holds vectors t and t + kLongThreads) or of
// a candidate buffer. Bit i of `members` says whether slot i holds an entry.
struct ChunkEntries {
  uint32_t keys[kLongSlots];
  int positions[kLongSlots];
  uint32_t members = 0u;

  // Not load_score_keys: this form is the one measured on the H100 (its PTX differs from the shared helper's).
  __device__ __forceinline__ void load_scores(const float* __restrict__ row, int start, int len) {
    constexpr int kVectors = kLongSlots / kScoresPerVector;
    float4 x[kVectors];
#pragma unroll
    for (int c = 0; c < kVectors; ++c) {
      const int p = start + (c * kLongThreads + static_cast<int>(threadIdx.x)) * kScoresPerVector;
      // Rows are 16-byte aligned and padded to whole pages, so a vector starting below len is in bounds.
      x[c] = p < len ? __ldg(reinterpret_cast<const float4*>(row + p)) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
#pragma unroll
    for (int c = 0; c < kVectors; ++c) {
      const float values[kScoresPerVector] = {x[c].x, x[c].y, x[c].z, x[c].w};
#pragma unroll
      for (int e = 0; e < kScoresPerVector; ++e) {
        const int i = c * kScoresPerVector + e;
        positions[i] = start + (c * kLongThreads + static_cast<int>(threadIdx.x)) * kScoresPerVector + e;
        keys[i] = order_key(values[e]);
        if (positions[i] < len) members |= 1u << i;
      }
    }
  }

  __device__ __forceinline__ void load_candidates(const uint2* buffer, int start, int count) {
    uint2 x[kLongSlots];
#pragma unroll
    for (int i = 0; i < kLongSlots; ++i) {
      const int at = start + i * kLongThreads + static_cast<int>(threadIdx.x);
      x[i] = at < count ? load_l2(buffer + at) : make_uint2(0u, 0u);
      if (at < count) members |= 1u << i;
    }
#pragma unroll
    for (int i = 0; i < kLongSlots; ++i) {
      keys[i] = x[i].x;
      positions[i] = static_cast<int>(x[i].y);
    }
  }

  // Bit masks of the member slots whose level-kLevel bin is above the threshold bin, and in it.
  template <int kLevel>
  __device__ __forceinline__ void classify(int threshold_bin, uint32_t& above, uint32_t& tie) const {
    above = 0u;
    tie = 0u;
#pragma unroll
    for (int i = 0; i < kLongSlots; ++i) {
      const bool member = (members >> i) & 1u;
      const int bin = level_bin<kLevel>(keys[i]);
      if (member && bin > threshold_bin) above |= 1u << i;
      if (member && bin == threshold_bin) tie |= 1u << i;
    }
  }
};

// The row of a block of any pass: -1 when the row needs no selection (L <= topk).
__device__ __forceinline__ int selected_len(const LongTopkArgs& a, int row) {
  const int len = a.seq_lens[row];
  if (len <= a.topk) return -1;
  return len < a.max_len ? len : a.max_len;  // a longer seq_len breaks the contract: the histogram pass traps
}

// Blocks of a pass that work on a row of `count` entries: one per chunk, at most the grid's width.
__device__ __forceinline__ int blocks_of_row(int count) {
  const int chunks = (count + kLongChunk - 1) / kLongChunk;
  return chunks < static_cast<int>(gridDim.x) ? chunks : static_cast<int>(gridDim.x);
}

__device__ __forceinline__ int* scratch_of(const LongTopkArgs& a, int row) { return a.scratch + row * static_cast<int64_t>(kLongScratchInts); }

__device__ __forceinline__ uint2* buffer_of(const LongTopkArgs& a, int row, int which) {
  return reinterpret_cast<uint2*>(a.candidates) + (static_cast<int64_t>(row) * 2 + which) * a.max_len;
}

__device__ __forceinline__ Threshold read_threshold(const int* record) {
  return Threshold{load_l2(record), load_l2(record + 1), load_l2(record + 2)};
}

__device__ __forceinline__ void write_threshold(int* record, const Threshold& t) {
  record[0] = t.bin;
  record[1] = t.above;
  record[2] = t.in_bin;
}

// Block-wide: whether this block is the last of the row's `blocks` blocks to get here (`done`
// counts them). Everything the others wrote before is visible to the last one (a fence on each
// side of the counter); its loads of that data go through L2 (load_l2).
__device__ __forceinline__ bool last_block_of_row(int* done, int blocks, int* flag) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    *flag = atomicAdd(done, 1) == blocks - 1;
  }
  __syncthreads();
  const bool last = *flag != 0;
  if (last) __threadfence();
  return last;
}

// Leaves a row's scratch zeroed for the next call (block-wide; every other block of every pass
// has read what it needed by then). Later passes then find no entries (a zero count) and return.
template <int kThreads>
__device__ __forceinline__ void zero_scratch(int* scratch) {
  int4* zero = reinterpret_cast<int4*>(scratch);
  for (int i = threadIdx.x; i < kLongScratchInts / 4; i += kThreads) zero[i] = make_int4(0, 0, 0, 0);
}

struct LongShared {
  alignas(16) int hist[kLongBins];  // a block's histogram (of its chunk, or of the next level's keys)
  int warp_totals[kMaxWarps];
  Threshold threshold;
  int out_base;
  int tie_base;
  int flag;
};

// Writes the positions of `mask`'s slots as ids at slots taken from the row's output counter
// (one atomic per block; offsets from a block scan). Block-wide.
template <int kThreads>
__device__ __forceinline__ void emit_block(uint32_t mask, const ChunkEntries& e, int* out_count, const int32_t* table_row,
                                           int32_t* out_row, LongShared& s) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int mine = __popc(mask);
  const int inclusive = block_inclusive_sum<kThreads>(mine, lane, warp, s.warp_totals);
  if (threadIdx.x == kThreads - 1) s.out_base = inclusive != 0 ? atomicAdd(out_count, inclusive) : 0;
  __syncthreads();
  int at = s.out_base + inclusive - mine;
#pragma unroll
  for (int i = 0; i < kLongSlots; ++i) {
    if (mask & (1u << i)) out_row[at++] = physical_id(table_row, e.positions[i]);
  }
  __syncthreads();  // s.out_base and the scan's scratch may be reused after
}

// Keys equal to the full threshold key (identical scores) when one block holds all of them: the
// first `tie_slots` in block order fill the row's last slots. Block-wide.
template <int kThreads>
__device__ __forceinline__ void ticket_block(uint32_t mask, const ChunkEntries& e, int tie_slots, int topk, const int32_t* table_row,
                                             int32_t* out_row, LongShared& s) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int mine = __popc(mask);
  int ticket = block_inclusive_sum<kThreads>(mine, lane, warp, s.warp_totals) - mine;
#pragma unroll
  for (int i = 0; i < kLongSlots; ++i) {
    if (mask & (1u << i)) {
      if (ticket < tie_slots) out_row[topk - tie_slots + ticket] = physical_id(table_row, e.positions[i]);
      ++ticket;
    }
  }
  __syncthreads();
}

// Finishes a row whose remaining candidates (levels kLevel.. of the selection, `need` slots
// left) all fit one block: level kLevel's threshold from the row's complete global histogram,
// then any further level on a shared histogram of the block's own keys. Block-wide.
template <int kLevel, int kThreads>
__device__ void finish_in_block(const ChunkEntries& e, int need, int* scratch, int topk, const int32_t* table_row, int32_t* out_row,
                                LongShared& s) {
  constexpr int kBins = kLevel == kLongLevels - 1 ? kLongLastBins : kLongBins;
  const Threshold t = find_threshold<kThreads, kBins, true>(scratch + level_hist<kLevel>(), need, s.warp_totals, &s.threshold);
  uint32_t above, tie;
  e.template classify<kLevel>(t.bin, above, tie);
  emit_block<kThreads>(above, e, scratch + kLongOutCount, table_row, out_row, s);
  if (kLevel == kLongLevels - 1) {
    ticket_block<kThreads>(tie, e, need - t.above, topk, table_row, out_row, s);
    return;
  }
  // The last level on this block's keys in the threshold bin.
  for (int b = threadIdx.x; b < kLongLastBins; b += kThreads) s.hist[b] = 0;
  __syncthreads();
#pragma unroll
  for (int i = 0; i < kLongSlots; ++i) histogram_add_spread(s.hist, level_bin<kLongLevels - 1>(e.keys[i]), (tie >> i) & 1u);
  __syncthreads();
  const int need3 = need - t.above;
  const Threshold t3 = find_threshold<kThreads, kLongLastBins, false>(s.hist, need3, s.warp_totals, &s.threshold);
  uint32_t above3 = 0u, tie3 = 0u;
#pragma unroll
  for (int i = 0; i < kLongSlots; ++i) {
    const int bin = level_bin<kLongLevels - 1>(e.keys[i]);
    if (((tie >> i) & 1u) && bin > t3.bin) above3 |= 1u << i;
    if (((tie >> i) & 1u) && bin == t3.bin) tie3 |= 1u << i;
  }
  emit_block<kThreads>(above3, e, scratch + kLongOutCount, table_row, out_row, s);
  ticket_block<kThreads>(tie3, e, need3 - t3.above, topk, table_row, out_row, s);
}

// Level 1's histogram of every row longer than topk; rows of L <= topk are written here. The
// row's last block to finish finds level 1's threshold once, for every block of the next pass.
template <int kThreads>
__global__ void __launch_bounds__(kThreads) long_histogram_kernel(LongTopkArgs a) {
  static_assert(kThreads == kLongThreads, "ChunkEntries assumes kLongThreads");
  launch_dependents();
  const int row = blockIdx.y;
  const int start = blockIdx.x * kLongChunk;
  const int len = a.seq_lens[row];
  if (len <= a.topk) {  // passthrough: every token is selected, no scores needed
    if (blockIdx.x != 0) return;
    const int32_t* table_row = a.block_table + row * a.bt_stride;
    int32_t* out_row = a.out + row * a.out_stride;
    for (int i = threadIdx.x; i < a.topk; i += kThreads) out_row[i] = i < len ? __ldg(table_row + i / kPageSize) * kPageSize + i % kPageSize : -1;
    return;
  }
  if (len > a.max_len) __trap();  // seq_len beyond max_num_pages * 64 breaks the contract: fail loudly
  if (start >= len) return;
  __shared__ LongShared s;
  zero_bins<kThreads, kLongBins>(s.hist);
  wait_for_preceding_grid();  // the scores are the previous kernel's
  __syncthreads();
  // Chunks blockIdx.x, + gridDim.x, ... of the row (the launcher gives large calls fewer blocks per row).
  for (int at = start; at < len; at += gridDim.x * kLongChunk) {
    ChunkEntries chunk;
    chunk.load_scores(a.scores + row * a.score_stride, at, len);
#pragma unroll
    for (int i = 0; i < kLongSlots; ++i) histogram_add_spread(s.hist, level_bin<0>(chunk.keys[i]), (chunk.members >> i) & 1u);
  }
  __syncthreads();
  int* scratch = scratch_of(a, row);
  for (int b = threadIdx.x; b < kLongBins; b += kThreads) {
    const int c = s.hist[b];
    if (c != 0) atomicAdd(scratch + kLongHist1 + b, c);
  }
  if (!last_block_of_row(scratch + kLongDone, blocks_of_row(len), &s.flag)) return;
  const Threshold t1 = find_threshold<kThreads, kLongBins, true>(scratch + kLongHist1, a.topk, s.warp_totals, &s.threshold);
  if (threadIdx.x == 0) write_threshold(scratch + kLongThreshold1, t1);
}

// Level kLevel (0, 1, 2: the file's levels 1, 2, 3) of every row longer than topk whose
// selection is not finished yet (a finished row's zeroed state counts no entries).
template <int kLevel, int kThreads>
__global__ void __launch_bounds__(kThreads) long_level_kernel(LongTopkArgs a) {
  static_assert(kThreads == kLongThreads, "ChunkEntries assumes kLongThreads");
  constexpr bool kLast = kLevel == kLongLevels - 1;
  launch_dependents();
  const int row = blockIdx.y;
  const int start = blockIdx.x * kLongChunk;
  const int len = selected_len(a, row);
  if (len < 0 || (kLevel == 0 && start >= len)) return;
  __shared__ LongShared s;
  const int tid = threadIdx.x;
  const int lane = tid % kWarpSize;
  const int warp = tid / kWarpSize;
  if (!kLast) zero_bins<kThreads, kLongBins>(s.hist);
  wait_for_preceding_grid();  // this level's threshold, buffer and the row's state are complete
  int* scratch = scratch_of(a, row);
  // This level's threshold, entries and the slots left for them.
  const Threshold t1 = read_threshold(scratch + kLongThreshold1);
  Threshold t = t1;
  int count = len;
  int need = a.topk;
  if (kLevel >= 1) {
    t = read_threshold(scratch + kLongThreshold2);
    count = t1.in_bin;
    need -= t1.above;
  }
  if (kLevel >= 2) {
    const Threshold t2 = t;
    t = read_threshold(scratch + kLongThreshold3);
    count = t2.in_bin;
    need -= t2.above;
  }
  if (start >= count) return;  // block-uniform
  const int32_t* table_row = a.block_table + row * a.bt_stride;
  int32_t* out_row = a.out + row * a.out_stride;
  // Chunks blockIdx.x, + gridDim.x, ... of this level's entries (the launcher gives large calls
  // fewer blocks per row); the next level's histogram accumulates in shared memory across them.
  for (int at = start; at < count; at += gridDim.x * kLongChunk) {
    ChunkEntries chunk;
    if (kLevel == 0) {
      chunk.load_scores(a.scores + row * a.score_stride, at, len);
    } else {
      chunk.load_candidates(buffer_of(a, row, kLevel - 1), at, count);
    }
    uint32_t above_mask, tie_mask;
    chunk.template classify<kLevel>(t.bin, above_mask, tie_mask);
    // Both counts packed in one int: one block scan gives every thread its offsets, and the last
    // thread takes the block's runs from the row's counters.
    const int packed = __popc(above_mask) | (__popc(tie_mask) << 16);
    const int inclusive = block_inclusive_sum<kThreads>(packed, lane, warp, s.warp_totals);
    if (tid == kThreads - 1) {
      const int above = inclusive & 0xffff, ties = inclusive >> 16;
      s.out_base = above != 0 ? atomicAdd(scratch + kLongOutCount, above) : 0;
      s.tie_base = ties != 0 ? atomicAdd(scratch + (kLast ? kLongTickets : kLevel == 0 ? kLongFill1 : kLongFill2), ties) : 0;
    }
    __syncthreads();
    const int exclusive = inclusive - packed;
    int out_at = s.out_base + (exclusive & 0xffff);
#pragma unroll
    for (int i = 0; i < kLongSlots; ++i) {
      if (above_mask & (1u << i)) out_row[out_at++] = physical_id(table_row, chunk.positions[i]);
    }
    int tie_at = s.tie_base + (exclusive >> 16);
    if (kLast) {
      // Keys equal to the threshold key: identical scores, any of them will do. Tickets past the
      // slots left are dropped; the others fill the row's last slots (after every key above).
      const int tie_slots = need - t.above;
#pragma unroll
      for (int i = 0; i < kLongSlots; ++i) {
        if (tie_mask & (1u << i)) {
          if (tie_at < tie_slots) out_row[a.topk - tie_slots + tie_at] = physical_id(table_row, chunk.positions[i]);
          ++tie_at;
        }
      }
    } else {
      uint2* next = buffer_of(a, row, kLevel);
#pragma unroll
      for (int i = 0; i < kLongSlots; ++i) {
        if (tie_mask & (1u << i)) next[tie_at++] = make_uint2(chunk.keys[i], static_cast<uint32_t>(chunk.positions[i]));
      }
      // The next level's histogram of the threshold-bin keys.
#pragma unroll
      for (int i = 0; i < kLongSlots; ++i) histogram_add_spread(s.hist, level_bin<kLevel + 1>(chunk.keys[i]), (tie_mask >> i) & 1u);
    }
  }
  const int blocks = blocks_of_row(count);
  if (kLast) {
    if (last_block_of_row(scratch + kLongDone + 3, blocks, &s.flag)) zero_scratch<kThreads>(scratch);
    return;
  }
  __syncthreads();
  int* next_hist = scratch + level_hist<kLevel + 1>();
  constexpr int kNextBins = kLevel + 1 == kLongLevels - 1 ? kLongLastBins : kLongBins;
  for (int b = tid; b < kNextBins; b += kThreads) {
    const int c = s.hist[b];
    if (c != 0) atomicAdd(next_hist + b, c);
  }
  // The row's last block: finishes the row here when its next level's entries fit one block (the
  // common case: a few hundred to a few thousand keys), else finds the next level's threshold
  // once for that pass's blocks.
  if (!last_block_of_row(scratch + kLongDone + 1 + kLevel, blocks, &s.flag)) return;
  const int next_count = t.in_bin;
  const int next_need = need - t.above;
  if (next_count <= kLongChunk) {
    ChunkEntries rest;
    rest.load_candidates(buffer_of(a, row, kLevel), 0, next_count);
    finish_in_block<kLevel + 1, kThreads>(rest, next_need, scratch, a.topk, table_row, out_row, s);
    zero_scratch<kThreads>(scratch);
    return;
  }
  const Threshold t_next = find_threshold<kThreads, kNextBins, true>(next_hist, next_need, s.warp_totals, &s.threshold);
  if (tid == 0) write_threshold(scratch + (kLevel == 0 ? kLongThreshold2 : kLongThreshold3), t_next);
}

}  // namespace dsa_topk
