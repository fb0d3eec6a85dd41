// Host-side interface of the long-row top-k (plain C++; no CUDA kernels, no torch).
//
// Shared by topk_long.cu (the launcher) and topk_long_capi.cpp (the C ABI that indexer/topk_long.py
// calls through ctypes); nvcc links both into one shared library (common/cuda_build.py).
#pragma once

#include <cstdint>

#ifndef DSA_TOPK_HOST_EMULATION
#include <cuda_runtime_api.h>
#endif

namespace dsa_topk {

// Level-1 bins: the top 12 bits of a score's order key (sign, exponent, 3 mantissa bits), so a
// bin is a fixed relative range of scores whatever their scale or sign.
constexpr int kLongBinBits = 12;
constexpr int kLongBins = 1 << kLongBinBits;
// Scores per block of the multi-block passes (histogram, select): 512 threads x 2 float4.
constexpr int kLongChunk = 4096;
constexpr int kLongChunkThreads = 512;
// Threads of the final per-row block.
constexpr int kLongFinalThreads = 1024;
// Default candidates per row (entries of 8 bytes) the select kernel keeps in global memory for
// the final block; a threshold bin with more keys is refined from the score row instead.
constexpr int kLongCandidates = 16384;
// Keys of the level-2 threshold bin the final block collects in shared memory.
constexpr int kLongSharedCandidates = 2048;
// Per-row scratch (int32): the level-1 histogram, the level-2 histogram (bits 19..8 of the keys
// in the level-1 threshold bin), the output counter, the candidate counter, padding to 16 bytes.
constexpr int kLongHist1 = 0;
constexpr int kLongHist2 = kLongBins;
constexpr int kLongOutCount = 2 * kLongBins;
constexpr int kLongCandidateCount = kLongOutCount + 1;
constexpr int kLongScratchInts = 2 * kLongBins + 4;

struct LongTopkArgs {
  const float* scores;         // [batch, score_stride] fp32 scores, position-major per row
  int64_t score_stride;        // elements between rows; a multiple of 4 (16-byte aligned rows)
  const int32_t* seq_lens;     // [batch]
  const int32_t* block_table;  // [batch, bt_stride] page ids
  int64_t bt_stride;
  int32_t* out;                // [batch, out_stride] physical ids, written: topk per row
  int64_t out_stride;
  int32_t* scratch;            // [batch, kLongScratchInts]: all zero before a call, left all zero after it
  uint32_t* candidates;        // [batch, 2 * candidate_capacity] (key, position) pairs
  int batch;
  int max_len;                 // max_num_pages * kPageSize: the longest row possible
  int topk;                    // ids per row (1..kTopK)
  int candidate_capacity;      // candidates per row in `candidates` (>= 0)
  int shared_candidates;       // level-2 keys the final block may collect in shared memory (0..kLongSharedCandidates)
  int dependent_launch;        // 1: the first kernel is a programmatic dependent of the stream's previous
                               // kernel (the score kernel); the later ones always are of the one before
};

#ifndef DSA_TOPK_HOST_EMULATION
// Launches the three kernels on `stream`. Returns the CUDA error of a launch (cudaSuccess when fine).
cudaError_t launch_long_topk(const LongTopkArgs& args, cudaStream_t stream);
#endif

}  // namespace dsa_topk
