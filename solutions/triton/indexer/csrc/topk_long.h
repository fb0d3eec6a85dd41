// Host-side interface of the long-row top-k (plain C++; no CUDA kernels, no torch).
//
// Shared by topk_long.cu (the launcher) and topk_long_capi.cpp (the C ABI that indexer/cuda_topk_long.py
// calls through ctypes); nvcc links both into one shared library (common/cuda_build.py).
#pragma once

#include <cstdint>

#ifndef DSA_TOPK_HOST_EMULATION
#include <cuda_runtime_api.h>
#endif

namespace dsa_topk {

// A row's selection runs in three levels over its 32-bit order keys: bits 31..20 (sign, exponent,
// 3 mantissa bits: a fixed relative range of scores whatever their scale or sign), bits 19..8,
// bits 7..0. Each level is a multi-block pass (topk_long.cuh).
constexpr int kLongLevels = 3;
constexpr int kLongBins = 4096;       // bins of levels 1 and 2
constexpr int kLongLastBins = 256;    // bins of level 3
// Entries per block of every pass: 512 threads x 8.
constexpr int kLongChunk = 4096;
constexpr int kLongThreads = 512;
// Grid width per row: at most about kLongWaves waves of kLongBlocksPerSm blocks per SM in all
// (the passes' blocks use about 60 registers per thread: two blocks of 512 threads per SM).
constexpr int kLongWaves = 2;
constexpr int kLongBlocksPerSm = 2;
// Per-row scratch (int32): the three levels' histograms, then the row's state: the output
// counter, the fill counters of the two candidate buffers, the tie tickets, each pass's finished
// blocks, and each level's threshold (bin, keys above it, keys in it); padded to 16 bytes.
constexpr int kLongHist1 = 0;
constexpr int kLongHist2 = kLongBins;
constexpr int kLongHist3 = 2 * kLongBins;
constexpr int kLongState = 2 * kLongBins + kLongLastBins;
constexpr int kLongOutCount = kLongState + 0;
constexpr int kLongFill1 = kLongState + 1;  // entries of level 2's buffer (level 1's threshold bin)
constexpr int kLongFill2 = kLongState + 2;  // entries of level 3's buffer
constexpr int kLongTickets = kLongState + 3;
constexpr int kLongDone = kLongState + 4;        // finished blocks of the histogram pass and the three levels (4 counters)
constexpr int kLongThreshold1 = kLongState + 8;  // level 1's threshold: bin, keys above it, keys in it
constexpr int kLongThreshold2 = kLongState + 11;
constexpr int kLongThreshold3 = kLongState + 14;
constexpr int kLongScratchInts = kLongState + 20;
static_assert(kLongScratchInts % 4 == 0, "scratch rows stay 16-byte aligned");

struct LongTopkArgs {
  const float* scores;         // [batch, score_stride] fp32 scores, position-major per row
  int64_t score_stride;        // elements between rows; a multiple of 4 (16-byte aligned rows)
  const int32_t* seq_lens;     // [batch]
  const int32_t* block_table;  // [batch, bt_stride] page ids
  int64_t bt_stride;
  int32_t* out;                // [batch, out_stride] physical ids, written: topk per row
  int64_t out_stride;
  int32_t* scratch;            // [batch, kLongScratchInts]: all zero before a call, left all zero after it (unused by the cluster kernel)
  uint32_t* candidates;        // [batch, 2, max_len] (key, position) pairs: levels 2 and 3's entries (likewise)
  int batch;
  int max_len;                 // max_num_pages * kPageSize: the longest row possible
  int topk;                    // ids per row (1..kTopK)
  int dependent_launch;        // 1: the first kernel is a programmatic dependent of the stream's previous
                               // kernel (the score kernel); the later ones always are of the one before
};

// The cluster top-k (topk_cluster.cuh): one cluster of 2..16 blocks per row, the row cached in
// the blocks' registers (kClusterSlots scores per thread), so rows of up to kClusterMaxLen tokens.
// It takes LongTopkArgs without scratch or candidates (max_len at most kClusterMaxLen).
constexpr int kClusterThreads = 1024;
constexpr int kClusterSlots = 8;
constexpr int kClusterChunk = kClusterThreads * kClusterSlots;  // scores per block: 8192
constexpr int kClusterMinBlocks = 2;
constexpr int kClusterMaxBlocks = 16;  // the largest cluster Hopper runs (past 8 it is a non-portable size)
constexpr int kClusterMaxLen = kClusterChunk * kClusterMaxBlocks;  // 131072

#ifndef DSA_TOPK_HOST_EMULATION
// Launches the four kernels on `stream`. Returns the CUDA error of a launch (cudaSuccess when fine).
cudaError_t launch_long_topk(const LongTopkArgs& args, cudaStream_t stream);
// Launches the cluster kernel on `stream` (cudaErrorInvalidValue when max_len > kClusterMaxLen).
cudaError_t launch_cluster_topk(const LongTopkArgs& args, cudaStream_t stream);
// How many clusters of the kernel for rows of up to max_len tokens the current device runs at once
// (0: none, e.g. a 16-block cluster on a device whose GPCs hold fewer free SMs).
cudaError_t cluster_topk_capacity(int max_len, int* clusters);
#endif

}  // namespace dsa_topk
